#!/usr/bin/env bash
# The whole test suite: lint, types, layer contracts, then every test level.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/venv.sh dev,postgres,etcd,dashboard,metrics,otel,cron
scripts/install-chromium.sh   # the dashboard tests drive Debian's chromium
scripts/install-etcd.sh   # the etcd tests start their own server from this binary
scripts/install-chaos.sh  # nftables, libfaketime: the chaos suite's short mode (tests/chaos)
scripts/install-shells.sh # zsh, fish: the completion scripts' tests
echo "== ruff"; .venv/bin/ruff check src tests benchmarks
echo "== ruff format"; .venv/bin/ruff format --check src tests benchmarks
echo "== mypy (strict, src/)"; .venv/bin/mypy
echo "== import contracts"; .venv/bin/lint-imports
echo "== pytest"
# Most tests wait on real processes, leases and servers rather than on the CPU: two workers
# on two cores cut the run from 17.5 min to about 11 (three made it 9, but loaded the
# machine enough that timing-bound tests and the workers' etcd servers fell behind). Every
# test has its own store (a fresh SQLite file, PostgreSQL database or etcd prefix; each worker
# starts its own etcd), so they do not meet. CONTEND_TEST_WORKERS=0 runs them in one process.
exec .venv/bin/pytest -n "${CONTEND_TEST_WORKERS:-2}" "$@"
