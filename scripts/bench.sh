#!/usr/bin/env bash
# Every backend's benchmark, one after the other on this machine, into docs/benchmarks.md:
# SQLite (temporary files), PostgreSQL (the local server, or CONTEND_BENCH_PG), and etcd (a
# throwaway etcd 3.5 started for the run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/venv.sh dev,postgres,etcd
scripts/install-etcd.sh
.venv/bin/contend bench
.venv/bin/contend bench --store "${CONTEND_BENCH_PG:-postgresql://127.0.0.1:5432/test}" \
    --concurrency 64 --processes 1,2,4
# etcd allows 128 operations per transaction by default; raised here so that one transaction
# claims or commits ~200 tasks instead of ~25, and its Go garbage collector runs a quarter as
# often (GOGC=400) (docs/etcd.md, "Running etcd for contend").
GOGC=400 .venv/bin/python -m contend.testing.etcd_server --max-txn-ops=1024 -- \
    .venv/bin/contend bench --store "{url}/bench?max_txn_ops=1024" --concurrency 512
