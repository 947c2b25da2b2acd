# make demo : install what is needed and run the main job on the embedded default
# make test : install and run the CPU test suite (what CI runs)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.cudal2-installed

.PHONY: install test demo lint gpu-check clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
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
