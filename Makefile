# Agent Jobs — the verbs. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# Python 3.13 is the Lambda runtime; use it when this machine has it, else python3.
PYTHON ?= $(shell command -v python3.13 >/dev/null 2>&1 && python3.13 -c 'pass' 2>/dev/null && echo python3.13 || \
            (p=$$(pyenv prefix 3.13 2>/dev/null | head -n1); [ -n "$$p" ] && [ -x "$$p/bin/python3.13" ] && echo "$$p/bin/python3.13") || echo python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# checkov has its own virtualenv: its dependencies conflict with the SAM CLI's pins.
CHECKOV_VENV ?= .venv-checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed
export SAM_CLI_TELEMETRY := 0
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: help venv hooks sandbox-tools node-tools format lint template-lint security-lint test test-fast unit coverage schema openapi docs build \
	build-local build-sam-local sam-local demo local chaos differential sim bench deploy clean

help: ## list the verbs
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): requirements-dev.txt layers/shared/requirements.txt layers/shared/requirements-sam-local.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

venv: $(STAMP) ## create .venv with the pinned development requirements

# .pre-commit-config.yaml's hooks are `repo: local` and run .venv's own ruff and cfn-lint: nothing is fetched.
hooks: $(STAMP) ## install the git pre-commit hook (ruff, ruff format, cfn-lint on template.yaml)
	$(BIN)/pre-commit install

# The local runtime runs every test command in a bubblewrap sandbox and never without one: install it when missing
# (as root, with apt-get; refreshing the package lists only when the first try fails), else say the command to run.
sandbox-tools: ## make sure bwrap (Debian package bubblewrap) is installed for the local test sandbox
	@command -v bwrap >/dev/null 2>&1 && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing bubblewrap (bwrap) for the local test sandbox"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
			{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; }; \
	fi; \
	command -v bwrap >/dev/null 2>&1 || { echo "bwrap is missing: run \`sudo apt-get install bubblewrap\` (the local" \
		"runtime runs test commands only in its sandbox)" >&2; exit 1; }

# The Node.js producer and TypeScript client examples' tests install their locked dependencies with npm ci: Node.js 18.17+
# (the client example's fetch) and npm must be here.
node-tools: ## make sure node and npm are installed (the Node.js producer and TypeScript client examples' tests)
	@command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing nodejs and npm for the Node.js producer example's test"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; \
	fi; \
	command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || { echo "node and npm are missing: install" \
		"Node.js 18.17+ with npm (e.g. \`sudo apt-get install nodejs npm\`)" >&2; exit 1; }

format: $(STAMP) ## fix what ruff can (ruff check --fix), then format (ruff format)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

lint: $(STAMP) ## ruff (lint + format check) and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

template-lint: $(STAMP) ## cfn-lint and sam validate --lint on template.yaml
	$(BIN)/cfn-lint template.yaml
	$(BIN)/sam validate --lint --region us-east-1

$(CHECKOV_STAMP): requirements-checkov.txt
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(CHECKOV_VENV)/bin/python -m pip install --quiet -r requirements-checkov.txt
	touch $(CHECKOV_STAMP)

# Offline: --skip-download and BC_SKIP_MAPPING keep checkov from fetching guidelines from its platform, and
# CKV_SKIP_PACKAGE_UPDATE_CHECK from asking the package index for a newer version. Fails on any failed check; each
# accepted finding is skipped on its resource in template.yaml with the reason.
security-lint: $(CHECKOV_STAMP) ## checkov on template.yaml (offline); zero failed checks
	BC_SKIP_MAPPING=TRUE CKV_SKIP_PACKAGE_UPDATE_CHECK=TRUE CKV_PARSE_ERROR_FAIL=TRUE \
		$(CHECKOV_VENV)/bin/checkov -f template.yaml --framework cloudformation --skip-download --compact --quiet

test: sandbox-tools node-tools lint template-lint security-lint ## everything CI runs: lint, template lint, security scan, all tests
	$(BIN)/python -m pytest

test-fast: sandbox-tools node-tools $(STAMP) ## the tests without the sam build ones
	$(BIN)/python -m pytest -m "not build"

# The tests that need no AWS emulator, network or sandbox: tests/unit without the ones tests/conftest.py marks `aws`.
UNIT_TESTS := tests/unit -m "not aws"

unit: $(STAMP) ## the fast tests (seconds): tests/unit without moto, network or sandbox
	$(BIN)/python -m pytest $(UNIT_TESTS) -q

# COVERAGE_TESTS picks the tests (default: the unit ones); `make coverage COVERAGE_TESTS=tests` measures the whole suite.
COVERAGE_TESTS ?= $(UNIT_TESTS)

coverage: $(STAMP) ## coverage report of COVERAGE_TESTS (default: the unit tests) in the terminal and htmlcov/
	$(BIN)/python -m pytest $(COVERAGE_TESTS) -q --cov --cov-report=term --cov-report=html

schema: $(STAMP) ## rewrite schemas/job-message.v1.schema.json from the job model (a test checks it is current)
	PYTHONPATH=layers/shared $(BIN)/python -m agent_jobs.wire > schemas/job-message.v1.schema.json

openapi: $(STAMP) ## rewrite docs/openapi.json, the document GET /openapi.json serves (a test checks it is current)
	PYTHONPATH=layers/shared:functions/enqueue_api $(BIN)/python -m enqueue_api.app --write docs/openapi.json

docs: $(STAMP) ## regenerate docs/architecture.md's state diagram from the core's transition table (a test checks it)
	PYTHONPATH=layers/shared $(BIN)/python -m agent_jobs.core.diagram --write docs/architecture.md

# The functions' and the layer's instruction set, set together: the template's Architecture parameter and the layer's
# wheels. arm64 (the default) is what is deployed, into .aws-sam/build; another goes to .aws-sam/build-<architecture>
# (or BUILD_DIR), never built from sam's cache, so that `sam deploy` never picks it up by mistake.
ARCHITECTURE ?= arm64
BUILD_DIR ?= $(if $(filter arm64,$(ARCHITECTURE)),.aws-sam/build,.aws-sam/build-$(ARCHITECTURE))
SAM_CACHED = $(if $(SAM_LOCAL),,$(and $(filter arm64,$(ARCHITECTURE)),$(filter .aws-sam/build,$(BUILD_DIR))))
# Set by build-sam-local: the layer also gets layers/shared/requirements-sam-local.txt.
SAM_LOCAL ?=

build: $(STAMP) ## sam build for ARCHITECTURE (arm64, as deployed; x86_64 for sam local on such a machine) into BUILD_DIR
	@case "$(ARCHITECTURE)" in arm64|x86_64) ;; *) echo "ARCHITECTURE must be arm64 or x86_64" >&2; exit 1 ;; esac
	ARCHITECTURE=$(ARCHITECTURE) SAM_LOCAL=$(SAM_LOCAL) $(BIN)/sam build --parameter-overrides Architecture=$(ARCHITECTURE) \
		--build-dir $(BUILD_DIR) $(if $(SAM_CACHED),,--no-cached)

# What `sam local` runs: this machine's architecture, and the layer with what the functions need only there (the
# producer's own token check under `sam local start-api`), into .aws-sam/sam-local; never deployed.
build-sam-local: $(STAMP) ## sam build for sam local: this machine's architecture, into .aws-sam/sam-local
	$(MAKE) build ARCHITECTURE=$$(uname -m | sed 's/^aarch64$$/arm64/; s/^amd64$$/x86_64/') \
		BUILD_DIR=.aws-sam/sam-local SAM_LOCAL=1

build-local: $(STAMP) ## sam build with the layer's wheels for this machine (to run the built handlers here)
	LAYER_PLATFORM=manylinux2014_$$(uname -m) LAYER_PYTHON_VERSION=$$($(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])') \
		$(BIN)/sam build --no-cached --build-dir .aws-sam/build-local

demo: sandbox-tools $(STAMP) ## run the whole system locally (embedded emulator, API, workers) under a faulty workload, then verify
	$(BIN)/python -m agent_jobs_local demo $(DEMO_ARGS)

local: sandbox-tools $(STAMP) ## run the local stack for manual use; writes env.local.json (sam local) and .agent-jobs/local.json (agent-jobs)
	$(BIN)/python -m agent_jobs_local local $(LOCAL_ARGS)

chaos: sandbox-tools $(STAMP) ## the chaos suite at a larger size (CHAOS_JOBS, default 1000)
	CHAOS_JOBS=$${CHAOS_JOBS:-1000} CHAOS_WORKSPACES=$${CHAOS_WORKSPACES:-40} $(BIN)/python -m pytest tests/system -q

# apply_patch against real git and GNU patch on DIFFERENTIAL_EXAMPLES random edits per format (make test runs 25).
differential: $(STAMP) ## the differential test of apply_patch against git and GNU patch at a larger size (500 examples)
	DIFFERENTIAL_EXAMPLES=$${DIFFERENTIAL_EXAMPLES:-500} $(BIN)/python -m pytest tests/git/test_differential.py -q

# SEEDS seeds (default 1000) on every core; PLANT=<name> puts back one bug of the naive pattern (`--list-plants`).
sim: $(STAMP) ## the deterministic simulation: SEEDS seeds with faults at every step; a failing seed prints its replay
	$(BIN)/python -m agent_jobs_sim --seeds $(or $(SEEDS),1000) $(if $(PLANT),--plant $(PLANT)) $(if $(SHARE),--share $(SHARE)) $(if $(FIRST),--first $(FIRST))

bench: $(STAMP) ## benchmarks against the naive pattern measured in the same run; rewrites BENCHMARKS.md
	$(BIN)/python -m agent_jobs_bench --output BENCHMARKS.md

# The `sam local` commands of docs/sam-local.md, run for real (tests/sam_local): Docker (installed and started as
# root when missing), the Lambda Python base image (built by tools/build_lambda_image.sh when it cannot be pulled), a
# build for this machine, the local stack, every `sam local invoke` on the events/ files and `sam local start-api`.
sam-local: sandbox-tools $(STAMP) ## run the sam local commands of docs/sam-local.md for real and check their answers (needs Docker)
	$(BIN)/python -m pytest tests/sam_local -m sam_local -s -q

deploy: build ## sam deploy with samconfig.toml defaults
	$(BIN)/sam deploy

clean: ## remove build output and caches
	rm -rf .aws-sam .pytest_cache .mypy_cache .ruff_cache .coverage htmlcov
