# Two entry points on a fresh machine: `make demo` and `make test`.
# Each creates .venv if it is missing and installs what it needs into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP_CORE := $(VENV)/.installed-core
STAMP_DEV  := $(VENV)/.installed-dev

.PHONY: demo test test-slow bench profiles clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP_CORE): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# The tests also trace small models, so they install the `trace` extra (torch pinned to
# the CPU build 2.13.0, never a multi-GB CUDA build) with the `dev` tools.
$(STAMP_DEV): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,trace,dask,tune]'
	touch $(STAMP_CORE) $@

demo: $(STAMP_CORE)
	$(BIN)/swapplan info synth-transformer-l12-b16-s1024
	$(BIN)/swapplan simulate synth-transformer-l12-b16-s1024
	@echo "# Without a plan, 60% of the peak does not fit (exit 1 is the expected answer here):"
	@$(BIN)/swapplan simulate synth-transformer-l12-b16-s1024 --budget 60%; [ $$? -eq 1 ]
	@echo "# With Capuchin's plan it does:"
	$(BIN)/swapplan plan synth-transformer-l12-b16-s1024 --planner capuchin --budget 60% -o demo-plan.json
	@echo "# Which planner for GPT-2 and ResNet-50 on an A100 40 GB? (charts and a report in demo-compare/)"
	$(BIN)/swapplan compare gpt2-b48-s1024 resnet50-b1024-s224 --planners lms,vdnn,g10,capuchin \
		--budgets 36GiB,30GiB,24GiB --hardware a100-40gb-pcie4 --out demo-compare

# The tests run in parallel (pytest-xdist: a worker a core, an idle one takes tests from a
# busy one). `make test` runs all but the tests marked slow (minutes on 2 cores), `make
# test-slow` only those (sweeps, real training runs, solvers at scale); CI runs both (.ci/run).
# pytest exits 5 when it collected no tests: that is a failure, never a pass.
PYTEST := $(BIN)/python -m pytest -q -n auto --dist worksteal

test: $(STAMP_DEV)
	@$(PYTEST) -m "not slow"; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

test-slow: $(STAMP_DEV)
	@$(PYTEST) -m slow; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-slow: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

bench: $(STAMP_DEV)
	$(BIN)/python benchmarks/run_all.py
	$(BIN)/python benchmarks/fidelity.py

# Regenerate the shipped profiles byte-for-byte.
profiles: $(STAMP_CORE)
	$(BIN)/python -m tracer.make_profiles

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis demo-compare demo-plan.json
