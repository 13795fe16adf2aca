#!/usr/bin/env bash
# The full chaos suite on every backend (minutes per backend); rewrites its figures table in
# docs/reliability.md. Options go to the runner, e.g. `scripts/chaos.sh --backend sqlite`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/venv.sh dev,postgres,etcd
scripts/install-etcd.sh
scripts/install-chaos.sh
exec .venv/bin/python -m contend.testing.chaos --write-doc "$@"
