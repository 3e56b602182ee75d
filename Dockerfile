# syntax=docker/dockerfile:1
# Images of this project, from one Dockerfile:
#   api      the prediction service (the default target)      docker build --target api .
#   trainer  the training job, with Debian's Fashion-MNIST     docker build --target trainer .
# Each image carries the shared `artifact` package and its own side only: the API image has
# no training code and current TensorFlow (requirements-service.lock), the trainer no web
# framework and TensorFlow 2.15 with tf.estimator (requirements-training.lock).
# A GPU build adds CUDA's pip wheels (requirements-gpu.lock, requirements-training-gpu.lock):
# --build-arg TENSORFLOW_EXTRAS=and-cuda (docker-compose.gpu.yml does that).
# Every pip install is hash-checked (--require-hashes): only the files the locks name, each
# with its sha256 (docs/security.md, "Reproducible installs").

# The base image, by tag (docs/containers.md says why not by digest yet); override it to
# build from another, e.g. one pinned by digest: --build-arg PYTHON_IMAGE=python@sha256:...
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# --- runtime: a clean base with a non-root user and an empty virtualenv in /opt/venv --------
FROM ${PYTHON_IMAGE} AS runtime
# Match your host user's id (docker-compose passes APP_UID) so the trainer can write to the
# bind-mounted ./models.
ARG APP_UID=1000
ENV PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TF_CPP_MIN_LOG_LEVEL=2 \
    TF_ENABLE_ONEDNN_OPTS=1 \
    MODEL_NAME=fashion_mnist \
    MODEL_BASE_PATH=/models
RUN useradd --uid "${APP_UID}" --user-group --create-home --shell /usr/sbin/nologin app \
 && mkdir -p /models /app/runs /feedback \
 && chown app:app /models /app/runs /feedback \
 && python -m venv /opt/venv
WORKDIR /src
# pip itself first, from its lock: Debian's refuses an extra's requirement in hash mode.
COPY requirements-pip.lock ./
RUN pip install --require-hashes --no-deps --requirement requirements-pip.lock

# --- api-deps / trainer-deps: each image's pinned packages, installed into /opt/venv --------
# Two TensorFlows (docs/architecture.md, "Two TensorFlows"): the api on current TensorFlow
# (requirements-service.lock), the trainer on 2.15, the last with tf.estimator
# (requirements-training.lock). Rebuilt only when a lock file (or the extras) change, not on
# every code change; with TENSORFLOW_EXTRAS=and-cuda, each side's GPU lock, which includes it.
# Each image is built FROM its deps stage, not by copying /opt/venv out of it: a copy from
# another stage makes the builder hash the whole venv (2 GB) to find its cached layer, which
# took minutes here on every code change. (pip writes the packages' bytecode whatever
# PYTHONDONTWRITEBYTECODE says: that only stops the running program's own.)
FROM runtime AS api-deps
ARG TENSORFLOW_EXTRAS=""
COPY requirements-service.lock requirements-gpu.lock ./
RUN case "$TENSORFLOW_EXTRAS" in \
      "") pip install --require-hashes --requirement requirements-service.lock ;; \
      and-cuda) pip install --require-hashes --requirement requirements-gpu.lock ;; \
      *) echo "TENSORFLOW_EXTRAS: expected '' or 'and-cuda', got '$TENSORFLOW_EXTRAS'" >&2; exit 1 ;; \
    esac

FROM runtime AS trainer-deps
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends dataset-fashion-mnist \
 && rm -rf /var/lib/apt/lists/*
ARG TENSORFLOW_EXTRAS=""
COPY requirements-training.lock requirements-training-gpu.lock ./
RUN case "$TENSORFLOW_EXTRAS" in \
      "") pip install --require-hashes --requirement requirements-training.lock ;; \
      and-cuda) pip install --require-hashes --requirement requirements-training-gpu.lock ;; \
      *) echo "TENSORFLOW_EXTRAS: expected '' or 'and-cuda', got '$TENSORFLOW_EXTRAS'" >&2; exit 1 ;; \
    esac

# --- trainer: `python -m training train` on Fashion-MNIST into /models ----------------------
FROM trainer-deps AS trainer
WORKDIR /app
COPY artifact /app/artifact
COPY training /app/training
USER app
# /app/runs keeps checkpoints (a volume in docker-compose.yml), so a killed run resumes.
ENTRYPOINT ["python", "-m", "training"]
CMD ["train", "--data-dir", "/usr/share/datasets/fashion-mnist", \
     "--model-dir", "/app/runs/fashion_mnist", "--export-dir", "/models/fashion_mnist"]

# --- api: the service, as a drop-in for tensorflow/serving (the last stage: the default target)
# Its ports (gRPC 8500, REST 8501), its variables (MODEL_NAME=model, MODEL_BASE_PATH=/models)
# and an entry point that passes its arguments on: TF Serving's quickstart runs with only the
# image name changed (`docker run -p 8501:8501 -v $PWD/x:/models/x -e MODEL_NAME=x IMAGE`), and
# so do manifests that run /usr/bin/tensorflow_model_server with TF Serving's flags (KServe's
# TF Serving runtime). The flags win over the variables; every setting is also a variable
# (`docker run IMAGE --help` lists both).
FROM api-deps AS api
WORKDIR /app
COPY artifact /app/artifact
COPY service /app/service
# TF Serving's binary and its image's entry point, by their names: the same main as
# `python -m service`, exec'd so it is the container's first process and gets SIGTERM.
RUN printf '#!/bin/sh\nexec /opt/venv/bin/python -m service "$@"\n' > /usr/bin/tensorflow_model_server \
 && printf '#!/bin/sh\nexec /usr/bin/tensorflow_model_server "$@"\n' > /usr/bin/tf_serving_entrypoint.sh \
 && chmod 755 /usr/bin/tensorflow_model_server /usr/bin/tf_serving_entrypoint.sh
# ALLOW_ANONYMOUS=true: TF Serving's image answers anyone, and so does this one run bare (one
# WARNING line says so at start); docker-compose.yml and the Kubernetes manifests pass
# AUTH_TOKENS_FILE. `python -m service` outside the image still refuses a reachable HOST
# without tokens (docs/security.md).
ENV HOST=0.0.0.0 \
    PORT=8501 \
    GRPC_PORT=8500 \
    MODEL_NAME=model \
    MODEL_BASE_PATH=/models \
    ALLOW_ANONYMOUS=true
USER app
EXPOSE 8500 8501
# SIGTERM drains (readyz 503, DRAIN_SECONDS) and lets in-flight requests finish
# (SHUTDOWN_TIMEOUT_SECONDS), then exits 0: give `docker stop -t 40` (compose sets
# stop_grace_period: 40s; Docker's default 10 s is shorter than that).
STOPSIGNAL SIGTERM
# No curl in the slim image: Python asks /readyz on the port the service listens on (its
# --rest_api_port, else PORT; service/healthcheck.py).
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-m", "service.healthcheck"]
ENTRYPOINT ["/usr/bin/tf_serving_entrypoint.sh"]
CMD []
