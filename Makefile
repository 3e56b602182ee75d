# Thin wrappers. `make serve` and `make test` set everything up from nothing.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
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
# oneDNN made this CPU 1.2-1.4x faster (TF-NOTES.md); TF leaves it off on AVX2 machines.
export TF_ENABLE_ONEDNN_OPTS ?= 1
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: setup data compose venv train serve test k8s lint format bench clean

setup: venv data compose

venv: $(STAMP) $(CRD_SDKS_STAMP)

# Reinstalled only when the pinned requirements or the project metadata change.
$(STAMP): requirements.lock requirements-dev.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock -r requirements-dev.lock
	$(PY) -m pip install --quiet --no-deps -e .
	@touch $@

# Downloaded (hash-checked), never installed: tests/deploy/crd_schemas.py reads their models.
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

# tests/test_containers.py validates the compose files with Debian's docker-compose (no engine needed).
compose:
	@command -v docker-compose >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null; \
	  else \
	    echo "docker-compose is missing: run 'sudo apt-get install docker-compose'"; exit 1; \
	  fi; }

train: setup
	$(PY) -m training train --data-dir $(DATA_DIR) --export-dir $(MODEL_BASE_PATH)/$(MODEL_NAME)

# Train with the defaults only when no version is exported yet, then serve.
serve: setup
	@if ! ls -d $(MODEL_BASE_PATH)/$(MODEL_NAME)/[0-9]* >/dev/null 2>&1; then \
	  echo "No version under $(MODEL_BASE_PATH)/$(MODEL_NAME): training one with the defaults first."; \
	  $(PY) -m training train --data-dir $(DATA_DIR) --export-dir $(MODEL_BASE_PATH)/$(MODEL_NAME); \
	fi
	@echo "Serving on http://$(HOST):$(PORT) (docs: /docs; try: curl http://$(HOST):$(PORT)/v1/models/$(MODEL_NAME))"
	MODEL_NAME=$(MODEL_NAME) MODEL_BASE_PATH=$(MODEL_BASE_PATH) HOST=$(HOST) PORT=$(PORT) $(PY) -m service

test: setup
	$(PY) -m pytest

# Render every kustomization into build/kubernetes/ (to read) and run the manifest tests.
k8s: venv
	@mkdir -p build/kubernetes
	@for dir in $$(find deploy/kubernetes -name kustomization.yaml -exec dirname {} \; | sort); do \
	  grep -q '^kind: Component' $$dir/kustomization.yaml && continue; \
	  out=build/kubernetes/$$(echo $${dir#deploy/kubernetes/} | tr / -).yaml; \
	  $(VENV)/bin/kubectl kustomize $$dir > $$out && echo "$$out"; \
	done
	$(PY) -m pytest tests/deploy -q

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: venv
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

clean:
	rm -rf runs .pytest_cache .ruff_cache

# Side-by-side throughput: in-process ceiling, naive FastAPI, this service without and with batching.
bench: setup
	@command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }
	$(PY) -m benchmarks.bench
