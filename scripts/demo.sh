#!/usr/bin/env bash
# Set up ./.venv if needed and run the main job: dump a small training run and read it back.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m msprobe demo "$@"
