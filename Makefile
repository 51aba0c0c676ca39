# The set-up commands of the README: `make run`, `make test`, `make install`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CONFIG ?= config/default.toml

.PHONY: install run test test-slow coverage lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The torch to install with. A torch already in the venv is kept: the build a GPU user put
# there first (README), held at its version so no other requirement swaps it. A venv without
# one gets constraints.txt's pin, the CPU wheel (a loose torch pulls a multi-GB CUDA build).
# Read when the recipe runs, after the venv exists. `make install INSTALL_FLAGS=--dry-run`
# shows what pip would change.
TORCH_VERSION = $(BIN)/python -c 'from importlib.metadata import version; print(version("torch"))'
INSTALLED_TORCH = $(shell $(TORCH_VERSION) 2>/dev/null)
TORCH_CONSTRAINT ?= $(if $(INSTALLED_TORCH),'torch==$(INSTALLED_TORCH)',-c constraints.txt)
INSTALL_FLAGS ?=

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(INSTALL_FLAGS) $(TORCH_CONSTRAINT) -e '.[dev]'
	touch $(STAMP)
	@echo "installed with torch $$($(TORCH_VERSION)); its CUDA and GPUs: $(BIN)/navrl-daemon doctor"

install: $(STAMP)

run: $(STAMP)
	$(BIN)/navrl-daemon run --config $(CONFIG)

lint: $(STAMP)
	$(BIN)/ruff check navrl_daemon tests benchmarks examples
	$(BIN)/ruff format --check navrl_daemon tests benchmarks examples
	$(BIN)/lint-imports

# Two workers, the CI machine's two cores; an idle worker takes tests from a busy one
# (worksteal), so no long file holds one worker to the end. The CLI runs in the worker and
# daemon processes are forks of one pre-imported interpreter (navrl_daemon/testing/forked.py). The
# `slow`-marked checks (a learning run) run on their own in `test-slow`; .ci/run runs both.
# One OpenMP thread per process: two workers with torch's default of one thread per core
# oversubscribe the two cores (the suite took 392 s so, 293 s with one thread each).
test: lint
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -ra -n 2 --dist worksteal -m "not slow"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -ra -m slow

# Line coverage of navrl_daemon over what `make test` runs, daemon processes included
# (pyproject.toml's [tool.coverage.run]); the totals also land in coverage.json.
coverage: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --dist worksteal -m "not slow" -p no:cacheprovider \
		--cov --cov-report=term --cov-report=json:coverage.json

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
