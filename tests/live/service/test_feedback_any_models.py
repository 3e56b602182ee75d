"""Feedback and prediction logs for models of other contracts, through a real `python -m
service`: a pre-made tabular classifier (named float, int64 and string inputs, string classes
out) and a CNN on 32x32x3 images, both made by the training command line
(`support.sides.run_training`). Feedback is checked against each signature and stored as
tf.Example records that TensorFlow's own reader reads back (the framing and CRCs the service
writes without TensorFlow); the next retrain of the classifier reads what was posted; the
prediction log holds each request's named inputs and string outputs with their dtypes.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import NamedTuple

import httpx
import numpy as np
import pytest
import tensorflow as tf
from support.servers import Server, start_server, wait_for
from support.sides import run_training, run_trainings
from tensorflow_serving.apis import prediction_log_pb2

from artifact.contract import BLESSING_FILE
from artifact.feedback import EXAMPLES_FILE, LABEL_FEATURE, closed_shards, store_dir
from service.prediction_log import closed_logs

CLASSES = ("high", "low", "mid")


class Served(NamedTuple):
    """The module's server and what it serves."""

    server: Server
    url: str
    root: Path  # models/, feedback/, prediction-logs/, sample/, runs/
    sample_rows: list[list[str]]  # the classification CSV's data rows


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("feedback-any")
    common = ("--deterministic", "--eval-every-secs", 1000, "--hooks", "none", "--batch-size", 32)
    run_trainings([
        ["sample-data", "--out", root / "sample", "--images-per-class", 10],
        ["train", "--csv", root / "sample" / "classification.csv", "--max-steps", 20,
         "--model-dir", root / "runs" / "classifier", "--export-dir",
         root / "models" / "classifier", "--learning-rate", 0.05, *common],
        ["train", "--image-folder", root / "sample" / "shapes", "--image-size", 32,
         "--channels", 3, "--max-steps", 5, "--model-dir", root / "runs" / "shapes",
         "--export-dir", root / "models" / "shapes", *common],
    ])  # fmt: skip
    config = root / "models.config"
    config.write_text(
        "model_config_list {\n"
        + "".join(
            f'  config {{ name: "{name}" base_path: "{root / "models" / name}" '
            'model_platform: "tensorflow" }\n'
            for name in ("classifier", "shapes")
        )
        + "}\n"
    )
    server = start_server(
        root / "server.log",
        MODEL_CONFIG_FILE=str(config),
        FEEDBACK_DIR=str(root / "feedback"),
        # Every shard and log file closed as soon as it is written: the tests read them
        # while the service runs.
        FEEDBACK_SHARD_IMAGES="3",
        PREDICTION_LOG_SAMPLING_RATE="1",
        PREDICTION_LOG_FILE_RECORDS="1",
        PREDICTION_LOG_DIR=str(root / "prediction-logs"),
    )
    rows = list(csv.reader((root / "sample" / "classification.csv").open(newline="")))[1:]
    yield Served(server, server.url, root, rows)
    server.stop()


def instance(row: list[str]) -> dict:
    return {"x1": float(row[0]), "x2": float(row[1]), "rooms": int(row[2]), "color": row[3]}


def parsed_store(root: Path, model: str, spec: dict) -> list[dict]:
    """Every closed shard's examples of a model's store, read by tf.data."""
    files = [str(path / EXAMPLES_FILE) for path in closed_shards(store_dir(root, model))]
    dataset = tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, spec))
    return list(dataset.as_numpy_iterator())


def test_feedback_for_a_tabular_model_and_32x32x3_images_is_stored_and_retrained_on(served):
    """Stored as tf.Examples that TensorFlow reads back, and read by the next retrain."""
    rows = served.sample_rows
    images = np.random.default_rng(4).random((3, 32, 32, 3)).astype(np.float32)
    with httpx.Client(base_url=served.url, timeout=60) as client:
        body = {"instances": [instance(r) for r in rows[:6]], "labels": [r[4] for r in rows[:6]]}
        response = client.post("/v1/models/classifier/feedback", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["labels"] == [r[4] for r in rows[:6]]
        missing = {"instances": [{"x1": 0.5, "x2": 1.0, "rooms": 2}], "labels": ["low"]}
        refused = client.post("/v1/models/classifier/feedback", json=missing)
        assert refused.status_code == 400 and "missing ['color']" in refused.json()["error"]
        body = {"instances": images.tolist(), "labels": ["circle", 2, "square"]}
        response = client.post("/v1/models/shapes/feedback", json=body)
        assert response.status_code == 200, response.text
        wrong = {"instances": np.zeros((1, 28, 28)).tolist(), "labels": [0]}
        refused = client.post("/v1/models/shapes/feedback", json=wrong)
        assert refused.status_code == 400
        assert "input 'image' takes float [-1,32,32,3]" in refused.json()["error"]
        metrics = client.get("/metrics").text.splitlines()
        (circles,) = [
            line for line in metrics
            if line.startswith("feedback_examples_total{") and 'model="shapes"' in line
            and 'label="circle"' in line
        ]  # fmt: skip
        assert circles.endswith(" 1.0")
    table_spec = {
        "x1": tf.io.FixedLenFeature([], tf.float32),
        "x2": tf.io.FixedLenFeature([], tf.float32),
        "rooms": tf.io.FixedLenFeature([], tf.int64),
        "color": tf.io.FixedLenFeature([], tf.string),
        LABEL_FEATURE: tf.io.FixedLenFeature([], tf.int64),
    }
    stored = parsed_store(served.root / "feedback", "classifier", table_spec)
    assert [e["color"].decode() for e in stored] == [r[3] for r in rows[:6]]
    assert [CLASSES[e[LABEL_FEATURE]] for e in stored] == [r[4] for r in rows[:6]]
    np.testing.assert_array_equal([e["x1"] for e in stored], np.float32([r[0] for r in rows[:6]]))
    image_spec = {
        "image": tf.io.FixedLenFeature([32, 32, 3], tf.float32),
        LABEL_FEATURE: tf.io.FixedLenFeature([], tf.int64),
    }
    stored = parsed_store(served.root / "feedback", "shapes", image_spec)
    np.testing.assert_array_equal([e["image"] for e in stored], images)
    assert [e[LABEL_FEATURE] for e in stored] == [0, 2, 1]

    # The classifier's next retrain reads the six rows (closed shards only, as it must).
    root = served.root
    done = run_training(
        "retrain", "--export-dir", root / "models" / "classifier",
        "--model-dir", root / "runs" / "retrain", "--feedback-dir", root / "feedback",
        "--max-steps", 25, "--batch-size", 32, "--learning-rate", 0.05,
        "--eval-every-secs", 1000, "--hooks", "none", "--deterministic", check=False,
    )  # fmt: skip
    assert done.returncode in (0, 3), done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = (root / "runs" / "retrain").glob("retrain-*")
    blessing = json.loads((run_dir / BLESSING_FILE).read_text())
    (feedback,) = [s for s in blessing["data"]["sources"] if s["source"] == "feedback"]
    # Rows of the base CSV itself: read, and dropped as the duplicates they are.
    assert (feedback["read"], feedback["duplicates"], feedback["shards"]) == (6, 6, 1)
    assert feedback["senders"] == {
        "anonymous": {"stored": 6, "read": 6, "excluded": 0, "expired": 0, "over_cap": 0}
    }


def test_the_prediction_log_holds_named_inputs_and_string_outputs(served):
    rows = served.sample_rows[10:12]
    with httpx.Client(base_url=served.url, timeout=60) as client:
        body = {"signature_name": "predict", "instances": [instance(r) for r in rows]}
        response = client.post("/v1/models/classifier:predict", json=body)
        assert response.status_code == 200, response.text
        answered = response.json()["predictions"]

    def logged() -> list:
        """The classifier's logged predict calls (written by a thread of the service)."""
        records = [
            prediction_log_pb2.PredictionLog.FromString(record)
            for path in closed_logs(served.root / "prediction-logs" / "classifier")
            for record in tf.data.TFRecordDataset(str(path)).as_numpy_iterator()
        ]
        return [r for r in records if r.log_metadata.model_spec.signature_name == "predict"]

    (entry,) = wait_for(logged, "the prediction to be logged", served.server)
    request, response = entry.predict_log.request, entry.predict_log.response
    assert request.model_spec.name == "classifier"
    inputs = {name: tf.make_ndarray(proto) for name, proto in request.inputs.items()}
    assert sorted(inputs) == ["color", "rooms", "x1", "x2"]
    assert request.inputs["color"].dtype == tf.string.as_datatype_enum
    assert inputs["color"].tolist() == [r[3].encode() for r in rows]
    assert request.inputs["rooms"].dtype == tf.int64.as_datatype_enum
    assert inputs["rooms"].tolist() == [int(r[2]) for r in rows]
    np.testing.assert_array_equal(inputs["x1"], np.float32([r[0] for r in rows]))
    classes = tf.make_ndarray(response.outputs["classes"])
    assert response.outputs["classes"].dtype == tf.string.as_datatype_enum
    assert [c[0].decode() for c in classes] == [p["classes"][0] for p in answered]
    np.testing.assert_allclose(
        tf.make_ndarray(response.outputs["probabilities"]),
        [p["probabilities"] for p in answered],
        rtol=1e-6,
    )
