# Everything a fresh machine needs is installed from here: `make run`, `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test codegen lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m tools.devcluster

codegen: $(STAMP)
	$(PY) -m protocol.codegen

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP)
	$(PY) -m protocol.codegen --check
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/codec.py

clean:
	rm -rf $(VENV) data .pytest_cache .hypothesis
