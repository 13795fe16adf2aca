.PHONY: demo test bench bench-peers bench-sustained bench-shares bench-retention chaos lint bad-input-table exactly-once recovery-bench
demo:            ## install into .venv and run the demo on the embedded SQLite store
	scripts/demo.sh
test:            ## install dev dependencies into .venv and run every check and test
	scripts/test.sh
bench:           ## run every benchmark and rewrite docs/benchmarks.md (QUICK=1: a short run)
	scripts/bench.sh $(if $(QUICK),--quick)
bench-peers:     ## contend against PgQueuer, Procrastinate and Huey, same run (QUICK=1: short)
	scripts/bench-venv.sh >/dev/null
	CONTEND_ETCD_BIN="$$(scripts/fetch-etcd-bench.sh)" PYTHONPATH=src scripts/with-pg.sh .venv/bin/python -m benchmarks.peers $(if $(QUICK),--quick) --backends sqlite,postgresql,etcd
bench-sustained: ## 1,000 tasks/s for 10 min, with and without a held-back vacuum (QUICK=1: 60 s)
	scripts/bench-venv.sh >/dev/null
	CONTEND_ETCD_BIN="$$(scripts/fetch-etcd-bench.sh)" PYTHONPATH=src scripts/with-pg.sh .venv/bin/python -m benchmarks.sustained $(if $(QUICK),--quick)
bench-shares:    ## how evenly four default experts split bursts and a steady stream; docs/benchmarks.md
	CONTEND_ETCD_BIN="$$(scripts/fetch-etcd-bench.sh)" PYTHONPATH=src scripts/with-pg.sh .venv/bin/python -m benchmarks.shares
bench-retention: ## a million tasks through SQLite and PostgreSQL with retention; docs/benchmarks.md
	scripts/venv.sh dev,postgres >/dev/null
	PYTHONPATH=src scripts/with-pg.sh .venv/bin/python -m benchmarks.retention
chaos:           ## run the full chaos suite on every backend and rewrite its table in docs/reliability.md
	scripts/chaos.sh
bad-input-table: ## run every bad-input case and rewrite its table in docs/reliability.md
	PYTHONPATH=src .venv/bin/python scripts/bad-input-table.py
exactly-once:    ## count 10,000 tasks exactly once on every backend under kill -9 and SIGSTOP
	CONTEND_EXACTLY_ONCE_TASKS=10000 PYTHONPATH=src .venv/bin/pytest -s -p no:cacheprovider tests/acceptance/test_exactly_once.py
recovery-bench:  ## kill -9 supervised experts on every backend; rewrite docs/recovery.md
	PYTHONPATH=src .venv/bin/python -m benchmarks.recovery
