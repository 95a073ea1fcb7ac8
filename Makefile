# The two commands of the quickstart: `make run` and `make test`.
VENV  := .venv
BIN   := $(VENV)/bin
STAMP := $(VENV)/.installed
# Caller keys (and Redis passwords): created by `make services` for every
# caller in queues.yml that has none, readable only by their owner.
export DATASERVICE_CALLERS_FILE ?= $(CURDIR)/.state/callers.yml

.PHONY: run demo test lint services stop-services proto clean

$(STAMP): pyproject.toml scripts/bootstrap.sh
	scripts/bootstrap.sh
	touch $@

# Redis and MariaDB answer on the configured URLs (private instances under .state/ if not).
services: $(STAMP)
	$(BIN)/python -m dataservice.localservices up

run: services
	$(BIN)/dataservice db upgrade
	$(BIN)/dataservice run

demo: services
	$(BIN)/dataservice db upgrade
	$(BIN)/dataservice run --demo 1000

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint services
	$(BIN)/pytest

proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

stop-services:
	$(BIN)/python -m dataservice.localservices down

clean:
	rm -rf $(VENV) .state .mypy_cache .ruff_cache .pytest_cache .hypothesis
