#!/usr/bin/env bash
# Run a command against PostgreSQL with stock settings: a throwaway server started for it
# (contend.testing.pg_cluster: autovacuum on, fsync on), or the server that
# CONTEND_BENCH_PG_SERVER names. Benchmarks run this way, not on the machine's own server,
# which may be set up for tests (this project's CI machine runs with autovacuum off, and
# every figure of a long run then measures table bloat). The command finds the server in
# CONTEND_BENCH_PG_SERVER and CONTEND_TEST_PG, and a database to use in CONTEND_BENCH_PG.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${CONTEND_BENCH_PG_SERVER:-}" ]; then
    export CONTEND_TEST_PG="${CONTEND_TEST_PG:-$CONTEND_BENCH_PG_SERVER}"
    export CONTEND_BENCH_PG="${CONTEND_BENCH_PG:-$CONTEND_BENCH_PG_SERVER/postgres}"
    exec "$@"
fi
exec env PYTHONPATH="$PWD/src" .venv/bin/python -m contend.testing.pg_cluster -- "$@"
