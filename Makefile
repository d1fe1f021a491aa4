# The two commands a newcomer needs: `make run` and `make test`.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install run migrate test test-fast bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

run: install  ## migrate, then the ingress on :8080 and 2 workers (Ctrl-C stops)
	$(BIN)/webhook-ingest run

migrate: install
	$(BIN)/webhook-ingest migrate

test: install  ## the whole suite against the local RabbitMQ, Redis and Postgres
	$(BIN)/pytest -q

test-fast: install  ## pure-logic tests only, no services
	$(BIN)/pytest -q tests/unit

bench: install  ## throughput/latency figures and ratios against the raw broker
	$(BIN)/python -m tests.bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info
