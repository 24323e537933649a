# Two commands set up a fresh clone completely:
#   make run    virtualenv + dependencies, then the tune of the default model here (~5 min), ending in the report
#   make test   virtualenv + every backend + system packages, the lint gate (ruff, mypy), then the whole test suite
#   make test-fast   the tests that start no process (no worker, no CLI): the quick loop while editing
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast lint system venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[all,test]'
	touch $(STAMP)

venv: $(STAMP)

system:
	./.ci/setup-system.sh

run: venv
	$(BIN)/corescale demo

lint: venv
	$(BIN)/ruff check corescale tests benchmarks
	$(BIN)/mypy

# the fast tier runs in two pytest-xdist workers (in-process tests: about 1.4x faster on 2 cores); the slow tier
# runs alone (its tests start pinned workers on every CPU: two at once ran no faster and would crowd each other)
test: system venv lint
	$(BIN)/python -m pytest -q -ra -n 2 -m "not slow" tests
	$(BIN)/python -m pytest -q -ra --durations=25 -m slow tests

test-fast: venv
	$(BIN)/python -m pytest -q -ra -n 2 -m "not slow" tests

clean:
	rm -rf $(VENV) outputs test-artifacts
