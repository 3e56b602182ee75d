# Thin wrappers. `make serve` and `make test` set up from nothing what each needs: `make serve`
# the two venvs' runtimes and the data, `make test` (`make setup`) everything.
SHELL := /bin/bash
# Python 3.11, the newest TensorFlow 2.15 (the trainer's) has wheels for: python3.11 where there
# is one, else python3, which check_python then holds to 3.11.
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell command -v python3.11 >/dev/null 2>&1 && echo python3.11 || echo python3)
endif
# Stop with one line saying what to install, unless $(PYTHON) is Python 3.11.
check_python = $(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null || { \
	  echo "Python 3.11 is needed, and $(PYTHON) is $$(command -v $(PYTHON) >/dev/null && $(PYTHON) -V 2>&1 || echo 'not found'): install python3.11 and python3.11-venv (Debian and Ubuntu: from your release or the deadsnakes PPA), or give one: make PYTHON=/path/to/python3.11"; \
	  exit 1; }
# Two sides, two venvs (docs/architecture.md, "Two TensorFlows"): the service on current
# TensorFlow, the trainer on TensorFlow 2.15, the last with tf.estimator. Each is installed in
# two layers with a stamp each: its runtime (what `make serve` needs), then the tests' and
# docs' tools on top (what `make test` needs). The tools' stamp depends on the runtime's, so
# either order of `make serve` and `make test` installs each layer once.
VENV := .venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
SERVICE_STAMP := $(VENV)/.installed-service
STAMP := $(VENV)/.installed
TRAINING_VENV := .venv-training
TPY := $(TRAINING_VENV)/bin/python
TRAINING_RUNTIME_STAMP := $(TRAINING_VENV)/.installed-runtime
TRAINING_STAMP := $(TRAINING_VENV)/.installed
# Wheels the Kubernetes manifest tests read the TFJob and InferenceService schemas from.
CRD_SDKS := $(VENV)/crd-sdks
CRD_SDKS_STAMP := $(CRD_SDKS)/.downloaded
DATA_DIR ?= /usr/share/datasets/fashion-mnist
DATA_FILES := $(DATA_DIR)/train-images-idx3-ubyte.gz $(DATA_DIR)/train-labels-idx1-ubyte.gz \
              $(DATA_DIR)/t10k-images-idx3-ubyte.gz $(DATA_DIR)/t10k-labels-idx1-ubyte.gz
MODEL_NAME ?= fashion_mnist
MODEL_BASE_PATH ?= models
HOST ?= 127.0.0.1
PORT ?= 8000
# oneDNN made inference 1.2-1.4x faster on this CPU (measured with TF 2.15); TF 2.15 leaves it
# off on AVX2 machines.
export TF_ENABLE_ONEDNN_OPTS ?= 1
export TF_CPP_MIN_LOG_LEVEL ?= 2

# Hash-checked: each venv holds exactly what its locks name, each file with the sha256 the lock
# gives (uv itself is installed first, hash-checked, by the interpreter's own pip). The locks
# come from the requirements-*.in files (`make lock`). Bytecode is compiled at install: some
# machines set PYTHONDONTWRITEBYTECODE, and TensorFlow's import compiles for seconds without it.
UV_SYNC := $(UV) pip sync --quiet --require-hashes --compile-bytecode
# The project itself, editable, into each venv: a step of its own (a hash-checked run takes no
# `-e`), built with the locked setuptools (no isolated build environment fetched unlocked).
UV_PROJECT := $(UV) pip install --quiet --no-deps --no-build-isolation --compile-bytecode -e .

.PHONY: setup data compose browser tools monitoring venv train serve test test-fast test-repeat k8s lint format bench bench-peers clean \
        figures docs tokens tls containers test-containers serve-examples runtime shipped-model

# Everything `make test` needs: both venvs with the tests' and docs' tools, the data, and the
# Debian packages of the tests that drive other programs.
setup: venv data compose browser tools monitoring containers

venv: $(STAMP) $(TRAINING_STAMP) $(CRD_SDKS_STAMP)

# What serving and training need, and nothing of the tests: `make serve`, `make train`.
runtime: $(SERVICE_STAMP) $(TRAINING_RUNTIME_STAMP)

$(UV): requirements-uv.lock
	@test -x $(PY) || { $(check_python) && $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps -r requirements-uv.lock
	@touch $@

# Each layer is installed again only when its locks or the project metadata change. A sync
# leaves exactly what it names, so the runtime's sync takes the tools away (when its locks
# changed), and the tools' layer, older than it now, is synced again by the next `make test`.
$(SERVICE_STAMP): requirements-service.lock requirements-uv.lock pyproject.toml | $(UV)
	$(UV_SYNC) --python $(PY) requirements-service.lock requirements-uv.lock
	$(UV_PROJECT) --python $(PY)
	@touch $@

$(STAMP): requirements-service.lock requirements-dev.lock requirements-uv.lock pyproject.toml $(SERVICE_STAMP)
	$(UV_SYNC) --python $(PY) requirements-service.lock requirements-dev.lock requirements-uv.lock
	$(UV_PROJECT) --python $(PY)
	@touch $@

$(TRAINING_RUNTIME_STAMP): requirements-training.lock pyproject.toml | $(UV)
	@test -x $(TPY) || { $(check_python) && $(UV) venv --quiet --python $(PYTHON) $(TRAINING_VENV); }
	$(UV_SYNC) --python $(TPY) requirements-training.lock
	$(UV_PROJECT) --python $(TPY)
	@touch $@

$(TRAINING_STAMP): requirements-training.lock requirements-training-dev.lock pyproject.toml $(TRAINING_RUNTIME_STAMP)
	$(UV_SYNC) --python $(TPY) requirements-training.lock requirements-training-dev.lock
	$(UV_PROJECT) --python $(TPY)
	@touch $@

# Compile every requirements-*.in into its hashed lock with uv (tools/lock.py says how they
# layer); the pins of the existing locks are kept. UPGRADE="--upgrade-package NAME" moves one.
.PHONY: lock
lock: $(STAMP)
	$(PY) tools/lock.py $(UPGRADE)

# Downloaded (hash-checked), never installed: tests/support/crd_schemas.py reads their models.
$(CRD_SDKS_STAMP): deploy/kubernetes/crd-sdks.txt $(STAMP)
	$(PY) -m pip download --quiet --no-deps --require-hashes -r $< -d $(CRD_SDKS)
	@touch $@

data:
	@if [ "$(DATA_DIR)" = /usr/share/datasets/fashion-mnist ] && ! ls $(DATA_FILES) >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "Installing Debian package dataset-fashion-mnist..."; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null; \
	  else \
	    echo "Fashion-MNIST is missing: run 'sudo apt-get install dataset-fashion-mnist' (or set DATA_DIR)"; exit 1; \
	  fi; \
	fi

# tests/unit/test_containers.py validates the compose files with Debian's docker-compose (no engine needed).
compose:
	@command -v docker-compose >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null; \
	  else \
	    echo "docker-compose is missing: run 'sudo apt-get install docker-compose'"; exit 1; \
	  fi; }

# The page's browser tests drive Debian's headless Chromium through chromedriver; without
# root they are skipped and say what to install.
browser:
	@{ command -v chromium && command -v chromedriver; } >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else \
	    echo "Chromium is missing, so the browser tests will be skipped: run 'sudo apt-get install chromium chromium-driver'"; \
	  fi; }

# The benchmark's load generators: wrk (HTTP/1.1) and h2load (nghttp2-client: HTTP/2, for
# gRPC); tests/unit/benchmarks run both against stand-ins.
tools:
	@{ command -v wrk && command -v h2load; } >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nghttp2-client >/dev/null; \
	  else \
	    echo "wrk or h2load is missing, so their tests will be skipped: run 'sudo apt-get install wrk nghttp2-client'"; \
	  fi; }

# Debian's Prometheus: tests/live/service/test_prometheus_scrape.py scrapes a live service
# with it and queries the metrics back through its API.
monitoring:
	@command -v prometheus >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	  else \
	    echo "Prometheus is missing, so its scrape test will be skipped: run 'sudo apt-get install prometheus'"; \
	  fi; }

# Rootful podman and what it needs (tools/podman.py: a private configuration and storage under
# /var/tmp/estimator-serving-podman, the base image made with mmdebstrap), for the container
# tier, tests/live/containers. Without root it is skipped, and says so.
CONTAINER_PACKAGES := podman runc netavark aardvark-dns iptables mmdebstrap
containers:
	@{ command -v podman && command -v runc && command -v mmdebstrap && command -v iptables \
	   && test -x /usr/lib/podman/netavark && test -x /usr/lib/podman/aardvark-dns; } >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(CONTAINER_PACKAGES) >/dev/null; \
	  else \
	    echo "podman is missing, so the container tier will be skipped: run 'sudo apt-get install $(CONTAINER_PACKAGES)'"; \
	  fi; }

# The full model (the CNN, 10 epochs: docs/training.md), exported as the next version: a
# running `make serve` picks it up.
train: $(TRAINING_RUNTIME_STAMP) data
	$(TPY) -m training train --data-dir $(DATA_DIR) --export-dir $(MODEL_BASE_PATH)/$(MODEL_NAME)

# The gated retrain (docs/retraining.md): a new version only when it is not worse than the one
# serving; exit code 3 when it is not blessed. FEEDBACK_DIR adds the service's feedback;
# RETRAIN_ARGS adds options, e.g. RETRAIN_ARGS="--extra-data new-images/ --epochs 1".
.PHONY: retrain
retrain: $(TRAINING_RUNTIME_STAMP) data
	$(TPY) -m training retrain --data-dir $(DATA_DIR) --export-dir $(MODEL_BASE_PATH)/$(MODEL_NAME) \
	  $(if $(FEEDBACK_DIR),--feedback-dir $(FEEDBACK_DIR)) $(RETRAIN_ARGS)

# Bearer tokens for the shipped deployments (docs/security.md): a git-ignored file of their
# digests and, beside it, `.issued`, the tokens to hand out; mode 0600, never overwritten.
# docker-compose.yml reads the first as its `api-tokens` secret, and
#   kubectl -n estimator-serving create secret generic api-tokens --from-file=tokens=secrets/api-tokens
# makes the Kubernetes Secret. Standard library only: no venv needed.
# SENDERS="lab-a lab-b": a feedback token, and a name, for each sender of labels (the bounds
# on feedback are per name); `python3 deploy/make_tokens.py --add NAME` adds one later.
TOKENS_FILE ?= secrets/api-tokens
SENDERS ?=
tokens:
	@if [ -e $(TOKENS_FILE) ]; then echo "$(TOKENS_FILE) exists: keeping it"; \
	else $(PYTHON) deploy/make_tokens.py $(TOKENS_FILE) $(addprefix --sender ,$(SENDERS)); fi

# A self-signed certificate and key for TLS on the API's HTTP and gRPC ports (the Kubernetes
# component components/tls reads them from the Secret api-tls: docs/kubernetes.md), valid for
# the Service's names and loopback, for a year; git-ignored, the key mode 0600, never
# overwritten. A certificate from your CA or cert-manager does the same job.
TLS_DIR ?= secrets
TLS_NAMES ?= DNS:api,DNS:api.estimator-serving,DNS:api.estimator-serving.svc,DNS:api.estimator-serving.svc.cluster.local,DNS:localhost,IP:127.0.0.1
tls:
	@if [ -e $(TLS_DIR)/api-tls.key ] || [ -e $(TLS_DIR)/api-tls.crt ]; then \
	  echo "$(TLS_DIR)/api-tls.key or .crt exists: keeping it"; \
	else mkdir -p $(TLS_DIR) && (umask 077 && openssl req -x509 -newkey ec \
	  -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 365 -subj /CN=api.estimator-serving.svc \
	  -addext "subjectAltName=$(TLS_NAMES)" -keyout $(TLS_DIR)/api-tls.key \
	  -out $(TLS_DIR)/api-tls.crt 2>/dev/null) && chmod 0644 $(TLS_DIR)/api-tls.crt \
	  && echo "wrote $(TLS_DIR)/api-tls.crt and $(TLS_DIR)/api-tls.key"; fi

# $(call train_once,EXPORT_DIR,TRAIN_OPTIONS): `python -m training train` into EXPORT_DIR, only
# when no version is exported there yet.
train_once = if ! ls -d $(1)/[0-9]* >/dev/null 2>&1; then \
	  echo "No version under $(1): training one first."; \
	  $(TPY) -m training train $(2) --export-dir $(1); \
	fi

# The small Fashion-MNIST model the repository ships (models/README.md: the command that
# trained it, its test accuracy), served at once by `make serve` while no version is exported.
SHIPPED_MODEL := models/shipped/fashion_mnist/1
# $(call place_shipped,EXPORT_DIR): the shipped model as EXPORT_DIR/1, only when no version is
# exported there yet; copied to a hidden folder beside it, then renamed, as an export appears.
place_shipped = if ! ls -d $(1)/[0-9]* >/dev/null 2>&1; then \
	  echo "No version under $(1): serving the shipped model as version 1 (models/README.md); make train exports the full one as version 2."; \
	  mkdir -p $(1) && staging=$(1)/.shipped-$$$$ && cp -R $(SHIPPED_MODEL) $$staging \
	  && { mv -T $$staging $(1)/1 || { rm -rf $$staging; exit 1; }; }; \
	fi
# The shipped model is Fashion-MNIST's: for another model name or data, `make serve` trains one.
DEFAULT_DATA_DIR := /usr/share/datasets/fashion-mnist
fits_shipped = $(and $(filter fashion_mnist,$(1)),$(filter $(DEFAULT_DATA_DIR),$(DATA_DIR)))
# $(call first_version,EXPORT_DIR): the shipped model, or a model trained with the defaults,
# when no version is exported there yet.
first_version = $(if $(call fits_shipped,$(notdir $(1))),$(call place_shipped,$(1)),$(call train_once,$(1),--data-dir $(DATA_DIR)))

# The shipped model into $(MODEL_BASE_PATH)/fashion_mnist when it holds no version (for the
# containers, docs/containers.md); `make serve` does it too.
shipped-model:
	@$(call place_shipped,$(MODEL_BASE_PATH)/fashion_mnist)

# Serve; a first version (above) when none is exported yet. On 127.0.0.1 with no
# AUTH_TOKENS_FILE it is open to this machine only (the service says so at start).
serve: runtime data
	@$(call first_version,$(MODEL_BASE_PATH)/$(MODEL_NAME))
	@echo "Serving on http://$(HOST):$(PORT) (docs: /docs; try: curl http://$(HOST):$(PORT)/v1/models/$(MODEL_NAME))"
	MODEL_NAME=$(MODEL_NAME) MODEL_BASE_PATH=$(MODEL_BASE_PATH) HOST=$(HOST) PORT=$(PORT) $(PY) -m service

# The shipped examples side by side, from one model config (examples/models.config): Fashion-MNIST
# (the shipped model when none is exported, as `make serve` does) and a tabular
# classifier and regressor, pre-made Estimators trained in seconds each on the small CSV files
# `python -m training sample-data` writes (no download), when not exported yet. The exports go
# to models/ (git-ignored build output), the data and runs to runs/examples/.
EXAMPLES_RUNS := runs/examples
EXAMPLE_CLASSIFIER := --csv $(EXAMPLES_RUNS)/data/classification.csv --label label --model linear \
  --max-steps 300 --batch-size 32 --learning-rate 0.05 --seed 0 \
  --model-dir $(EXAMPLES_RUNS)/tabular_classifier
EXAMPLE_REGRESSOR := --csv $(EXAMPLES_RUNS)/data/regression.csv --label price --model dnn \
  --hidden-units 16,8 --max-steps 500 --batch-size 32 --learning-rate 0.05 --seed 0 \
  --model-dir $(EXAMPLES_RUNS)/tabular_regressor
serve-examples: runtime data
	@$(call first_version,models/fashion_mnist)
	@test -f $(EXAMPLES_RUNS)/data/regression.csv || $(TPY) -m training sample-data --out $(EXAMPLES_RUNS)/data
	@$(call train_once,models/tabular_classifier,$(EXAMPLE_CLASSIFIER))
	@$(call train_once,models/tabular_regressor,$(EXAMPLE_REGRESSOR))
	@echo "Serving fashion_mnist, tabular_classifier and tabular_regressor on http://$(HOST):$(PORT) (the README and docs/training.md show requests)"
	MODEL_CONFIG_FILE=examples/models.config MODEL_NAME=fashion_mnist HOST=$(HOST) PORT=$(PORT) $(PY) -m service

# Everything: tests/unit and tests/live (tests/README.md), the container tier included; where
# podman cannot run, that tier is skipped and this says why before and after. The two sides
# run at once, each in its own venv (tools/test_sides.py: tests/live/training in
# .venv-training, everything else in .venv).
test: setup
	@$(PY) tools/podman.py check >/dev/null || echo "*** the container tier (tests/live/containers) will be SKIPPED: $$($(PY) tools/podman.py check) ***"
	$(PY) tools/test_sides.py

# The flake hunt: the chosen sides N times over from nothing, beside HOG CPU-bound processes,
# then a table of every test that failed in any run (tools/test_sides.py --repeat), e.g.
# `make test-repeat N=3 SIDES="training service" HOG=1`.
N ?= 3
SIDES ?= training service
HOG ?= 0
test-repeat: setup
	$(PY) tools/test_sides.py --repeat $(N) --cpu-hog $(HOG) $(foreach side,$(SIDES),--side $(side))

# The container tier alone: the base image and both images (cached between runs), training,
# serving, the retrain, stop and compose in containers (docs/containers.md).
test-containers: venv data containers
	$(PY) tools/podman.py images
	$(PY) -m pytest tests/live/containers

# The fast tier, chosen by folder: tests/unit (no TensorFlow, no model, no server process
# beyond loopback helpers), under a minute (pytest-xdist: three workers on the two cores, since
# many of these tests wait on a subprocess or a timer; the full suite stays serial per side,
# its live servers measure load). PYTHONDONTWRITEBYTECODE unset, as for `make test`.
test-fast: venv compose
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest tests/unit -n 3

# Render every kustomization into build/kubernetes/ (to read) and run the manifest tests.
k8s: venv
	@mkdir -p build/kubernetes
	@for dir in $$(find deploy/kubernetes -name kustomization.yaml -exec dirname {} \; | sort); do \
	  grep -q '^kind: Component' $$dir/kustomization.yaml && continue; \
	  out=build/kubernetes/$$(echo $${dir#deploy/kubernetes/} | tr / -).yaml; \
	  $(VENV)/bin/kubectl kustomize $$dir > $$out && echo "$$out"; \
	done
	$(PY) -m pytest tests/unit/deploy tests/live/deploy -q

# ruff, then mypy ([tool.mypy] in pyproject.toml): over artifact/ and service/ in the
# service's venv, then over training/ against the trainer's (TF 2.15, numpy 1.26), each with
# a cache of its own under build/. .pre-commit-config.yaml runs the same commands.
lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m mypy --python-executable $(TPY) --cache-dir build/mypy-training -p training

format: venv
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

clean:
	rm -rf runs .pytest_cache .ruff_cache site

# The measured figures (docs/figures.md, the README's three commands) rendered again from
# benchmarks/results/latest.json and docs/measured.json; `make bench` runs it too.
# Neither target sets anything up: they need the venv `make setup` made.
figures:
	$(PY) docs/figures.py

# The docs site (mkdocs.yml, docs/) into site/; --strict fails on a broken link or anchor.
# First the generated pages: the figures, and the settings reference from service/settings.py.
docs: figures
	$(PY) docs/settings.py
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# Side-by-side throughput: in-process ceiling, naive FastAPI, this service without and with batching.
bench: setup
	$(PY) -m benchmarks.bench
	$(PY) docs/figures.py

# `make bench` plus the peers in the same run, table and chart: MLServer and BentoML serving
# the same model with their own batching (benchmarks/peers/), each in its own venv under
# benchmarks/.peers/, installed from its lock on first use (about 2 GB and a minute or two each).
bench-peers: setup
	$(PY) -m benchmarks.bench --peers
	$(PY) docs/figures.py
