#!/usr/bin/env bash
# Create (or reuse) ./.venv and install the package with everything the demo and the tests need.
# pip's and the build's own output go to .venv/bootstrap.log (shown in full when the set-up fails):
# stdout stays the demo's (scripts/demo.sh), stderr gets one line saying that the set-up runs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# msprobe view's browser tests drive Debian's chromium through Playwright (never Playwright's own
# browser download); tests/view/conftest.py installs it the same way when it is missing
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "msprobe-lake: installing chromium (apt-get) for the explorer's browser tests" >&2
    apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } \
        || echo "msprobe-lake: could not install chromium (the view's browser tests will fail)" >&2
fi
log=.venv/bootstrap.log
stamp=.venv/.msprobe-installed
want=$(cat pyproject.toml constraints/ci.txt | sha1sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
echo "msprobe-lake: setting up ./.venv (the first time takes a few minutes; log: $log)" >&2
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
if ! {
    .venv/bin/python -m pip install -q --upgrade pip &&
    .venv/bin/python -m pip install -q -c constraints/ci.txt -e '.[all,test]'
} >"$log" 2>&1; then
    cat "$log" >&2
    echo "msprobe-lake: setting up ./.venv failed (the log above, kept in $log)" >&2
    exit 1
fi
echo "$want" > "$stamp"
