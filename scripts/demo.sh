#!/usr/bin/env bash
# Install contend in .venv and run the demo on a fresh embedded SQLite store.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/venv.sh
exec .venv/bin/contend demo "$@"
