#!/usr/bin/env bash
# The dumper table of bench/bench_dumper.py --table on a CUDA device, ours and the real msprobe 26.2.0,
# in one prepared run of at most 8 minutes (BUDGET_S, default 480, covers everything below).
#
#   bash bench/gpu/run.sh            # from the repository root (or anywhere: it finds the root)
#
# With CUDA: bench/gpt_model.py's "1b" size (about 1.07 B parameters: 18 layers, hidden 2048, vocab
# 32000, 1 x 512 tokens), forward+backward in the dump window, 1 warm-up + 2 measured steps per fresh
# process, wall clock (each step ends with torch.cuda.synchronize()), rows statistics L1 / mix /
# L1+md5 and tensor L1 (classic .pt and ours' Zarr store). Without CUDA (the CPU fallback, which is
# how this script is tested where no device is lent): the "opheavy" size on the CPU, same rows.
#
# What it installs: the python is $PYTHON (default python3) and must import torch. Our package runs
# from this checkout (PYTHONPATH); the dependencies it lacks (numpy, fsspec, pyyaml, tqdm, zarr) are
# installed into a venv over that python's site-packages, at the versions of constraints/ci.txt. The
# real tool comes from tests/_realtool.py's cached venv (mindstudio-probe 26.2.0 over the same torch;
# $MSPROBE_REAL_PYTHON: an existing one). Where the machine has no package index, put the wheels in
# bench/gpu/wheels (pip download them elsewhere): pip then installs from there only.
# The dumps go under $WORK (default /tmp/msprobe_gpu_bench); each run removes its own.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"
WORK="${WORK:-/tmp/msprobe_gpu_bench}"
BUDGET_S="${BUDGET_S:-480}"
T0=$(date +%s)
say() { echo "[bench/gpu/run.sh +$(( $(date +%s) - T0 ))s] $*" >&2; }
mkdir -p "$WORK"
if [ -d "$ROOT/bench/gpu/wheels" ]; then
    export PIP_NO_INDEX=1 PIP_FIND_LINKS="$ROOT/bench/gpu/wheels"
fi

"$PY" -c "import torch" || { say "$PY cannot import torch: set PYTHON to a python with torch"; exit 2; }
DEVICE="$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")"
if [ "$DEVICE" = cuda ]; then
    SIZE=1b
    "$PY" -c "import torch; p = torch.cuda.get_device_properties(0); print(f'device: {p.name}, {p.total_memory / 2**30:.0f} GiB')"
else
    SIZE=opheavy
    say "no CUDA device: the CPU fallback (size $SIZE)"
fi

# our side: $PY itself when it is a venv's, else a venv over its site-packages (its torch), with what
# our package needs
if "$PY" -c "import sys; sys.exit(0 if sys.prefix != sys.base_prefix else 1)"; then
    OURS="$PY"
else
    VENV="$WORK/venv"
    [ -x "$VENV/bin/python" ] || "$PY" -m venv --system-site-packages "$VENV"
    OURS="$VENV/bin/python"
fi
missing="$(cd "$WORK" && "$OURS" - <<'EOF'
import importlib.util
need = {"numpy": "numpy", "fsspec": "fsspec", "yaml": "pyyaml", "tqdm": "tqdm", "zarr": "zarr"}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
EOF
)"
if [ -n "$missing" ]; then
    say "installing $missing"
    # shellcheck disable=SC2086 # one word per package
    "$OURS" -m pip install -q -c "$ROOT/constraints/ci.txt" $missing
fi
(cd "$WORK" && PYTHONPATH="$ROOT" "$OURS" -c "import msprobe.pytorch, zarr; print('ours:', msprobe.__file__)")

# the real tool: tests/_realtool.py's venv (built once, cached; it locks)
REAL="${MSPROBE_REAL_PYTHON:-}"
if [ -z "$REAL" ]; then
    REAL="$(cd "$ROOT" && "$PY" -c "import sys; sys.path.insert(0, 'tests'); import _realtool; print(_realtool.real_tool_python('26.2.0'))")" \
        || { say "the real tool's venv could not be built (see ~/.cache/msprobe-lake/*.log): ours only"; REAL=""; }
fi
say "real tool: ${REAL:-none}"

LEFT=$(( BUDGET_S - ($(date +%s) - T0) ))
if [ "$LEFT" -lt 60 ]; then
    say "only ${LEFT}s left of ${BUDGET_S}s after the set-up: not starting the table"
    exit 3
fi
say "the table ($LEFT s left)"
export MSPROBE_BENCH_DUMP_ROOT="$WORK"
cd "$ROOT"
PYTHONPATH="$ROOT" timeout "$LEFT" "$OURS" bench/bench_dumper.py --table --device "$DEVICE" --size "$SIZE" \
    --rounds 1 --steps 2 --table-metrics wall --table-modes L1,mix,md5,tensor,tensor_zarr --real-python "$REAL"
say "done"
