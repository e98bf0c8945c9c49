# The interface a newcomer uses: `make run` (the demo) and `make test` (the tests).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-all bench lint typecheck schemas install up down clean help

help:
	@echo "make run     start NATS + the six services, run the demo agent, stop everything"
	@echo "make test    install, start a private nats-server, run the test suite (short form of slow tests)"
	@echo "make bench   validation and end-to-end benchmarks, printed as ratios to a baseline"
	@echo "make lint    ruff + mypy + tool-contract lint"
	@echo "make schemas regenerate schemas/messages from the wire models"

$(STAMP): pyproject.toml requirements.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c requirements.lock -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/loopwarden demo $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

test-all: $(STAMP)
	LW_SLOW_TESTS=full $(PY) -m pytest -q $(ARGS)

bench: $(STAMP)
	$(PY) -m bench $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check shared services loopwarden tests bench
	$(VENV)/bin/ruff format --check shared services loopwarden tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/loopwarden lint

schemas: $(STAMP)
	$(PY) -m shared.schemagen

up: $(STAMP)
	$(VENV)/bin/loopwarden up

down: $(STAMP)
	$(VENV)/bin/loopwarden down

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .loopwarden
