# The two commands of README.md. Each sets up the environment first (.ci/env: cached,
# keyed on the dependency spec; the first run for a spec takes several minutes).
PY := .venv/bin/python

.PHONY: env demo test lint bench

env:
	@bash .ci/env

demo: env
	$(PY) bench/demo.py

lint: env
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

test: lint
	$(PY) -m pytest -q

bench: env
	$(PY) bench/bench_store.py
