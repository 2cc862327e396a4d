#!/usr/bin/env bash
# Set up ./.venv if needed, lint, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .  # pyproject.toml [tool.ruff]: pyflakes, bugbear, imports, private access
.venv/bin/mypy  # pyproject.toml [tool.mypy]: the msprobe package
exec .venv/bin/python -m pytest -n 2 --dist loadgroup "$@"
