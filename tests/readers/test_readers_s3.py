"""Round trip through a real S3 server (moto on 127.0.0.1): copy a dump in, read it back."""
from __future__ import annotations

import os

import numpy as np
import pytest
from readers_synth import torch_dump

import msprobe.readers as readers
from msprobe.readers.index import build_index

pytestmark = pytest.mark.s3
pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")
torch = pytest.importorskip("torch")


def _upload(local_root, store, prefix):
    n = 0
    for dirpath, _, files in os.walk(local_root):
        for f in files:
            p = os.path.join(dirpath, f)
            rel = os.path.relpath(p, local_root).replace(os.sep, "/")
            with open(p, "rb") as fh:
                store.put(f"{prefix}/{rel}", fh.read())
            n += 1
    return n


def test_s3_roundtrip(tmp_path, s3_server, s3_bucket_url):
    from msprobe.backends import open_store
    from tests.conftest_s3 import s3_storage_options

    local = tmp_path / "run1"
    writers = torch_dump(str(local), dialect="msprobe-8", steps=(0,), ranks=(0, 1))
    opts = s3_storage_options(s3_server)
    bucket = open_store(s3_bucket_url, opts)
    assert _upload(local, bucket, "run1") > 0

    url = f"{s3_bucket_url}/run1"
    d = readers.open(url, storage_options=opts)
    ref = readers.open(str(local))
    assert d.engine == "msprobe" and d.steps == [0] and d.ranks == [0, 1]
    assert (d.framework, d.task, d.level, d.dialect) == ("pytorch", "tensor", "mix", "msprobe-8")
    assert [r.name for r in d.records()] == [r.name for r in ref.records()]
    df = d.to_pandas()
    pd.testing.assert_frame_equal(df, ref.to_pandas())
    n = 0
    for rec in d.records(step=0, rank=1):
        for io, t in rec.tensors():
            if t.data_name:
                local_t = ref.record(rec.name, step=0, rank=1).tensor(t.path).load(framework="torch")
                assert torch.equal(t.load(framework="torch"), local_t)
                np.testing.assert_array_equal(t.load(), writers[(0, "rank1")].tensors[t.data_name])
                n += 1
    assert n > 10
    rec = d.record("Functional.linear.0.forward", step=0, rank=0)
    assert rec.parent.name == "Module.fc.Linear.forward.0" and rec.stack
    assert rec.input_args[0].url.startswith(s3_bucket_url + "/run1/step0/rank0/dump_tensor_data/")

    # the index, inside the dump on S3 and as a separate lake on S3
    build_index(url, storage_options=opts)
    di = readers.open(url, storage_options=opts)
    assert di.engine == "index" and all(s.use_index for s in di.sources)
    pd.testing.assert_frame_equal(di.to_pandas(), df)
    lake = f"{s3_bucket_url}/lake"
    build_index(url, out=lake, storage_options=opts, out_storage_options=opts)
    dl = readers.open(lake, storage_options=opts)
    assert dl.engine == "index" and dl.runs == ["run1"]
    pd.testing.assert_frame_equal(dl.to_pandas(), df)
    r = dl.record("Torch.sum.0.forward", step=0, rank=0)
    assert torch.equal(r.output[0].load(framework="torch"),
                       ref.record("Torch.sum.0.forward", step=0, rank=0).output[0].load(framework="torch"))
