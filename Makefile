# nodeledger: `make run` serves the API on SQLite; `make test` prepares everything the
# tests need (packages, Python env, PostgreSQL, Slurm, Kubernetes) and runs the suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# The suite's workers (pytest-xdist), each with real components of its own
# (tests/support/workers.py): its tests mostly wait on Slurm and Kubernetes, so three fit two
# cores. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 3
# The tier that needs no real component (docs/development.md).
FAST_TESTS := not postgres and not slurm and not kube and not deploy

.PHONY: run test test-fast venv deps lint testenv testenv-slurm testenv-kube testenv-down bench clean image

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,bench]'
	touch $@

venv: $(BIN)/.installed

run: venv
	$(BIN)/nodeledger serve

deps:
	bash scripts/install-system-deps.sh

# deps: shellcheck comes from Debian's packages, installed there on a fresh machine.
lint: venv deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	bash scripts/lint-shell.sh

# Slurm releases with a test cluster each; 25.11 is only built against (plugins, C tests).
SLURM_CLUSTERS := 24.11 26.05
SLURM_RELEASES := 24.11 25.11 26.05
# Kubernetes minors with a test control plane each (testenv/kube/tools/kube-MINOR): the whole
# suite runs on the newest, the API-facing tests on every one. NODELEDGER_TEST_KUBE_VERSIONS
# (comma-separated) narrows the builds as it narrows the tests.
comma := ,
KUBE_RELEASES := 1.37 1.36 1.35
KUBE_VERSIONS := $(subst $(comma), ,$(or $(NODELEDGER_TEST_KUBE_VERSIONS),$(KUBE_RELEASES)))

# Heavy, cached builds first, so no test waits on them. The Slurm chroots (mostly Debian's
# downloads and unpacking) build beside the Go builds (mostly compiling): on a new machine
# that saves the Slurm chain's minutes (docs/development.md).
testenv: deps
	bash testenv/postgres/pg.sh up >/dev/null
	$(MAKE) --no-print-directory -j2 testenv-slurm testenv-kube

testenv-slurm:
	for v in $(SLURM_CLUSTERS); do NODELEDGER_SLURM_VERSION=$$v bash testenv/slurm/cluster.sh build; done
	NODELEDGER_SLURM_VERSION=25.11 bash testenv/slurm/cluster.sh source

testenv-kube:
	for v in $(KUBE_VERSIONS); do NODELEDGER_KUBE_VERSION=$$v bash testenv/kube/cluster.sh build >/dev/null; done
# The GPU node's containerd 2.x and DRA kubelet plugin (tests/gpu/test_gpu_pods_run.py).
	$(if $(filter 1.37,$(KUBE_VERSIONS)),NODELEDGER_KUBE_NODES=1 NODELEDGER_KUBE_GPU_NODE=1 bash testenv/kube/cluster.sh build >/dev/null)

test: venv lint testenv
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

test-fast: venv
	$(BIN)/pytest -m "$(FAST_TESTS)" -n 2 $(PYTEST_ARGS)

# Every worker's components: worker N > 0 has its own run directory, cache and ports.
testenv-down:
	-for n in 0 1 2; do \
	  at=$$([ $$n = 0 ] || echo -worker-$$n); \
	  export NODELEDGER_RUNDIR=/tmp/nodeledger$$at NODELEDGER_CACHE=$$HOME/.cache/nodeledger$$at \
	    NODELEDGER_MAIN_CACHE=$$HOME/.cache/nodeledger NODELEDGER_PORT_OFFSET=$$((6000 * n)); \
	  [ -d "$$NODELEDGER_RUNDIR" ] || continue; \
	  for v in $(KUBE_RELEASES); do NODELEDGER_KUBE_VERSION=$$v bash testenv/kube/cluster.sh down; done; \
	  for v in $(SLURM_RELEASES); do NODELEDGER_SLURM_VERSION=$$v bash testenv/slurm/cluster.sh down; done; \
	  bash testenv/postgres/pg.sh down; \
	done

# Scenarios and their thresholds: bench/scenarios.toml (`python -m bench` lists them). Both
# run; the target fails after them if either missed an enforced threshold.
bench: venv testenv
	status=0; \
	$(BIN)/python -m bench http_admissions || status=$$?; \
	$(BIN)/python -m bench slurm_admission || status=$$?; \
	exit $$status

# The service's OCI image (image/build.sh): prints the archive's path. IMAGE=REF names it
# (default registry.nodeledger.test/nodeledger:<version>); push with
# skopeo copy oci-archive:FILE docker://REF.
IMAGE ?=
image:
	IMAGE=$(IMAGE) bash image/build.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis nodeledger.db*
