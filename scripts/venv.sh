#!/usr/bin/env bash
# Create (or reuse) .venv and install contend with the given extras, e.g. `scripts/venv.sh dev`.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=".venv/.installed-${extras:-base}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  if [ -n "$extras" ]; then
    .venv/bin/python -m pip install -q -e ".[${extras}]"
  else
    .venv/bin/python -m pip install -q -e .
  fi
  touch "$stamp"
fi
