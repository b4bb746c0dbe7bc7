# gaecli developer and user entry points. `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch pinned to the version the project is tested with. Where pip would pull a CUDA build
# and the CPU one is wanted, add PyTorch's CPU wheel index, e.g.
#   make demo TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH_SPEC ?= torch==2.13.0
# gaecli and its dependencies only (what `make demo` needs)
BASE_STAMP := $(VENV)/.gaecli-base-installed
# plus the test and lint tools and every optional extra (what `make test` needs)
DEV_STAMP := $(VENV)/.gaecli-dev-installed

.PHONY: venv dev-venv test lint demo sample-data bench clean

venv: $(BASE_STAMP)

dev-venv: $(DEV_STAMP)

$(BASE_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e .
	touch $(BASE_STAMP)

$(DEV_STAMP): $(BASE_STAMP)
	$(PY) -m pip install -q -e ".[dev]"
	touch $(DEV_STAMP)

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check gaecli tests scripts

test: lint
	$(PY) -m pytest -q

# The demo also fills the kernel cache (numba's compiled code, in ~/.cache/gaecli/numba or
# NUMBA_CACHE_DIR: docs/reliability.md): its recompute compiles that command's kernels, the
# quiet diff and validate theirs, so that no later command waits for the compiler.
demo: $(BASE_STAMP)
	$(VENV)/bin/gae recompute sample_data/agentic sample_data/single_turn.parquet -o demo_out --gamma 1 --lambd 0.95 --overwrite
	$(VENV)/bin/gae diff sample_data/agentic --gamma 1 --lambd 0.95 --baseline all --quiet
	$(VENV)/bin/gae validate sample_data/agentic sample_data/single_turn.parquet --quiet

sample-data: $(BASE_STAMP)
	$(PY) scripts/make_sample_data.py sample_data

bench: $(BASE_STAMP)
	$(PY) scripts/bench_kernels.py

clean:
	rm -rf $(VENV) demo_out .pytest_cache .hypothesis
