# Two commands set up a fresh clone completely:
#   make run    virtualenv + dependencies, then the tune of the default model here (~5 min), ending in the report
#   make test   virtualenv + every backend + system packages, the lint gate (ruff, mypy), then the whole test suite
#   make test-fast   the tests that start no process (no worker, no CLI): the quick loop while editing
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast lint system venv bytecode clean

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

# both tiers run in two pytest-xdist workers. The slow tier's tests wait on processes they start (a worker's imports
# on one core, a server, Ray) and left the second core idle: two workers, each test file (the Ray files together:
# conftest.py's RAY_FILES) in one worker, ran it 25 % faster (docs/results-2026-12-zen5.md, 2026-12-04 00:34). A test marked `alone` (it judges
# timings: QPS searches, compare's verdicts, contamination, lock waits) runs with nothing beside it (conftest.py).
test: system venv lint bytecode
	$(BIN)/python -m pytest -q -ra -n 2 -m "not slow" tests
	$(BIN)/python -m pytest -q -ra -n 2 --dist loadfile --durations=25 -m slow tests

test-fast: venv bytecode
	$(BIN)/python -m pytest -q -ra -n 2 -m "not slow" tests

# every process the suite starts (CLI, workers, services: hundreds) imports corescale's own modules; where
# PYTHONDONTWRITEBYTECODE is set no import writes their bytecode, and each process compiled them again (measured:
# 0.15 s of CPU per `corescale run` of the toy backend, its worker included). compileall writes it in any case.
bytecode: venv
	$(BIN)/python -m compileall -q corescale tests

clean:
	rm -rf $(VENV) outputs test-artifacts
