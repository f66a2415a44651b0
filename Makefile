# toolhost: the two commands a newcomer needs are `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: serve test lint typecheck unit schemas manifests bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,web,media,otel]'
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/toolhost serve

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

test: lint typecheck
	$(VENV)/bin/pytest -q

unit: $(STAMP)
	$(VENV)/bin/pytest -q tests/unit

schemas: $(STAMP)
	$(VENV)/bin/toolhost dev schemas --write

manifests: $(STAMP)
	$(VENV)/bin/toolhost dev manifests --write

bench: $(STAMP)
	$(VENV)/bin/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
