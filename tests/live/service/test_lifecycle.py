"""The service's life: start-up failures, an empty repository, new and broken versions, shutdown.

Each scenario runs its own `python -m service` on a private copy of the model repository.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from support.servers import (
    MODEL_NAME,
    Server,
    add_version,
    copy_repository,
    run_service,
    start_server,
    wait_for,
)

from artifact import idx as data
from artifact.contract import FASHION_MNIST_LABELS

MODEL = f"/v1/models/{MODEL_NAME}"


def statuses(client: httpx.Client) -> dict[str, dict]:
    """GET /v1/models/<name> as {version: entry}."""
    response = client.get(MODEL)
    assert response.status_code == 200, response.text
    entries = response.json()["model_version_status"]
    return {entry["version"]: entry for entry in entries}


def state_of(client: httpx.Client, version: str) -> str | None:
    """A version's state in the model status (LOADING is listed too, as TF Serving does)."""
    return statuses(client).get(version, {}).get("state")


def served_version(client: httpx.Client, image: list) -> str:
    """The version that answers a request naming none (the friendly /predict reports it)."""
    response = client.post("/predict", json={"instances": [image]})
    assert response.status_code == 200, response.text
    return response.json()["model_version"]


def probabilities(client: httpx.Client, path: str, images: list) -> np.ndarray:
    response = client.post(path, json={"instances": images})
    assert response.status_code == 200, response.text
    return np.array([row["probabilities"] for row in response.json()["predictions"]])


def gauge(client: httpx.Client) -> str:
    """The model_version gauge's sample line."""
    text = client.get("/metrics").text
    lines = [line for line in text.splitlines() if line.startswith("model_version{")]
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture(scope="module")
def images(trained_model) -> tuple[list, list]:
    """Two real test images: as integer pixels (for /predict) and as floats (for :predict)."""
    _, pixels, _ = data.load_split(trained_model.data_dir, "test")
    return pixels[:2].tolist(), (pixels[:2] / 255.0).tolist()


@pytest.fixture
def repository(trained_model, tmp_path) -> Path:
    """A private copy of the model repository; returns <copy>/fashion_mnist."""
    return copy_repository(trained_model, tmp_path) / MODEL_NAME


@pytest.fixture
def launch(tmp_path) -> Iterator[Callable[..., Server]]:
    """Start servers for one test; all are stopped at its end."""
    started: list[Server] = []

    def start(wait_for: str = "/readyz", **settings: str) -> Server:
        server = start_server(tmp_path / f"server{len(started)}.log", wait_for, **settings)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


# --- start-up failures --------------------------------------------------------------------


def test_device_gpu_without_a_gpu_exits_2_with_one_line(trained_model):
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("it checks the start-up failure on a machine without a GPU; this one has one")
    env = {"DEVICE": "gpu", "MODEL_BASE_PATH": str(trained_model.export_base.parent)}
    # What a person sees: TensorFlow's own C++ logging left at its default level.
    result = run_service(TF_CPP_MIN_LOG_LEVEL="0", **env)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "GPU" in lines[0]
    assert "Listening on" not in result.stdout + result.stderr


# --- a broken newest version at start ------------------------------------------------------


def write_broken_version(model_dir: Path, version: str) -> None:
    staging = model_dir / f".staging-{version}"
    staging.mkdir()
    (staging / "saved_model.pb").write_bytes(b"this is not a SavedModel")
    staging.rename(model_dir / version)


def test_a_broken_newest_version_at_start_does_not_stop_the_newest_good_one(
    launch, repository, images
):
    """Without polling, the service used to answer 503 "the model is loading" forever."""
    ints, _ = images
    write_broken_version(repository, "2")
    server = launch(MODEL_BASE_PATH=str(repository.parent), MODEL_POLL_SECONDS="0")
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get("/readyz").json()["version"] == "1"
        assert served_version(client, ints[0]) == "1"
        assert statuses(client)["2"]["state"] == "END"


def test_when_every_version_is_broken_readiness_names_the_failure(launch, repository):
    shutil.rmtree(repository / "1")
    write_broken_version(repository, "1")
    server = launch(
        wait_for="/healthz", MODEL_BASE_PATH=str(repository.parent), MODEL_POLL_SECONDS="0"
    )
    with httpx.Client(base_url=server.url, timeout=30) as client:
        response = wait_for(
            lambda: (r := client.get("/readyz")).status_code == 503 and "failed" in r.text and r,
            "readyz to name the failure",
            server,
        )
        message = response.json()["error"]
        assert message.startswith(f"not ready: no version of {MODEL_NAME} loads; version 1 failed")


# --- an empty repository ------------------------------------------------------------------


def test_empty_repository_not_ready_until_a_version_appears(
    launch, trained_model, tmp_path, images
):
    base = tmp_path / "empty-models"
    base.mkdir()
    server = launch(wait_for="/healthz", MODEL_BASE_PATH=str(base), MODEL_POLL_SECONDS="0.2")
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert set(ready.json()) == {"error"}
        # It names the model's folder, not where the server keeps it.
        assert ready.json()["error"] == f"not ready: no version under {MODEL_NAME}"
        assert client.get(MODEL).status_code == 404
        assert client.get(f"{MODEL}/metadata").status_code == 503
        predict = client.post(f"{MODEL}:predict", json={"instances": images[1]})
        assert predict.status_code == 503 and "error" in predict.json()
        assert client.post("/predict", json={"instances": images[0]}).status_code == 503
        assert "model_version{" not in client.get("/metrics").text

        # An export lands: the poller loads it and the service becomes ready.
        (base / MODEL_NAME).mkdir()
        shutil.copytree(trained_model.version_path, base / MODEL_NAME / ".staging")
        (base / MODEL_NAME / ".staging").rename(base / MODEL_NAME / "1")
        wait_for(lambda: client.get("/readyz").status_code == 200, "readyz 200", server)
        assert client.get("/readyz").json()["version"] == "1"
        assert served_version(client, images[0][0]) == "1"

    # SIGTERM: a graceful shutdown, exit 0, no error logged.
    assert server.stop() == 0
    log = server.log()
    assert "Shut down: the models" in log and "Stopped serving on" in log
    assert "Traceback" not in log and " ERROR " not in log


# --- versions -----------------------------------------------------------------------------


def test_new_version_swapped_in_and_broken_version_ignored(launch, repository, images):
    ints, floats = images
    server = launch(MODEL_BASE_PATH=str(repository.parent), MODEL_POLL_SECONDS="0.2")
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert list(statuses(client)) == ["1"]
        before = probabilities(client, f"{MODEL}/versions/1:predict", floats)

        # TF Serving's default policy, latest 1: version 2 replaces 1 once it is AVAILABLE.
        add_version(repository, "1", "2")
        wait_for(
            lambda: (
                {v: s["state"] for v, s in statuses(client).items()}
                == {"2": "AVAILABLE", "1": "END"}
            ),
            "version 2 serving, 1 unloaded",
            server,
        )
        # TF Serving keeps listing an unloaded version: END, error code OK.
        unloaded = client.get(f"{MODEL}/versions/1")
        assert unloaded.status_code == 200, unloaded.text
        assert unloaded.json()["model_version_status"] == [
            {"version": "1", "state": "END", "status": {"error_code": "OK", "error_message": ""}}
        ]
        assert client.get("/readyz").json()["version"] == "2"
        assert served_version(client, ints[0]) == "2"
        assert 'model="fashion_mnist"' in gauge(client) and gauge(client).endswith(" 2.0")
        # Version 2 is a copy of 1: the same answers.
        np.testing.assert_allclose(
            probabilities(client, f"{MODEL}:predict", floats), before, atol=1e-6
        )
        gone = client.post(f"{MODEL}/versions/1:predict", json={"instances": floats})
        assert gone.status_code == 404
        assert gone.json()["error"] == f"Servable not found for request: Specific({MODEL_NAME}, 1)"

        # A broken export (garbage saved_model.pb) must not replace the serving version.
        write_broken_version(repository, "3")
        wait_for(lambda: state_of(client, "3") == "END", "version 3 in state END", server)
        status = statuses(client)["3"]
        assert status["status"]["error_code"] != "OK"
        assert status["status"]["error_message"]
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["version"] == "2"
        assert served_version(client, ints[0]) == "2"
        assert state_of(client, "2") == "AVAILABLE"
        named = client.post(f"{MODEL}/versions/3:predict", json={"instances": floats})
        assert named.status_code == 404
        assert client.get(f"{MODEL}/versions/3").json()["model_version_status"] == [status]

        # The poller goes on (a good version 4 past the broken one is picked up) but does not
        # retry, and re-log, the failed version 3.
        add_version(repository, "1", "4")
        wait_for(lambda: served_version(client, ints[0]) == "4", "version 4 to serve", server)
        failures = [line for line in server.log().splitlines() if "version 3 failed" in line]
        assert len(failures) == 1, failures


def test_without_polling_a_new_version_is_not_picked_up(launch, repository, images):
    ints, floats = images
    server = launch(MODEL_BASE_PATH=str(repository.parent), MODEL_POLL_SECONDS="0")
    with httpx.Client(base_url=server.url, timeout=30) as client:
        add_version(repository, "1", "2")
        named = client.post(f"{MODEL}/versions/2:predict", json={"instances": floats})
        assert named.status_code == 404
        assert {v: s["state"] for v, s in statuses(client).items()} == {"1": "AVAILABLE"}
        assert served_version(client, ints[0]) == "1"
        assert client.get("/readyz").json()["version"] == "1"
        assert gauge(client).endswith(" 1.0")


def test_a_deleted_version_is_unloaded_and_the_newest_left_serves(launch, repository, images):
    ints, floats = images
    server = launch(MODEL_BASE_PATH=str(repository.parent), MODEL_POLL_SECONDS="0.2")
    with httpx.Client(base_url=server.url, timeout=30) as client:
        before = probabilities(client, f"{MODEL}:predict", floats)
        add_version(repository, "1", "2")
        wait_for(lambda: served_version(client, ints[0]) == "2", "version 2 to serve", server)

        # Rolling back by deleting the bad version: TF Serving's latest policy does the same.
        shutil.rmtree(repository / "2")
        wait_for(lambda: state_of(client, "2") == "END", "version 2 to be unloaded", server)
        wait_for(lambda: state_of(client, "1") == "AVAILABLE", "version 1 back", server)
        # Unloaded, and still listed, as TF Serving lists it.
        assert {v: s["state"] for v, s in statuses(client).items()} == {
            "1": "AVAILABLE",
            "2": "END",
        }
        assert served_version(client, ints[0]) == "1"
        assert client.get("/readyz").json()["version"] == "1"
        assert client.get(f"{MODEL}/metadata").json()["model_spec"]["version"] == "1"
        (gone,) = client.get(f"{MODEL}/versions/2").json()["model_version_status"]
        assert gone["state"] == "END" and gone["status"]["error_code"] == "OK"
        answer = client.post("/predict", json={"instances": [ints[0]]}).json()
        assert answer["predictions"][0]["label"] in FASHION_MNIST_LABELS
        np.testing.assert_allclose(
            probabilities(client, f"{MODEL}:predict", floats), before, atol=1e-6
        )

        # Every version gone: not ready, and ready again when one comes back.
        moved = repository.parent / "kept"
        (repository / "1").rename(moved)
        wait_for(lambda: client.get("/readyz").status_code == 503, "readyz 503", server)
        moved.rename(repository / "1")
        wait_for(lambda: client.get("/readyz").status_code == 200, "readyz 200 again", server)
