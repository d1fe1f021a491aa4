# The two commands a newcomer needs: `make run` and `make test`.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install run migrate test test-fast lint format docs bench chaos chaos-cluster simulate clean

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

# Four test processes (each its own RabbitMQ node, namespaces and template
# database) on 2 cores: most tests wait on processes, timers and networks,
# so the tests' summed durations stay about the same as processes are added
# while the wall time falls (build/test-results/). Tests are handed out one
# at a time to whichever process is free (worksteal), not a file per
# process: the longest acceptance files run over two minutes. Tests that
# hold a request rate or many Postgres connections run after, alone; the
# parallel part peaked near 40 of a stock Postgres's 100 at three.
#
# Compiled modules are kept under build/pycache even where the environment
# sets PYTHONDONTWRITEBYTECODE (this machine's does): otherwise every
# `webhook-ingest` process a test starts compiles the package again (~0.065 s
# CPU each) and each pytest process its tests (~2.7 s), on a CPU-bound run.
# Each part leaves its tests' durations in build/test-results/ (JUnit XML):
# where the time of the last run went, without running it again.
TEST_ENV := PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(CURDIR)/build/pycache
RESULTS := build/test-results

# While lint runs (mypy: one core, ~25 s from a cold cache), a collection
# of the suite (`--co`: no test run, no broker) fills build/pycache on the
# other core: from a fresh clone the four test processes otherwise each
# compile the libraries and rewrite the tests they import, ~10 s of CPU
# more in all, at once, on 2 cores. Its own errors are the suite's to show.
test: install  ## lint, then the whole suite against the local Redis and Postgres and a private RabbitMQ node
	$(TEST_ENV) $(BIN)/pytest -q --collect-only -p no:cacheprovider >/dev/null 2>&1 & warming=$$!; \
	  $(MAKE) --no-print-directory lint; status=$$?; wait $$warming; exit $$status
	$(TEST_ENV) $(BIN)/pytest -q -n 4 --dist worksteal -m "not alone" --junitxml=$(RESULTS)/parallel.xml
	$(TEST_ENV) $(BIN)/pytest -q -m alone --junitxml=$(RESULTS)/alone.xml

test-fast: install  ## pure-logic tests only, no services
	$(BIN)/pytest -q tests/unit

# mypy checks the package as it is installed: a throw-away tree where
# webhook_ingest/ingress is ingress/ and so on (the package-dir mapping).
# It also checks the claim path's stand-ins against their ports
# (workers/claim/ports.py): TYPED_TESTS, whose imports of tests/ it follows;
# test_ports then checks what mypy does not, their parameters' names.
TYPED_TESTS := tests.support.in_memory tests.sim.postgres tests.sim.fake_redis
lint: install  ## ruff (rules and format), mypy, the stand-ins against their ports (a few seconds)
	$(BIN)/ruff check --quiet .
	$(BIN)/ruff format --check --quiet .
	@tree=$$(mktemp -d) && mkdir $$tree/webhook_ingest \
	  && ln -s $(CURDIR)/webhook_ingest/* $$tree/webhook_ingest/ \
	  && for folder in ingress workers shared; do ln -s $(CURDIR)/$$folder $$tree/webhook_ingest/$$folder; done \
	  && ln -s $(CURDIR)/tests $$tree/tests \
	  && cd $$tree && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml \
	     --cache-dir $(CURDIR)/build/mypy-cache -p webhook_ingest $(foreach module,$(TYPED_TESTS),-m $(module)); \
	  status=$$?; rm -rf $$tree; exit $$status
	$(BIN)/pytest -q -p no:randomly tests/unit/test_ports.py

docs: install  ## rewrite the generated tables of docs/reference.md from the code
	$(BIN)/python -m tests.support.reference_docs

format: install  ## sort imports and format the code as `make lint` checks it
	$(BIN)/ruff check --select I --fix --quiet .
	$(BIN)/ruff format --quiet .

# BENCH_ARGS passes options (python -m tests.bench --help): --phase slow, --phase ordering, --phase contract_floor, --peers (Celery and Dramatiq stacks beside ours), --phase pause (ours and theirs under a 2.5 s SIGSTOP).
bench: install  ## throughput/latency figures and ratios against the raw broker and the durable floor
	$(BIN)/python -m tests.bench $(BENCH_ARGS)

# SEED=N reproduces a run; CHAOS_ARGS passes more options (python -m tests.chaos --help), e.g. --ordering.
chaos: install  ## a seeded fault run: kills, cuts, pauses, a CPU hog, flushes, prunes, replays; checks every event and call (a few minutes)
	$(BIN)/python -m tests.chaos $(if $(SEED),--seed $(SEED)) $(CHAOS_ARGS)

chaos-cluster: install  ## three private RabbitMQ nodes: one SIGKILLed, another restarted under traffic (about 2 minutes)
	$(BIN)/python -m tests.chaos.cluster $(CHAOS_ARGS)

# SEED=N is the first seed, STEPS=N the loop steps to spend; SIM_ARGS passes more
# options (python -m tests.sim --help: --strict-attempts, --faults, --replay FILE).
simulate: install  ## the deterministic simulation of the claim path: real worker code, simulated services and clock; a failure prints its seed and a shrunk trace
	$(BIN)/python -m tests.sim $(if $(SEED),--seed $(SEED)) $(if $(STEPS),--steps $(STEPS)) $(SIM_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache build *.egg-info
