# agentrun task runner. `make demo` starts the demo; `make test` runs every test suite.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.12 || command -v python3.13 || echo python3)
VENV := .venv
BIN := $(VENV)/bin
PG_URL ?= postgres://postgres@127.0.0.1:5432/agentrun
REDIS ?= redis://127.0.0.1:6379/0
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: setup demo test test-sqlite test-postgres test-e2e browser lint bench

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test]"
	touch $@

setup: $(BIN)/.installed

## The demo: embedded default (SQLite, in-memory channel layer, in-process tasks), demo agents.
## Its last lines say where it is and how to sign in; links in its emails follow HOST and PORT.
demo: setup
	DEBUG=1 $(BIN)/python manage.py migrate --noinput
	DEBUG=1 AGENTRUN_PUBLIC_URL="$${AGENTRUN_PUBLIC_URL:-http://$(HOST):$(PORT)}" $(BIN)/python manage.py demo --host $(HOST) --port $(PORT)

## Debian's chromium for the browser tests (root installs it; nothing is downloaded by playwright).
browser:
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }

## Everything: lint (ruff, the import layers, mypy on the core and the engine), the embedded default's tests on SQLite, the whole suite on
## PostgreSQL + Redis, the browser tests.
test: setup browser lint test-sqlite test-postgres test-e2e

## What proves the embedded default (SQLite's locking, the in-memory channel layer, in-process tasks and
## notification threads); everything runs once more, and in full, on PostgreSQL + Redis.
EMBEDDED_TESTS ?= tests/engine tests/streaming tests/notifications tests/approvals/test_grants.py tests/approvals/test_feed.py tests/api/test_decisions.py tests/robustness/test_health.py tests/server tests/security/test_every_door.py tests/api/test_listing_across.py
test-sqlite: setup
	env -u DATABASE_URL -u REDIS_URL $(BIN)/pytest -m "not e2e and not system" -q $(EMBEDDED_TESTS)

test-postgres: setup
	DATABASE_URL=$(PG_URL) REDIS_URL=$(REDIS) $(BIN)/pytest -m "not e2e" -q

test-e2e: setup browser
	REDIS_URL=$(REDIS) $(BIN)/pytest -m e2e -p no:asyncio -q tests/e2e

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

## The benchmark suite (docs/performance.md): one table. BENCH_N=1000000 for the big one; PostgreSQL + Redis.
bench: setup
	BENCH_PG=$(PG_URL) BENCH_REDIS_URL=$(REDIS) $(BIN)/python benchmarks/suite.py
