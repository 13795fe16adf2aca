.PHONY: demo test bench chaos lint bad-input-table
demo:            ## install into .venv and run the demo on the embedded SQLite store
	scripts/demo.sh
test:            ## install dev dependencies into .venv and run every check and test
	scripts/test.sh
bench:           ## run every backend's benchmark and rewrite docs/benchmarks.md
	scripts/bench.sh
chaos:           ## run the full chaos suite on every backend and rewrite its table in docs/reliability.md
	scripts/chaos.sh
bad-input-table: ## run every bad-input case and rewrite its table in docs/reliability.md
	PYTHONPATH=src .venv/bin/python scripts/bad-input-table.py
