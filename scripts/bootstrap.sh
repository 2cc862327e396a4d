#!/usr/bin/env bash
# Create (or reuse) ./.venv and install the package with everything the demo and the tests need.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.msprobe-installed
want=$(cat pyproject.toml constraints/ci.txt | sha1sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null
    .venv/bin/python -m pip install -q -c constraints/ci.txt -e '.[all,test]'
    echo "$want" > "$stamp"
fi
