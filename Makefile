# gpufed: `make demo` and `make test` do all the set-up on a fresh machine (see README).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PROTO  := federation/api/v1/gpufed.proto
STUBS  := federation/api/v1/gpufed_pb2.py federation/api/v1/gpufed_pb2_grpc.py
# Re-install when the dependency list or the pins change.
DEPS_STAMP := $(VENV)/.deps-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

.PHONY: setup proto lint typecheck imports unit test demo bench-quick clean system-tools

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

# Debian tools the tests drive as a user would: headless Chromium opens the HTML finance report,
# openssl makes the TLS certificates, postgresql is the history store's real PostgreSQL (started by
# the tests as a process, never as a system service). Installed only where missing (apt needs root, as CI has).
system-tools:
	@missing=""; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v openssl >/dev/null 2>&1 || missing="$$missing openssl"; \
	{ command -v initdb || ls /usr/lib/postgresql/*/bin/initdb; } >/dev/null 2>&1 || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "missing:$$missing; install them (apt-get install$$missing) or run as root" >&2; exit 1; fi; \
	  echo "installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

test: lint typecheck imports system-tools
	$(BIN)/pytest -q

demo: setup
	$(BIN)/gpufed demo

bench-quick: setup system-tools
	for b in bench/*.py; do $(BIN)/python $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .gpufed
