# toolhost: the two commands a newcomer needs are `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Two stamps: serving needs the runtime and the bundled families' extras only; the test tooling
# (the [test] extra, about 490 MB) comes with the first target that runs tests or tools. The
# test install is a superset, so it refreshes the serve stamp too; `make serve` then `make test`
# still installs [test], because the test stamp does not exist yet.
SERVE_EXTRAS := web,media
TEST_EXTRAS := test,web,media,otel
SERVE_STAMP := $(VENV)/.serve-stamp
STAMP := $(VENV)/.installed-stamp

.PHONY: serve test lint typecheck unit schemas manifests bench clean

$(SERVE_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(SERVE_EXTRAS)]'
	touch $(SERVE_STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(TEST_EXTRAS)]'
	touch $(STAMP) $(SERVE_STAMP)

serve: $(SERVE_STAMP)
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
