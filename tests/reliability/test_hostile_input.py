"""Hostile dumps given to the readers and the CLI: only typed MsprobeError subclasses (or a clean
CLI error exit, no traceback) may come out, no pickled code runs, nothing outside the dump is
read, and time and memory stay bounded."""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import msprobe.readers  # noqa: E402
from msprobe.cli import main as cli_main  # noqa: E402
from msprobe.errors import MsprobeError  # noqa: E402
from msprobe.pytorch import PrecisionDebugger  # noqa: E402
from tests.reliability._model import train  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = "Functional.linear.0.forward"
RANK = os.path.join("step0", "rank")


class Evil:
    """Unpickling this creates the marker directory: it must never happen."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    PrecisionDebugger._reset()
    path = str(tmp_path_factory.mktemp("pristine") / "dump")
    train(PrecisionDebugger(task="tensor", level="L1", dump_path=path), steps=1, iters=1)
    PrecisionDebugger._reset()
    return path


def _doc(root):
    with open(os.path.join(root, RANK, "dump.json")) as f:
        return json.load(f)


def _put_doc(root, doc):
    with open(os.path.join(root, RANK, "dump.json"), "w") as f:
        json.dump(doc, f)


def _input0(doc):
    return doc["data"][NAME]["input_args"][0]


def _tensor_path(root, doc=None):
    doc = doc or _doc(root)
    return os.path.join(root, RANK, "dump_tensor_data", _input0(doc)["data_name"])


def _set_data_name(root, data_name):
    doc = _doc(root)
    _input0(doc)["data_name"] = data_name
    _put_doc(root, doc)


# -- the hostile mutations: each gets (dump root, scratch dir outside the dump, marker path) ----

def pickled_code(root, outside, marker):
    torch.save(Evil(marker), _tensor_path(root))


def pickled_code_raw(root, outside, marker):
    import pickle

    with open(_tensor_path(root), "wb") as f:
        pickle.dump(Evil(marker), f)


def npy_object_array(root, outside, marker):
    _set_data_name(root, "evil.npy")
    arr = np.empty(3, dtype=object)
    arr[:] = [Evil(marker), 1, "x"]
    np.save(os.path.join(root, RANK, "dump_tensor_data", "evil.npy"), arr, allow_pickle=True)


def dotdot_data_name(root, outside, marker):
    _set_data_name(root, "../../../outside/secret.pt")


def absolute_data_name(root, outside, marker):
    _set_data_name(root, os.path.join(outside, "secret.pt"))


def symlink_tensor_outside(root, outside, marker):
    p = _tensor_path(root)
    os.unlink(p)
    os.symlink(os.path.join(outside, "secret.pt"), p)


def symlink_tensor_dir_outside(root, outside, marker):
    d = os.path.join(root, RANK, "dump_tensor_data")
    shutil.rmtree(d)
    os.symlink(outside, d)
    _set_data_name(root, "secret.pt")


def symlink_rank_dir_outside(root, outside, marker):
    os.symlink(outside, os.path.join(root, "step0", "rank1"))


def dotdot_dir_names(root, outside, marker):
    os.makedirs(os.path.join(root, "step0..", "rank.."), exist_ok=True)
    os.makedirs(os.path.join(root, "..step1", "rank"), exist_ok=True)


def huge_shape(root, outside, marker):
    doc = _doc(root)
    _input0(doc)["shape"] = [2 ** 40, 2 ** 40, 2 ** 40]
    _put_doc(root, doc)


def negative_shape(root, outside, marker):
    doc = _doc(root)
    _input0(doc)["shape"] = [-1, 5]
    _put_doc(root, doc)


def deeply_nested_json(root, outside, marker):
    depth = 200_000
    text = ('{"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": null, "data": {"%s": '
            % NAME) + "[" * depth + "]" * depth + "}}"
    with open(os.path.join(root, RANK, "dump.json"), "w") as f:
        f.write(text)


def non_utf8_json(root, outside, marker):
    p = os.path.join(root, RANK, "dump.json")
    with open(p, "rb") as f:
        data = f.read()
    with open(p, "wb") as f:
        f.write(data.replace(NAME.encode(), NAME.encode() + b"\xff\xfe", 1))


def non_utf8_names(root, outside, marker):
    os.makedirs(os.path.join(root.encode(), b"step\xff", b"rank\xfe"), exist_ok=True)
    with open(os.path.join(os.path.join(root, RANK, "dump_tensor_data").encode(), b"\xff\xfe.pt"), "wb") as f:
        f.write(b"junk")
    with open(os.path.join(root.encode(), b"step0", b"rank", b"st\xffack.json"), "wb") as f:
        f.write(b"{}")


def truncated_tensor(root, outside, marker):
    p = _tensor_path(root)
    with open(p, "rb") as f:
        data = f.read()
    with open(p, "wb") as f:
        f.write(data[: len(data) // 2])


def empty_tensor_file(root, outside, marker):
    open(_tensor_path(root), "wb").close()


def truncated_json(root, outside, marker):
    p = os.path.join(root, RANK, "dump.json")
    with open(p, "rb") as f:
        data = f.read()
    with open(p, "wb") as f:
        f.write(data[: len(data) // 3])


def wrong_dtype(root, outside, marker):
    doc = _doc(root)
    _input0(doc)["dtype"] = "torch.float64"
    _put_doc(root, doc)


def unknown_dtype(root, outside, marker):
    doc = _doc(root)
    _input0(doc)["dtype"] = "torch.__import__('os')"
    _put_doc(root, doc)


def wrong_types_in_record(root, outside, marker):
    doc = _doc(root)
    doc["data"][NAME]["input_args"] = [{"type": "torch.Tensor", "dtype": 5, "shape": "big", "data_name": 7}]
    _put_doc(root, doc)


def huge_file_small_record(root, outside, marker):
    with open(_tensor_path(root), "wb") as f:
        f.truncate(64 << 20)  # sparse: 64 MiB of zeros for a 5x12 float32 record


def dump_json_is_a_list(root, outside, marker):
    with open(os.path.join(root, RANK, "dump.json"), "w") as f:
        f.write("[1, 2, 3]")


def duplicate_keys_json(root, outside, marker):
    p = os.path.join(root, RANK, "dump.json")
    with open(p) as f:
        text = f.read()
    with open(p, "w") as f:
        f.write(text.replace('"data": {', '"data": {"%s": {}, ' % NAME, 1))


CASES = [pickled_code, pickled_code_raw, npy_object_array, dotdot_data_name, absolute_data_name,
         symlink_tensor_outside, symlink_tensor_dir_outside, symlink_rank_dir_outside, dotdot_dir_names, huge_shape,
         negative_shape, deeply_nested_json, non_utf8_json, non_utf8_names, truncated_tensor, empty_tensor_file,
         truncated_json, wrong_dtype, unknown_dtype, wrong_types_in_record, huge_file_small_record,
         dump_json_is_a_list, duplicate_keys_json]
#: cases where loading the tensor must fail (the others may load the untouched tensor)
MUST_FAIL = {pickled_code, pickled_code_raw, npy_object_array, dotdot_data_name, absolute_data_name,
             symlink_tensor_outside, symlink_tensor_dir_outside, huge_shape, negative_shape, deeply_nested_json,
             non_utf8_json, truncated_tensor, empty_tensor_file, truncated_json, wrong_dtype, unknown_dtype,
             wrong_types_in_record, huge_file_small_record, dump_json_is_a_list}


@pytest.fixture
def hostile(pristine, tmp_path, request):
    root = str(tmp_path / "dump")
    shutil.copytree(pristine, root, symlinks=True)
    outside = str(tmp_path / "outside")
    os.makedirs(outside)
    torch.save(torch.full((5, 12), 7.0), os.path.join(outside, "secret.pt"))
    marker = str(tmp_path / "PWNED")
    request.param(root, outside, marker)
    return root, marker


def _bounded(fn):
    """Run fn(); returns (result or exception, seconds, peak RSS growth in MiB)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    try:
        out = fn()
    except MsprobeError as exc:
        out = exc
    took = time.monotonic() - t0
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    return out, took, grown


@pytest.mark.parametrize("hostile", CASES, ids=[c.__name__ for c in CASES], indirect=True)
def test_reader_and_cli_survive(hostile, request, capsys):
    root, marker = hostile
    case = request.node.callspec.params["hostile"]

    def load():
        return msprobe.readers.open(root).record(NAME, step=0).input_args[0].load()

    out, took, grown = _bounded(load)
    assert not os.path.exists(marker), "pickled code ran"
    if case in MUST_FAIL:
        assert isinstance(out, MsprobeError), f"{case.__name__}: loaded {type(out).__name__}"
    else:
        assert isinstance(out, MsprobeError) or (isinstance(out, np.ndarray) and out.shape == (5, 12))
    if isinstance(out, np.ndarray):
        assert not np.all(out == 7.0), "read a tensor from outside the dump"
    assert took < 10 and grown < 256, (took, grown)
    for argv in (["validate", root], ["ls", root], ["show", root, NAME, "--step", "0"], ["show", root, NAME, "--json"]):
        rc, took, grown = _bounded(lambda: cli_main(argv))  # an exception other than MsprobeError fails the test
        assert not isinstance(rc, MsprobeError), f"{argv[0]} let {rc!r} escape main()"
        assert took < 10 and grown < 256, (argv, took, grown)
        assert not os.path.exists(marker)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if case in MUST_FAIL - {wrong_dtype, huge_shape, negative_shape, truncated_tensor, empty_tensor_file,
                            pickled_code, pickled_code_raw, npy_object_array, symlink_tensor_outside,
                            huge_file_small_record, unknown_dtype, wrong_types_in_record}:
        assert cli_main(["validate", root, "--quiet"]) != 0, f"validate accepted {case.__name__}"


@pytest.mark.parametrize("case", [pickled_code, deeply_nested_json, non_utf8_names, truncated_json,
                                  dotdot_data_name], ids=lambda c: c.__name__)
def test_cli_subprocess_exits_cleanly(pristine, tmp_path, case):
    root = str(tmp_path / "dump")
    shutil.copytree(pristine, root)
    outside = str(tmp_path / "outside")
    os.makedirs(outside)
    torch.save(torch.zeros(5, 12), os.path.join(outside, "secret.pt"))
    marker = str(tmp_path / "PWNED")
    case(root, outside, marker)
    env = dict(os.environ, PYTHONPATH=ROOT)
    for argv in (["validate", root], ["show", root, NAME]):
        p = subprocess.run([sys.executable, "-m", "msprobe", *argv], capture_output=True, env=env, timeout=60)
        assert b"Traceback" not in p.stderr, p.stderr.decode(errors="replace")[-3000:]
        assert p.returncode in (0, 1, 2)
    assert not os.path.exists(marker)


@pytest.mark.parametrize("argv", [
    ["validate", "{path}", "--storage-options", "{not json"],
    ["ls", "{path}", "--storage-options", "[1, 2]"],
    ["show", "{path}", NAME, "--step", "0", "--storage-options", '{"key": "x"}'],
    ["recover", "{path}", "--storage-options", "nope"],
    ["validate", "s3://no-such-bucket-xyz/run", "--storage-options", '{"anon": 5, "bogus_option": 1}'],
])
def test_cli_bad_storage_options_exit_cleanly(pristine, argv, capsys):
    argv = [a.replace("{path}", pristine) for a in argv]
    rc = cli_main(argv)
    assert rc != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error" in err
