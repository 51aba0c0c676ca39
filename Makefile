# The two set-up commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CONFIG ?= config/default.toml

.PHONY: install run test test-slow lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/navrl-daemon run --config $(CONFIG)

lint: $(STAMP)
	$(BIN)/ruff check navrl_daemon tests benchmarks examples
	$(BIN)/ruff format --check navrl_daemon tests benchmarks examples
	$(BIN)/lint-imports

# Two workers, one test file each at a time (module fixtures are built once): the CI
# machine's two cores, and most tests wait on a one-thread daemon subprocess. The
# `slow`-marked checks (a learning run) run on their own in `test-slow`; .ci/run runs both.
test: lint
	$(BIN)/python -m pytest -q -ra -n 2 --dist loadfile -m "not slow"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -ra -m slow

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
