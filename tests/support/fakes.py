"""Fakes for the fast tier: a backend and a registry loader with no TensorFlow behind them.

`FakeBackend` answers like the in-process backend would, with a deterministic toy model per
version (a fixed random linear layer and a softmax), so tests can check that answers are
routed, split and rendered right without training anything. `GatedFakeBackend` holds every
model call until a test opens the gate, which makes batching tests deterministic.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import uvloop
from google.protobuf import struct_pb2

from artifact.contract import (
    CLASSES_KEY,
    FASHION_MNIST_LABELS,
    IMAGE_SHAPE,
    INPUT_KEY,
    NUM_CLASSES,
    PREDICT_OUTPUT_KEY,
    PROBABILITIES_KEY,
    SIGNATURE_NAME,
)
from service.app import create_app
from service.backends.base import Backend
from service.backends.registry import servable_not_found
from service.errors import BadInput, NotFound, NotReady, SignatureNotFound, UpstreamError
from service.security import is_loopback
from service.server import granian_server
from service.settings import Settings
from service.types import (
    ModelMetadata,
    Prediction,
    SignatureSpec,
    TensorSpec,
    VersionState,
    VersionStatus,
)

with warnings.catch_warnings():
    # Starlette deprecates its httpx-based TestClient in favour of a package not installed.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

MODEL_NAME = "fashion_mnist"
PREDICT_METHOD = "tensorflow/serving/predict"


def toy_model(version: int, images: np.ndarray) -> dict[str, np.ndarray]:
    """A version's deterministic outputs: softmax of a fixed random linear map of the pixels."""
    weights = np.random.default_rng(version).normal(size=(28 * 28, NUM_CLASSES))
    # Centred, so that different images get different classes.
    logits = (images.reshape(len(images), -1).astype(np.float64) - 0.5) @ weights
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities = (exp / exp.sum(axis=1, keepdims=True)).astype(np.float32)
    return {
        CLASSES_KEY: probabilities.argmax(axis=1).astype(np.int64),
        PROBABILITIES_KEY: probabilities,
    }


def signature_defs(version: int) -> struct_pb2.Struct:
    """A stand-in for a SignatureDefMap proto (any message renders through MessageToDict)."""
    signatures = struct_pb2.Struct()
    signatures.update({SIGNATURE_NAME: {"version": version}, PREDICT_OUTPUT_KEY: {}})
    return signatures


def signature_specs() -> dict[str, SignatureSpec]:
    """The typed signatures every exported version has (README, Export): `image` float32
    (-1, 28, 28) in; `classes` int64 (-1) and `probabilities` float32 (-1, 10) out."""
    inputs = (TensorSpec(INPUT_KEY, np.dtype(np.float32), (-1, *IMAGE_SHAPE)),)
    outputs = (
        TensorSpec(CLASSES_KEY, np.dtype(np.int64), (-1,)),
        TensorSpec(PROBABILITIES_KEY, np.dtype(np.float32), (-1, NUM_CLASSES)),
    )
    return {
        name: SignatureSpec(name, PREDICT_METHOD, inputs, outputs)
        for name in (PREDICT_OUTPUT_KEY, SIGNATURE_NAME)
    }


class FakeBackend(Backend):
    """Serves toy models of the given versions of one model; the `stable` label's version (or
    the newest) answers requests that name none.

    Attributes:
        calls: (version asked for, label asked for, number of images) of every predict call.
        labels: the model's version labels (tests set them).
        delays: seconds a version's predictions take (a slow shadow, say).
    """

    def __init__(self, versions=(1,), model_name: str = MODEL_NAME, device: str = "/CPU:0"):
        super().__init__(model_name)
        self.versions = sorted(versions)
        self._device = device
        self.started = self.closed = False
        self.reason = "the model is loading"
        self.calls: list[tuple[int | None, str | None, int]] = []
        self.labels: dict[str, int] = {}
        self.delays: dict[int, float] = {}
        self.failing: set[int] = set()
        self.applied: list = []
        # Where model_dir() says the versions are (the page's tests put files there).
        self.base_path = Path("models")

    def model_names(self) -> list[str]:
        return [self.model_name]

    def serving_version(self, name: str) -> int | None:
        if name != self.model_name or not self.versions or not self.started:
            return None
        stable = self.labels.get("stable")
        return stable if stable in self.versions else self.versions[-1]

    def not_ready_reason(self, name: str) -> str:
        return self.reason

    def version_labels(self, name: str) -> dict[str, int]:
        return dict(self.labels) if name == self.model_name else {}

    def device(self) -> str:
        return self._device

    def class_labels(self, name: str, version: int) -> tuple[str, ...]:
        return FASHION_MNIST_LABELS

    def model_dir(self, name: str) -> Path:
        if name != self.model_name:
            raise NotFound(f"Could not find any versions of model {name}")
        return self.base_path / name

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.closed = True

    async def apply_config(self, entries):
        self.applied.append(entries)
        return [f"model {e.name}: applied" for e in entries]

    def _version(self, name: str, version: int | None, label: str | None = None) -> int:
        if name != self.model_name:
            raise NotFound(servable_not_found(name, version))
        if label is not None:
            if label not in self.labels:
                raise BadInput(f"Unrecognized servable version label: {label}")
            version = self.labels[label]
        if version is None:
            serving = self.serving_version(name)
            if serving is None:
                raise NotReady(f"model {name} is not ready: {self.reason}")
            return serving
        if version not in self.versions:
            raise NotFound(servable_not_found(name, version))
        return version

    async def model_status(self, name, version, label=None) -> list[VersionStatus]:
        if name != self.model_name:
            raise NotFound(f"Could not find any versions of model {name}")
        if version is None and label is None:
            versions = self.versions
        else:
            versions = [self._version(name, version, label)]
        return [VersionStatus(v, VersionState.AVAILABLE) for v in sorted(versions, reverse=True)]

    async def metadata(self, name, version, label=None) -> ModelMetadata:
        version = self._version(name, version, label)
        return ModelMetadata(name, version, signature_defs(version), signature_specs())

    async def predict(self, name, images, version=None, signature_name=SIGNATURE_NAME, label=None):
        self.calls.append((version, label, len(images)))
        version = self._version(name, version, label)
        if signature_name not in (SIGNATURE_NAME, PREDICT_OUTPUT_KEY):
            raise BadInput(f'Serving signature name: "{signature_name}" not found')
        if self.delays.get(version):
            await asyncio.sleep(self.delays[version])
        if version in self.failing:
            raise UpstreamError(f"version {version} failed")
        return Prediction(version, toy_model(version, images))


@dataclasses.dataclass
class FakeModel:
    """A model of another contract than the default's, for `AnyFakeBackend`: its signatures
    (typed), what each answers (`run(signature_name, inputs) -> outputs`) and its class
    labels (labels.txt's, or what the backend falls back to)."""

    signatures: dict[str, SignatureSpec]
    run: Callable[[str, dict[str, np.ndarray]], dict[str, np.ndarray]]
    labels: tuple[str, ...] = ()
    version: int = 1


class AnyFakeBackend(FakeBackend):
    """The default model's toy (FakeBackend) and, beside it, `FakeModel`s by name: each
    checks a request's inputs against its signature as the in-process backend would (names,
    dtypes) and answers what its `run` computes.

    Attributes:
        inputs: (model, signature name, inputs) of every call to the other models.
    """

    def __init__(self, models: dict[str, FakeModel], versions=(1,)):
        super().__init__(versions)
        self.models = models
        self.inputs: list[tuple[str, str, dict[str, np.ndarray]]] = []

    def model_names(self) -> list[str]:
        return [self.model_name, *self.models]

    def serving_version(self, name: str) -> int | None:
        if name in self.models:
            return self.models[name].version if self.started else None
        return super().serving_version(name)

    def version_labels(self, name: str) -> dict[str, int]:
        return {} if name in self.models else super().version_labels(name)

    def class_labels(self, name: str, version: int) -> tuple[str, ...]:
        return (
            self.models[name].labels if name in self.models else super().class_labels(name, version)
        )

    def model_dir(self, name: str) -> Path:
        return self.base_path / name if name in self.models else super().model_dir(name)

    async def model_status(self, name, version, label=None) -> list[VersionStatus]:
        if name in self.models:
            return [VersionStatus(self.models[name].version, VersionState.AVAILABLE)]
        return await super().model_status(name, version, label)

    async def metadata(self, name, version, label=None) -> ModelMetadata:
        model = self.models.get(name)
        if model is None:
            return await super().metadata(name, version, label)
        if version not in (None, model.version) or label is not None:
            raise NotFound(servable_not_found(name, version))
        return ModelMetadata(name, model.version, struct_pb2.Struct(), model.signatures)

    async def predict(self, name, images, version=None, signature_name=SIGNATURE_NAME, label=None):
        model = self.models.get(name)
        if model is None:
            return await super().predict(name, images, version, signature_name, label)
        signature = model.signatures.get(signature_name)
        if signature is None:
            raise SignatureNotFound(signature_name, model.signatures)
        inputs = images if isinstance(images, dict) else {signature.inputs[0].name: images}
        for spec in signature.inputs:
            value = inputs[spec.name]
            assert value.dtype == spec.dtype, (spec, value.dtype)
            assert len(value.shape) == len(spec.shape), (spec, value.shape)
        self.inputs.append((name, signature_name, inputs))
        return Prediction(model.version, model.run(signature_name, inputs))


class GatedFakeBackend(FakeBackend):
    """Holds every model call until `gate` (a threading.Event, so a test's own thread can open
    it while the server runs on another) is set; records batch sizes; can fail one call."""

    def __init__(self, versions=(1,)):
        super().__init__(versions)
        self.gate = threading.Event()
        self.gate.set()
        self.calls_started = 0
        self.sizes: list[int] = []
        self.fail_call: int | None = None  # 1-based number of the call to fail

    async def predict(self, name, images, version=None, signature_name=SIGNATURE_NAME, label=None):
        self.calls_started += 1
        call = self.calls_started
        await asyncio.get_running_loop().run_in_executor(None, self.gate.wait)
        self.sizes.append(len(images))
        if call == self.fail_call:
            raise UpstreamError("injected failure of this batch")
        return await super().predict(name, images, version, signature_name, label)


class FakeLoader:
    """The registry's Loader over folders whose saved_model.pb says "good" or anything else.

    A load waits for `release` when one is given (to hold versions in LOADING); every load
    and unload is recorded in order.
    """

    def __init__(self):
        self.loads: list[int] = []
        self.unloads: list[int] = []
        self.release: asyncio.Event | None = None

    async def load(self, version: int, path: Path):
        self.loads.append(version)
        if self.release is not None:
            await self.release.wait()
        content = (path / "saved_model.pb").read_text()
        if content != "good":
            raise ValueError(f"not a SavedModel: {content!r}")
        return f"model-{version}"

    async def unload(self, servable) -> None:
        self.unloads.append(int(servable.split("-")[1]))


def write_version(model_dir: Path, version: int | str, content: str = "good") -> Path:
    """A version folder as the registry lists it (a saved_model.pb holding `content`)."""
    path = Path(model_dir) / str(version)
    path.mkdir(parents=True, exist_ok=True)
    (path / "saved_model.pb").write_text(content)
    return path


# The Host Starlette's TestClient sends.
TESTCLIENT_HOST = "testserver"


@contextlib.contextmanager
def app_client(backend: Backend, serve_grpc: bool = False, **settings) -> Iterator[TestClient]:
    """Starlette's TestClient on the real app over a fake backend (lifespan included; with
    serve_grpc, the gRPC server too, on the TestClient's event loop, at settings' grpc_port).
    `client.app` is the Service (service/app.py)."""
    defaults = {"model_name": backend.model_name, "max_images": 16, "max_body_bytes": 200_000}
    if "allowed_hosts" not in settings and is_loopback(settings.get("host", "127.0.0.1")):
        # On loopback only loopback names are answered for (DNS rebinding): TestClient's
        # requests name `testserver`.
        defaults["allowed_hosts"] = TESTCLIENT_HOST
    app = create_app(Settings(**{**defaults, **settings}), backend, serve_grpc=serve_grpc)
    app.dataplane.traffic._random.seed(0)
    with TestClient(app) as client:
        yield client


WAIT_SECONDS = 30.0


def wait_until(condition, what: str, timeout: float = WAIT_SECONDS) -> None:
    """Wait for a condition another thread makes true (bounded; not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@contextlib.contextmanager
def threaded_server(app, settings: Settings | None = None) -> Iterator[tuple[str, object]]:
    """A real server for `app` in a thread of the test process, configured as the service
    configures it (service/server.py) from `settings` (the app's, or the defaults) on a free
    loopback port; (url, the server). Stopped, and its thread joined, on exit."""
    from support.servers import free_port

    settings = (settings or Settings()).model_copy(
        update={"host": "127.0.0.1", "port": free_port()}
    )
    server = granian_server(app, settings)
    loop = uvloop.new_event_loop()  # the service's loop (service/server.py)
    failed: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.serve())
        except BaseException as err:  # noqa: BLE001 - told to the test below
            failed.append(err)
        finally:
            loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    scheme = "https" if settings.tls_cert_file else "http"
    url = f"{scheme}://127.0.0.1:{settings.port}"
    try:
        wait_until(lambda: failed or not thread.is_alive() or _accepts(settings.port),
                   "the server to start")  # fmt: skip
        assert thread.is_alive() and not failed, f"the server did not start: {failed}"
        yield url, server
    finally:
        if thread.is_alive():
            loop.call_soon_threadsafe(server.stop)
        thread.join(WAIT_SECONDS)


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False
