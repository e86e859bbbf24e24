# Two entry points for a fresh clone: `make demo` and `make test`.
# Each creates the virtual environment on first use (pinned, see requirements-dev.txt).

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint docs

demo: $(STAMP)
	$(PY) -m tlckpt demo

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

docs: $(STAMP)
	$(PY) docs/gen_format_reference.py

$(STAMP): pyproject.toml setup.py requirements-dev.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)
