# The two commands: `make demo` runs the onboarding story, `make test` runs every check.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test lint typecheck contracts docs wheel mutate demo chaos bench clean

$(STAMP): pyproject.toml opledger/__init__.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check opledger tests
	$(BIN)/ruff format --check opledger tests

typecheck: $(STAMP)
	$(BIN)/mypy opledger tests

contracts: $(STAMP)
	$(BIN)/lint-imports

# The docs site, built strictly: a broken link or reference fails it (mkdocs.yml). `make
# test` builds it too (tests/integration/test_docs_site.py), beside the other tests.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir .site

# The sdist and wheel built, their metadata checked, the wheel installed into a fresh venv
# outside the checkout and run there (in `make test` too: tests/system/test_wheel.py).
wheel: $(STAMP)
	$(BIN)/python scripts/check_wheel.py

# Four pytest processes (pytest-xdist), each taking whole test files as it frees up: the
# longest first, and every process that takes system tests runs a stack of real processes
# of its own (tests/conftest.py).
TEST_JOBS ?= 4
test: lint typecheck contracts
	$(BIN)/pytest -n $(TEST_JOBS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

# Mutation testing of the retry decision, canonical payloads and the adapters' error mapping
# against the fast unit tests (config: [tool.mutmut] in pyproject.toml); always a fresh run.
# Prints killed/survived and the kill rate per module (also in mutants/mutation-report.txt).
MUTATE_JOBS ?= 2
mutate: $(STAMP)
	rm -rf mutants
	$(BIN)/mutmut run --max-children $(MUTATE_JOBS)
	$(BIN)/python scripts/mutation_report.py

demo: $(STAMP)
	$(BIN)/opledger demo $(DEMO_ARGS)

chaos: $(STAMP)
	$(BIN)/opledger chaos $(CHAOS_ARGS)

bench: $(STAMP)
	$(BIN)/opledger bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .opledger .pytest_cache .mypy_cache .ruff_cache mutants .site dist build
