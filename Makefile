# The two commands: `make demo` runs the onboarding story, `make test` runs every check.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test lint typecheck contracts demo chaos bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check opledger tests
	$(BIN)/ruff format --check opledger tests

typecheck: $(STAMP)
	$(BIN)/mypy opledger

contracts: $(STAMP)
	$(BIN)/lint-imports

test: lint typecheck contracts
	$(BIN)/pytest $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/opledger demo $(DEMO_ARGS)

chaos: $(STAMP)
	$(BIN)/opledger chaos $(CHAOS_ARGS)

bench: $(STAMP)
	$(BIN)/opledger bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .opledger .pytest_cache .mypy_cache .ruff_cache
