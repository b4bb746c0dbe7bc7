# gaecli developer and user entry points. `make test` and `make demo` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch; a plain `torch` requirement would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.gaecli-installed

.PHONY: venv test demo sample-data bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(VENV)/bin/gae recompute sample_data -o demo_out --gamma 1 --lambd 0.95 --overwrite

sample-data: $(STAMP)
	$(PY) scripts/make_sample_data.py sample_data

bench: $(STAMP)
	$(PY) scripts/bench_kernels.py

clean:
	rm -rf $(VENV) demo_out .pytest_cache .hypothesis
