"""The model the repository ships (models/shipped/, what `make serve` serves while no version
is exported; models/README.md): the service answers the whole Fashion-MNIST test set as the
evaluation recorded at its export says, answers the README's sample as the README shows, and
a trained version put beside it takes over, as `make train`'s does."""

from __future__ import annotations

import itertools
import json
import re
import shutil
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf
from support.helpers import REPO_ROOT, ok_json
from support.servers import MODEL_NAME, Server, start_server, wait_for
from support.tfserving_requests import predict_request
from tensorflow_serving.apis import prediction_service_pb2_grpc

from artifact import idx
from artifact.contract import (
    ASSETS_EXTRA,
    CLASSES_KEY,
    FASHION_MNIST_LABELS,
    LABELS_FILE,
    NUM_CLASSES,
    PROBABILITIES_KEY,
    REPORT_FILE,
    normalize_pixels,
)

SHIPPED = REPO_ROOT / "models" / "shipped"
VERSION = SHIPPED / MODEL_NAME / "1"
REPORT = json.loads((VERSION / ASSETS_EXTRA / REPORT_FILE).read_text())
# Images per Predict call: 3.1 MB of float32, under the service's 8 MB gRPC message limit.
BATCH = 1000
# The largest difference between two of TF's CPU kernels' probabilities for one test image
# (oneDNN on and off), measured over the 10,000 test images: 2.1457672e-06.
KERNEL_ROUNDING = 2.2e-6


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    """The service on a copy of the shipped repository (a test adds a version to it), as
    `make serve` serves it: gRPC on, polling for new versions."""
    root = tmp_path_factory.mktemp("shipped")
    base = root / "models"
    shutil.copytree(SHIPPED, base)
    srv = start_server(
        root / "server.log",
        grpc=True,
        MODEL_BASE_PATH=str(base),
        MAX_IMAGES=str(BATCH),
        MODEL_POLL_SECONDS="0.2",
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def test_set_answers(server, real_data_dir) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(true labels, classes, probabilities) of the 10,000 test images, as the service answers
    TF Serving's gRPC Predict, the pixels scaled as training scaled them."""
    _, images, labels = idx.load_split(real_data_dir, "test")
    classes, probabilities = [], []
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for start in range(0, len(images), BATCH):
            batch = normalize_pixels(images[start : start + BATCH])
            answer = stub.Predict(predict_request(batch), timeout=120)
            classes.append(tf.make_ndarray(answer.outputs[CLASSES_KEY]))
            probabilities.append(tf.make_ndarray(answer.outputs[PROBABILITIES_KEY]))
    return labels, np.concatenate(classes), np.concatenate(probabilities)


def test_the_shipped_model_is_the_one_models_readme_records():
    assert (VERSION / ASSETS_EXTRA / LABELS_FILE).read_text().splitlines() == list(
        FASHION_MNIST_LABELS
    )
    assert REPORT["examples"] == 10_000 and REPORT["split"] == "test"
    assert REPORT["data_dir"] == "/usr/share/datasets/fashion-mnist"
    readme = (REPO_ROOT / "models" / "README.md").read_text()
    assert f"test accuracy **{REPORT['accuracy']:.4f}**" in readme


def confusion_matrix(labels: np.ndarray, classes: np.ndarray) -> list[list[int]]:
    counts = np.zeros((NUM_CLASSES, NUM_CLASSES), dtype=np.int64)
    np.add.at(counts, (labels.astype(np.int64), classes.astype(np.int64)), 1)
    return counts.tolist()


def test_it_answers_the_test_set_as_its_recorded_evaluation_says(test_set_answers):
    """The trainer's TensorFlow (2.15) evaluated it at export; the service's (2.21) must give
    every test image the class that evaluation counted: the same confusion matrix, so the
    same accuracy.

    Except for a tie, which float32 rounding decides. Measured here on the 10,000 images: TF
    2.15 and 2.21 give the same probabilities bit for bit (oneDNN on, both's default on this
    CPU); with oneDNN off (TF_ENABLE_ONEDNN_OPTS=0) they move by up to 2.2e-6, and one image,
    6742, changes class: its two most probable classes (T-shirt/top and Shirt, 0.49795 each)
    are 4.8e-7 apart with oneDNN and equal without. The next closest two are more than 1e-3
    apart. So an image whose top two are closer than twice 2.2e-6 may count for either of
    them; every other one must match.
    """
    labels, classes, probabilities = test_set_answers
    assert classes.shape == labels.shape == (10_000,)
    assert probabilities.shape == (10_000, NUM_CLASSES)
    np.testing.assert_array_equal(classes, probabilities.argmax(axis=1))
    top_two = np.argsort(probabilities, axis=1)[:, -2:]
    sorted_probabilities = np.sort(probabilities, axis=1)
    gaps = sorted_probabilities[:, -1] - sorted_probabilities[:, -2]
    ties = np.flatnonzero(gaps < 2 * KERNEL_ROUNDING)
    assert len(ties) <= 3, f"{len(ties)} near-ties, measured 1: {ties.tolist()}"
    matches = []
    for choice in itertools.product((0, 1), repeat=len(ties)):
        counted = classes.copy()
        for image, pick in zip(ties, choice, strict=True):
            counted[image] = top_two[image, pick]
        if confusion_matrix(labels, counted) == REPORT["confusion_matrix"]:
            matches.append(counted)
    assert matches, (
        f"the service's confusion matrix {confusion_matrix(labels, classes)} is not the "
        f"recorded {REPORT['confusion_matrix']} (near-ties {ties.tolist()})"
    )
    assert round(float((matches[0] == labels).mean()), 4) == REPORT["accuracy"]


def readme_answer(command: str) -> dict:
    """The JSON answer the README shows right after the line holding `command`."""
    text = (REPO_ROOT / "README.md").read_text()
    after = text.split(command, 1)[1]
    block = re.search(r"```json\n(.*?)\n```", after, re.DOTALL)
    assert block is not None, f"no answer after {command!r} in the README"
    return json.loads(block.group(1))


def test_it_answers_the_readme_sample_as_the_readme_shows(server):
    shown = readme_answer("curl -s localhost:8000/v1/models/fashion_mnist:predict")
    body = json.loads((REPO_ROOT / "examples" / "predict.json").read_text())
    with httpx.Client(base_url=server.url, timeout=60.0) as client:
        answer = ok_json(client.post(f"/v1/models/{MODEL_NAME}:predict", json=body))
    assert answer["model_version"] == shown["model_version"] == "1"
    ((got,), (expected,)) = answer["predictions"], shown["predictions"]
    assert got[CLASSES_KEY] == expected[CLASSES_KEY]
    # The README prints this machine's float32 answer; another CPU's kernels may round it
    # differently in the last bits.
    np.testing.assert_allclose(got[PROBABILITIES_KEY], expected[PROBABILITIES_KEY], rtol=1e-5)


def test_a_trained_version_beside_it_takes_over(tmp_path, trained_model):
    """`make train` exports the next version into the same folder: the running service
    serves it without a restart (the shipped model's signatures are every trained one's)."""
    base = tmp_path / "models"
    shutil.copytree(SHIPPED, base)
    srv = start_server(tmp_path / "server.log", MODEL_BASE_PATH=str(base), MODEL_POLL_SECONDS="0.2")
    try:
        with httpx.Client(base_url=srv.url, timeout=60.0) as client:
            status = f"/v1/models/{MODEL_NAME}"
            assert [v["version"] for v in ok_json(client.get(status))["model_version_status"]] == [
                "1"
            ]
            # As an export appears: built under a hidden name, then renamed.
            staging = base / MODEL_NAME / ".export-2"
            shutil.copytree(trained_model.version_path, staging)
            staging.rename(base / MODEL_NAME / "2")

            def serving_2():
                versions = ok_json(client.get(status))["model_version_status"]
                return versions[0]["version"] == "2" and versions[0]["state"] == "AVAILABLE"

            wait_for(serving_2, "version 2 to serve", srv)
            body = json.loads((REPO_ROOT / "examples" / "predict.json").read_text())
            answer = ok_json(client.post(f"{status}:predict", json=body))
            assert answer["model_version"] == "2"
    finally:
        srv.stop()
