# make demo : install what is needed and run the main job on the embedded default
# make test : install and run the CPU test suite (what CI runs)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.cudal2-installed
# A GPU machine keeps its own CUDA build of torch (the venv sees the system packages); a CPU machine takes the
# CPU wheel first, so that nothing pulls a multi-GB CUDA build.
HAVE_GPU   := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)
VENV_FLAGS := $(if $(HAVE_GPU),--system-site-packages,)
TORCH      := $(if $(HAVE_GPU),,torch==2.13.0)

.PHONY: install test demo lint gpu-check clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(TORCH),$(PY) -m pip install -q $(TORCH))
	$(PY) -m pip install -q -e '.[dev,train,ray]'
	# CUTLASS/CuTe headers only: the package's Python dependencies are not needed.
	$(PY) -m pip install -q --no-deps 'nvidia-cutlass==4.2.0.0'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m ruff check cudal2 tests benchmarks scripts
	# pytest exits 5 when it collected no test: that must fail, not pass silently.
	$(PY) -m pytest -q tests; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

demo: $(STAMP)
	$(PY) -m cudal2.demo

lint: $(STAMP)
	$(PY) -m ruff check cudal2 tests benchmarks scripts

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
