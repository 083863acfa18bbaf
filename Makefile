# gpufed: `make demo` and `make test` do all the set-up on a fresh machine (see README).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PROTO  := federation/api/v1/gpufed.proto
STUBS  := federation/api/v1/gpufed_pb2.py federation/api/v1/gpufed_pb2_grpc.py
# Re-install when the dependency list or the pins change.
DEPS_STAMP := $(VENV)/.deps-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

.PHONY: setup proto lint typecheck imports unit test demo bench-quick clean

setup: $(DEPS_STAMP) $(STUBS)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(DEPS_STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	rm -f $(VENV)/.deps-*
	touch $@

# Stubs come from the installed grpc_tools.protoc, never committed: see docs/architecture.md.
$(STUBS): $(PROTO) $(DEPS_STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. \
		--mypy_out=. --mypy_grpc_out=. $(PROTO)
	touch $(STUBS)

proto: $(STUBS)

lint: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

typecheck: setup
	$(BIN)/mypy

imports: setup
	$(BIN)/lint-imports

test: lint typecheck imports
	$(BIN)/pytest -q

demo: setup
	$(BIN)/gpufed demo

bench-quick: setup
	for b in bench/*.py; do $(BIN)/python $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .gpufed
