# The interface a newcomer uses: `make run` (the demo) and `make test` (the tests).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-loaded test-unit test-repo bench lint typecheck schemas release-snapshot install bytecode browser prometheus up down clean help

help:
	@echo "make run     start NATS + the six services, run the demo agent, stop everything"
	@echo "make test    install, start a private nats-server, run the test suite"
	@echo "make test-loaded  make test while 2 x cores CPU burners run; counts processes before and after"
	@echo "make test-unit  the pure-function tests only (no nats-server, no services): seconds"
	@echo "make test-repo  the checks of the repository (ruff, mypy, sizes, arrows, drift, the suite's shape): no server"
	@echo "make bench   validation and end-to-end benchmarks, printed as ratios to a baseline"
	@echo "make lint    ruff + mypy + tool-contract lint"
	@echo "make schemas regenerate schemas/messages, schemas/asyncapi.json and deploy/nats/auth.conf from the wire models, channel table and handlers"
	@echo "make release-snapshot  store the contracts as pyproject's release's (schemas/releases/<version>); docs/upgrades.md"

$(STAMP): pyproject.toml requirements.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c requirements.lock -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

# The checkout's own bytecode, compiled once before the tests: pip compiles what it installs, but not an editable
# install's sources, and with PYTHONDONTWRITEBYTECODE set (as on these machines) every one of the suite's ~600
# Python processes (services, CLI commands) compiled them again at import: ~0.13 s of CPU each. Python still
# checks each .pyc against its source, so an edited module is never run stale; an up-to-date tree costs a stat.
bytecode: $(STAMP)
	@$(PY) -m compileall -q -j 0 shared services loopwarden tests bench >/dev/null

# The console's browser tests drive Debian's chromium-headless-shell through Playwright
# (Playwright's own browser download does not work on these machines).
CHROMIUM ?= /usr/bin/chromium-headless-shell
browser:
	@test -x $(CHROMIUM) || { \
	  echo "installing chromium-headless-shell (Debian) for the console's browser tests ..."; \
	  (apt-get update -qq && apt-get install -y -qq chromium-headless-shell) >/dev/null \
	  || { echo "error: $(CHROMIUM) is missing and could not be installed; run as root:" \
	            "apt-get update && apt-get install -y chromium-headless-shell" >&2; exit 1; }; }
	@test -x $(CHROMIUM) || { echo "error: $(CHROMIUM) still missing after the install" >&2; exit 1; }

# The alert rules' tests (promtool test rules) and the real-Prometheus test run Debian's prometheus package.
PROMETHEUS ?= /usr/bin/prometheus
PROMTOOL ?= /usr/bin/promtool
prometheus:
	@test -x $(PROMETHEUS) -a -x $(PROMTOOL) || { \
	  echo "installing prometheus (Debian) for the alert rules' tests and the scrape test ..."; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus) >/dev/null \
	  || { echo "error: $(PROMETHEUS) or $(PROMTOOL) is missing and could not be installed; run as root:" \
	            "apt-get update && apt-get install -y prometheus" >&2; exit 1; }; }
	@test -x $(PROMETHEUS) -a -x $(PROMTOOL) || { echo "error: $(PROMETHEUS) or $(PROMTOOL) still missing after the install" >&2; exit 1; }

run: $(STAMP)
	$(VENV)/bin/loopwarden demo $(ARGS)

# The folder says what a module starts (docs/contributing.md, "The test suite"): tests/unit and tests/repo no
# server, tests/stack the session stack, tests/locked the generated auth.conf, tests/own processes of its own.
# Test modules run in LW_TEST_WORKERS parallel workers (default: the number of cores; 1: no workers), each
# module whole in one worker (--dist loadfile), so a module's stack is started once. Every bound a test
# waits on is multiplied by LW_TEST_TIME_SCALE (default 1): raise it on a machine that is busy.
LW_TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 1)
PYTEST_WORKERS = $(if $(filter 0 1,$(LW_TEST_WORKERS)),-p no:xdist,-n $(LW_TEST_WORKERS) --dist loadfile)

test: $(STAMP) bytecode browser prometheus
	$(PY) -m pytest -q $(PYTEST_WORKERS) $(ARGS)

# The same while 2 x cores CPU burners (stress-ng, else busy Python loops) load the machine, at a time
# scale of 3 unless LW_TEST_TIME_SCALE says otherwise; prints the processes of this checkout before and
# after and fails if any was left running. ARGS narrows it, e.g. ARGS=tests/stack/test_cli.py.
test-loaded: $(STAMP) bytecode browser prometheus
	LW_TEST_TIME_SCALE=$${LW_TEST_TIME_SCALE:-3} $(PY) -m tests.support.loaded -- $(PY) -m pytest -q $(PYTEST_WORKERS) $(ARGS)

# The fast inner loop: domain rules as plain functions, no server and no processes.
test-unit: $(STAMP)
	$(PY) -m pytest -q tests/unit -m "not slow" $(ARGS)

# The checks of the repository itself (tests/repo): no server either; most of the time is mypy.
test-repo: $(STAMP)
	$(PY) -m pytest -q -p no:xdist tests/repo $(ARGS)

# The side-by-side contenders (LangGraph, PydanticAI: pyproject's `bench` extra) are installed for the
# benchmarks only; `make test` never installs them.
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -c requirements.lock -e '.[dev,bench]'
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m bench $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check shared services loopwarden tests bench
	$(VENV)/bin/ruff format --check shared services loopwarden tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/loopwarden lint

schemas: $(STAMP)
	$(PY) -m loopwarden.generate

# A release's contracts, kept for the compatibility check (tests/repo/test_compat_release.py, docs/upgrades.md).
release-snapshot: $(STAMP)
	$(PY) -m loopwarden.generate snapshot

up: $(STAMP)
	$(VENV)/bin/loopwarden up

down: $(STAMP)
	$(VENV)/bin/loopwarden down

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .loopwarden build dist
