# Two entry points for a fresh clone (README.md):
#   make demo   set up .venv, then profile a small GPT-2-shaped model and print the report
#   make test   set up .venv, then run the test suite (CPU; Triton kernels under its interpreter)
# and, while working, make test-fast: the tests not marked slow (tests/conftest.py says which are)
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU wheel of this release lies on the development and CI machines' disk. On a GPU machine
# that already has torch, override it: make demo TORCH_SPEC=torch
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test test-fast lint typecheck FORCE

# The torch spec of the last install: rewritten (and so newer than .installed) only when TORCH_SPEC
# changes, so that `make test TORCH_SPEC=...` reinstalls torch in an existing .venv.
$(VENV)/.torch-spec: FORCE
	@mkdir -p $(VENV)
	@echo '$(TORCH_SPEC)' | cmp -s - $@ || echo '$(TORCH_SPEC)' > $@

# setup.py and the C sources: an edit rebuilds trainprof/trace/_scan and _forest (pip install -e builds them in place)
$(VENV)/.installed: pyproject.toml setup.py trainprof/trace/_scan.c trainprof/trace/_forest.c $(VENV)/.torch-spec
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[all,dev]"
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/trainprof demo

# One pytest worker per core (pytest-xdist); each worker's torch gets its share of the cores
# (tests/conftest.py); tests marked xdist_group share a worker, and so their module's fixtures.
test: $(VENV)/.installed
	$(PY) -m pytest -q -n auto --dist loadgroup tests

test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -n auto --dist loadgroup -m "not slow" tests

# ruff over the tree, then the type checker (what CI runs: .ci/run)
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check trainprof fused_layers benchmarks examples tests
	$(MAKE) --no-print-directory typecheck

# mypy over trainprof and fused_layers, as configured in pyproject.toml ([tool.mypy])
typecheck: $(VENV)/.installed
	$(PY) -m mypy
