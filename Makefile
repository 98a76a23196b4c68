# The two commands of README.md. Each sets up the environment first (.ci/env: cached,
# keyed on the dependency spec; the first run for a spec takes several minutes).
PY := .venv/bin/python
# torch builds SGLang's C++ extensions here (its storage-key hash): one directory per checkout,
# so two checkouts or venvs never rebuild each other's (tests/sglang_cpu/README.md).
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.torch_ext

# The fast inner loop: the record format, the store, the checkpoint policy, the CLI and the
# configuration, without any test that starts an SGLang server (e2e) or a model process or a
# Mooncake cluster or runs long (slow). A minute or two on 2 cores.
FAST_TESTS := tests/test_format.py tests/test_store_*.py tests/test_eviction.py tests/test_budget_policy.py \
	tests/test_checkpoint_policy.py tests/test_checkpoint_hits.py \
	tests/test_cli*.py tests/test_config_doc.py tests/test_adapter_config.py

.PHONY: env demo test test-fast lint bench

env:
	@bash .ci/env

demo: env
	$(PY) bench/demo.py

lint: env
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

test: lint
	$(PY) -m pytest -q

test-fast: env
	$(PY) -m pytest -q -m "not e2e and not slow" $(FAST_TESTS)

bench: env
	$(PY) bench/bench_store.py
