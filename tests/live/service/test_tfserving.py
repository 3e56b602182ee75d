"""BACKEND=tfserving end to end: the real service in front of a TF Serving stand-in.

Two real `python -m service` processes serve the same model repository: one forwards to the
gRPC stand-in (tests/support/tfserving_standin.py: TF Serving's protos over the real
SavedModel, because TF Serving's binary cannot be installed here), the other runs the model
in-process. Every endpoint must answer both the same; gRPC errors must map to HTTP the way
TF Serving maps them; an outage of the upstream must turn into 503s and heal by itself.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pytest
from support.helpers import error_message, png_bytes
from support.servers import MODEL_NAME, Server, add_version, copy_repository, free_port, wait_for
from support.tfserving_standin import TFServingStandIn

from artifact import idx as data
from artifact.model_config import shortcut
from service.backends.tfserving import MAX_MESSAGE_BYTES, TFServingBackend
from service.errors import BadInput, NotFound, NotReady, UpstreamTimeout

MODEL = f"/v1/models/{MODEL_NAME}"
PREDICT = f"{MODEL}:predict"
# Generous for the servers under test (a loaded machine must not turn a call into a 504); the
# deadline test uses its own short one.
DEADLINE_SECONDS = 30.0
SHORT_DEADLINE_SECONDS = 1.0

# TF Serving's own gRPC -> HTTP mapping (model_servers/http_server.cc), written out here
# independently of the table under test.
TF_SERVING_HTTP_STATUS = {
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}


# --- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def repository(trained_model, tmp_path_factory):
    """A private copy of the trained model repository, shared by the stand-in and both servers."""
    return copy_repository(trained_model, tmp_path_factory.mktemp("tfserving-repo"))


@pytest.fixture(scope="module")
def standin(repository) -> Iterator[TFServingStandIn]:
    server = TFServingStandIn(repository, MODEL_NAME).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def servers(repository, standin, tmp_path_factory) -> Iterator[tuple[Server, Server]]:
    """(BACKEND=tfserving server, in-process server), started side by side."""
    root = tmp_path_factory.mktemp("tfserving-servers")
    started = [
        Server(
            root / "tfserving.log",
            MODEL_BASE_PATH=str(repository),
            BACKEND="tfserving",
            TFSERVING_GRPC_ADDRESS=standin.address,
            TFSERVING_DEADLINE_SECONDS=str(DEADLINE_SECONDS),
        ),
        Server(root / "inprocess.log", MODEL_BASE_PATH=str(repository), BACKEND="tensorflow"),
    ]
    try:
        for server in started:
            server.wait_until("/readyz")
        yield started[0], started[1]
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="module")
def remote(servers) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=servers[0].url, timeout=60.0) as client:
        yield client


@pytest.fixture(scope="module")
def local(servers) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=servers[1].url, timeout=60.0) as client:
        yield client


@pytest.fixture(scope="module")
def pixels(trained_model) -> np.ndarray:
    """4 real Fashion-MNIST test images, uint8 [4, 28, 28]."""
    _, images, _ = data.load_split(trained_model.data_dir, "test")
    return images[:4]


# --- the same JSON from both backends -----------------------------------------------------


def _requests(pixels: np.ndarray) -> dict[str, tuple[str, str, dict]]:
    floats = (pixels / 255.0).tolist()
    png = base64.b64encode(png_bytes(pixels[0])).decode("ascii")
    return {
        "status": ("GET", MODEL, {}),
        "version status": ("GET", f"{MODEL}/versions/1", {}),
        "metadata": ("GET", f"{MODEL}/metadata", {}),
        "version metadata": ("GET", f"{MODEL}/versions/1/metadata", {}),
        "predict rows": ("POST", PREDICT, {"json": {"instances": floats}}),
        "predict named rows": (
            "POST",
            PREDICT,
            {"json": {"instances": [{"image": image} for image in floats[:2]]}},
        ),
        "predict columns": ("POST", PREDICT, {"json": {"inputs": {"image": floats}}}),
        "predict version, classify signature": (
            "POST",
            f"{MODEL}/versions/1:predict",
            {"json": {"signature_name": "classify", "inputs": floats[:3]}},
        ),
        "friendly pixels": ("POST", "/predict", {"json": {"instances": pixels.tolist()}}),
        "friendly base64": ("POST", "/predict", {"json": {"instances": [{"b64": png}]}}),
        "friendly upload": (
            "POST",
            "/predict",
            {
                "files": [
                    ("files", (f"{i}.png", png_bytes(p), "image/png"))
                    for i, p in enumerate(pixels[:2])
                ]
            },
        ),
    }


REQUESTS = list(_requests(np.zeros((4, 28, 28), np.uint8)))


@pytest.mark.parametrize("name", REQUESTS)
def test_every_endpoint_answers_as_the_in_process_backend(name, remote, local, pixels, standin):
    method, path, kwargs = _requests(pixels)[name]
    expected = local.request(method, path, **kwargs)
    got = remote.request(method, path, **kwargs)
    assert expected.status_code == 200, expected.text
    assert got.status_code == 200, got.text
    assert got.headers["content-type"] == expected.headers["content-type"]
    if "metadata" in name:
        # Where the model runs is the one thing that differs.
        got_body, expected_body = got.json(), expected.json()
        assert got_body.pop("device") == f"tfserving:{standin.address}"
        assert expected_body.pop("device") == "/CPU:0"
        assert got_body == expected_body
    else:
        assert got.json() == expected.json()
        # Byte for byte: same keys in the same order, same numbers. (Not for metadata: the
        # order of a protobuf map, the signature_def map there, means nothing.)
        assert got.content == expected.content


def test_predictions_are_not_trivial(remote, pixels):
    """Guards the comparison above: a constant answer on both sides would also be equal."""
    rows = remote.post(PREDICT, json={"instances": (pixels / 255.0).tolist()}).json()
    probabilities = np.array([row["probabilities"] for row in rows["predictions"]])
    assert probabilities.shape == (4, 10)
    assert np.abs(probabilities[0] - probabilities[1]).max() > 1e-3


def test_readyz_reports_tfserving_as_the_device(remote, local, standin):
    expected = local.get("/readyz").json()
    got = remote.get("/readyz").json()
    assert got == {**expected, "device": f"tfserving:{standin.address}"}


ERRORS = {
    # name: (method, path, request kwargs, the messages are the same on both backends)
    "unknown model status": ("GET", "/v1/models/nope", {}, True),
    "unknown version status": ("GET", f"{MODEL}/versions/7", {}, True),
    "unknown model metadata": ("GET", "/v1/models/nope/metadata", {}, True),
    "unknown version metadata": ("GET", f"{MODEL}/versions/7/metadata", {}, True),
    "unknown model predict": (
        "POST",
        "/v1/models/nope:predict",
        {"json": {"instances": [[[0.0] * 28] * 28]}},
        True,
    ),
    "unknown version predict": (
        "POST",
        f"{MODEL}/versions/7:predict",
        {"json": {"instances": [[[0.0] * 28] * 28]}},
        True,
    ),
    "unknown signature": (
        "POST",
        PREDICT,
        {"json": {"signature_name": "nope", "instances": [[[0.0] * 28] * 28]}},
        False,
    ),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_client_errors_answer_as_the_in_process_backend(name, remote, local):
    method, path, kwargs, same_message = ERRORS[name]
    expected = local.request(method, path, **kwargs)
    got = remote.request(method, path, **kwargs)
    assert expected.status_code in (400, 404), expected.text
    message = error_message(got, expected.status_code)
    if same_message:
        assert message == error_message(expected, expected.status_code)


# --- gRPC errors, deadlines and outages ---------------------------------------------------


@pytest.mark.parametrize("code", list(TF_SERVING_HTTP_STATUS), ids=lambda code: code.name)
def test_grpc_status_maps_to_http_as_tf_serving_does(code, remote, standin):
    calls = standin.predict_calls
    standin.fail_next(code, f"injected {code.name}")
    response = remote.post(PREDICT, json={"instances": [[[0.0] * 28] * 28]})
    message = error_message(response, TF_SERVING_HTTP_STATUS[code])
    assert f"injected {code.name}" in message
    # Only the one call failed.
    assert remote.post(PREDICT, json={"instances": [[[0.0] * 28] * 28]}).status_code == 200
    assert standin.predict_calls == calls + 2


def test_a_slow_answer_is_a_gateway_timeout(standin, repository):
    # A status injected as DEADLINE_EXCEEDED maps to 504 above; here the deadline itself fires.
    standin.delay_next(SHORT_DEADLINE_SECONDS + 5)

    async def work(backend):
        try:
            await backend.predict(MODEL_NAME, np.zeros((1, 28, 28), np.float32))
        except UpstreamTimeout as err:
            return err
        return None

    error = run_with_backend(standin.address, repository, work, SHORT_DEADLINE_SECONDS)
    assert isinstance(error, UpstreamTimeout) and error.status == 504
    assert f"did not answer Predict within {SHORT_DEADLINE_SECONDS:g} s" in error.message


def test_outage_gives_503_and_heals_without_a_restart(servers, remote, local, standin, pixels):
    server = servers[0]
    body = {"instances": (pixels / 255.0).tolist()}
    try:
        standin.stop()
        wait_for(lambda: remote.get("/readyz").status_code == 503, "/readyz to say 503", server)
        readyz = error_message(remote.get("/readyz"), 503)
        assert f"TensorFlow Serving at {standin.address}" in readyz
        message = error_message(remote.post(PREDICT, json=body), 503)
        assert f"TensorFlow Serving at {standin.address} is unavailable" in message
        error_message(remote.post("/predict", json={"instances": pixels[:1].tolist()}), 503)
    finally:
        standin.start()
    wait_for(lambda: remote.get("/readyz").status_code == 200, "/readyz to heal", server)
    assert server.process.poll() is None
    got = remote.post(PREDICT, json=body)
    assert got.status_code == 200, got.text
    assert got.json() == local.post(PREDICT, json=body).json()


# --- the backend on its own ---------------------------------------------------------------


def run_with_backend(address: str, base_path, work, deadline: float = DEADLINE_SECONDS):
    """Start a TFServingBackend on a fresh loop, await work(backend), close it."""

    async def main():
        backend = TFServingBackend(shortcut(MODEL_NAME, base_path), address, deadline)
        await backend.start()
        try:
            return await work(backend)
        finally:
            await backend.close()

    return asyncio.run(main())


def test_a_batch_over_grpcs_default_4_mib_goes_through(standin, repository):
    images = np.random.default_rng(0).random((1500, 28, 28), dtype=np.float32)
    assert images.nbytes > 4 * 1024 * 1024 and MAX_MESSAGE_BYTES >= 64 * 1024 * 1024

    async def work(backend):
        return await backend.predict(MODEL_NAME, images)

    prediction = run_with_backend(standin.address, repository, work)
    assert prediction.version == 1
    assert prediction.outputs["classes"].shape == (1500,)
    assert prediction.outputs["probabilities"].shape == (1500, 10)


def test_wrong_input_shape_and_unknown_version_are_client_errors(standin, repository):
    async def work(backend):
        errors = []
        for call in (
            backend.predict(MODEL_NAME, np.zeros((2, 27, 27), np.float32)),
            backend.predict(MODEL_NAME, np.zeros((1, 28, 28), np.float32), version=7),
        ):
            try:
                await call
            except (BadInput, NotFound) as err:
                errors.append(err)
        return errors

    shape, version = run_with_backend(standin.address, repository, work)
    assert isinstance(shape, BadInput) and "[2, 27, 27]" in shape.message
    assert isinstance(shape.__cause__, grpc.aio.AioRpcError)
    assert isinstance(version, NotFound)
    assert version.message == f"Servable not found for request: Specific({MODEL_NAME}, 7)"


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda b: b.model_status(MODEL_NAME, None), id="GetModelStatus"),
        pytest.param(lambda b: b.metadata(MODEL_NAME, None), id="GetModelMetadata"),
        pytest.param(
            lambda b: b.predict(MODEL_NAME, np.zeros((1, 28, 28), np.float32)), id="Predict"
        ),
    ],
)
def test_a_call_before_start_is_not_ready(tmp_path, call):
    backend = TFServingBackend(shortcut(MODEL_NAME, tmp_path), f"127.0.0.1:{free_port()}", 1.0)
    with pytest.raises(NotReady, match="not connected to TensorFlow Serving at 127.0.0.1:"):
        asyncio.run(call(backend))


def test_not_ready_while_tf_serving_is_unreachable_or_has_no_version(tmp_path):
    async def state(backend):
        return backend.serving_version(MODEL_NAME) is not None, backend.not_ready_reason(MODEL_NAME)

    address = f"127.0.0.1:{free_port()}"
    ready, reason = run_with_backend(address, tmp_path, state)
    assert not ready
    assert f"TensorFlow Serving at {address} is unavailable" in reason

    empty = TFServingStandIn(tmp_path, MODEL_NAME).start()
    try:
        ready, reason = run_with_backend(empty.address, tmp_path, state)
    finally:
        empty.stop()
    assert not ready
    assert reason == (
        f"TensorFlow Serving at {empty.address}: Could not find any versions of model {MODEL_NAME}"
    )


def test_versions_newest_available_first_and_readiness_follows_the_states(trained_model, tmp_path):
    base = copy_repository(trained_model, tmp_path)
    add_version(base / MODEL_NAME, "1", "2")
    two = TFServingStandIn(base, MODEL_NAME).start()

    async def work(backend):
        latest = await backend.predict(MODEL_NAME, np.zeros((1, 28, 28), np.float32))
        pinned = await backend.predict(MODEL_NAME, np.zeros((1, 28, 28), np.float32), 1)
        statuses = await backend.model_status(MODEL_NAME, None)
        two.states[2] = "LOADING"
        loading = await backend.model_status(MODEL_NAME, None)
        still_ready = await backend.check_status()
        two.states[1] = "END"
        ready = await backend.check_status()
        reason = backend.not_ready_reason(MODEL_NAME)
        return latest.version, pinned.version, statuses, loading, still_ready, ready, reason

    try:
        latest, pinned, statuses, loading, still_ready, ready, reason = run_with_backend(
            two.address, base, work
        )
    finally:
        two.stop()
    assert (latest, pinned) == (2, 1)
    assert [(s.version, s.state.name) for s in statuses] == [(2, "AVAILABLE"), (1, "AVAILABLE")]
    assert (statuses[0].error_code, statuses[0].error_message) == ("OK", "")
    # The versions answering come first, newest first, as the in-process backend lists them.
    assert [(s.version, s.state.name) for s in loading] == [(1, "AVAILABLE"), (2, "LOADING")]
    assert still_ready and not ready
    assert reason == (
        f"TensorFlow Serving at {two.address} has no AVAILABLE version of {MODEL_NAME} "
        "(version 2: LOADING, version 1: END)"
    )
