.PHONY: demo test bench lint bad-input-table exactly-once
demo:            ## install into .venv and run the demo on the embedded SQLite store
	scripts/demo.sh
test:            ## install dev dependencies into .venv and run every check and test
	scripts/test.sh
bench:           ## run every backend's benchmark and rewrite docs/benchmarks.md
	scripts/bench.sh
bad-input-table: ## run every bad-input case and rewrite its table in docs/reliability.md
	PYTHONPATH=src .venv/bin/python scripts/bad-input-table.py
exactly-once:    ## count 10,000 tasks exactly once on every backend under kill -9 and SIGSTOP
	CONTEND_EXACTLY_ONCE_TASKS=10000 PYTHONPATH=src .venv/bin/pytest -s -p no:cacheprovider tests/acceptance/test_exactly_once.py
