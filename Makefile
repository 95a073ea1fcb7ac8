# The two commands of the quickstart: `make run` and `make test`.
VENV  := .venv
BIN   := $(VENV)/bin
STAMP := $(VENV)/.installed
# Caller keys (and Redis passwords): created by `make services` for every
# caller in queues.yml that has none, readable only by their owner.
export DATASERVICE_CALLERS_FILE ?= $(CURDIR)/.state/callers.yml
# Written by `make services` when the configured MariaDB has no binlog: the URLs
# of the private one that has, which run and demo use instead. Read by each
# command (not by make) so that a fresh clone's first `make run` sees it; the
# tests never read it.
SERVICES_ENV := .state/services.env
# Flower's credentials, also from `make services` (.state/flower.env).
FLOWER_ENV := .state/flower.env
WITH_SERVICES_ENV := set -a; for f in $(SERVICES_ENV) $(FLOWER_ENV); do if [ -f $$f ]; then . ./$$f; fi; done; set +a;

.PHONY: run demo test test-fast lint services cells stop-services proto clean

$(STAMP): pyproject.toml tools/pyproject.toml scripts/bootstrap.sh examples/node/package-lock.json
	scripts/bootstrap.sh
	touch $@

# Redis, MariaDB and RabbitMQ answer on the URLs the project uses (private
# instances under .state/ if not), and a MariaDB with a binlog is there for the
# change stream. The project's own modules are compiled first (only what
# changed): where PYTHONDONTWRITEBYTECODE is set, each worker process would
# otherwise compile them again when it starts.
services: $(STAMP)
	$(BIN)/python -m compileall -q -j0 dataservice tools bench tests
	$(BIN)/python -m dataservice_tools.localservices up

# Three cells' Redis (cell a Sentinel-managed) and their cells file, for trying
# cells out (docs/operations.md, "Cells"); stop-services stops them too.
cells: $(STAMP)
	$(BIN)/python -m dataservice_tools.localservices cells

run: services
	$(WITH_SERVICES_ENV) $(BIN)/dataservice db upgrade
	$(WITH_SERVICES_ENV) $(BIN)/dataservice run

demo: services
	$(WITH_SERVICES_ENV) $(BIN)/dataservice db upgrade
	$(WITH_SERVICES_ENV) $(BIN)/dataservice run --demo 1000

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint services
	$(BIN)/pytest --durations=25

# The edit loop: no load, fault, browser or slow runs (pyproject.toml's markers).
test-fast: services
	$(BIN)/pytest -m "not (slow or load or fault or browser)" --durations=10

proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

stop-services:
	$(BIN)/python -m dataservice_tools.localservices down

clean:
	rm -rf $(VENV) .state .mypy_cache .ruff_cache .pytest_cache .hypothesis
