#!/usr/bin/env bash
# Every benchmark, one after the other on this machine, into docs/benchmarks.md (and JSON
# beside it): `contend bench` per backend, SQLite (temporary files), PostgreSQL (a throwaway
# server with stock settings, scripts/with-pg.sh, or CONTEND_BENCH_PG_SERVER), etcd (a
# throwaway etcd 3.5 started for the run); then contend against its peers (benchmarks/peers)
# how evenly four experts share the work (benchmarks/shares) and the sustained-load run
# (benchmarks/sustained), the peers from PyPI in .bench-venv.
#
# `scripts/bench.sh --quick` (`make bench QUICK=1`): a short run of each, about 30 minutes
# (the full run takes 2-3 hours, most of it the sustained-load runs of 10 minutes each).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=""
if [ "${1:-}" = "--quick" ] || [ -n "${BENCH_QUICK:-}" ]; then
    quick="--quick"
fi
scripts/venv.sh dev,postgres,etcd
scripts/install-etcd.sh
# etcd 3.5.5 or newer, as production should run (docs/etcd.md): the tests' 3.5.1 reads key by key
CONTEND_ETCD_BIN="$(scripts/fetch-etcd-bench.sh)"
export CONTEND_ETCD_BIN
scripts/bench-venv.sh >/dev/null
export PYTHONPATH="$PWD/src"
if [ -z "${CONTEND_BENCH_PG:-}" ]; then  # once, for the whole run: every PostgreSQL figure
    exec scripts/with-pg.sh "$0" "$@"      # comes from one server with stock settings
fi
.venv/bin/contend bench $quick
.venv/bin/contend bench $quick --store "$CONTEND_BENCH_PG" \
    --concurrency 64 --processes 1,2,4
# etcd allows 128 operations per transaction by default; raised here so that one transaction
# claims or commits ~200 tasks instead of ~25, and its Go garbage collector runs a quarter as
# often (GOGC=400) (docs/etcd.md, "Running etcd for contend").
GOGC=400 .venv/bin/python -m contend.testing.etcd_server --max-txn-ops=1024 -- \
    .venv/bin/contend bench $quick --store "{url}/bench?max_txn_ops=1024" --concurrency 512
.venv/bin/python -m benchmarks.peers $quick --backends sqlite,postgresql,etcd
.venv/bin/python -m benchmarks.shares $quick
.venv/bin/python -m benchmarks.sustained $quick
