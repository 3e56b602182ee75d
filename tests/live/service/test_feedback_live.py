"""Feedback and prediction logs against a real `python -m service`: feedback posted through the
service is in the next retrain's report and its candidate serves under the canary label only;
killing the service in the middle of writes loses no acknowledged feedback and leaves every
closed shard and log file readable; prediction logs are TF Serving's PredictionLog records
that TensorFlow's own reader reads."""

from __future__ import annotations

import concurrent.futures
import json
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
import tensorflow as tf
from support.feedback_stores import stored_shards
from support.servers import MODEL_NAME, copy_repository, start_server, wait_for
from support.sides import run_training
from tensorflow_serving.apis import prediction_log_pb2

from artifact import idx as data
from artifact.contract import ASSETS_EXTRA, BLESSING_FILE, CLASSES_KEY, INPUT_KEY, PROBABILITIES_KEY
from artifact.feedback import COMMITTED_FILE, store_dir
from artifact.model_config import write_config
from service.prediction_log import closed_logs

MODEL = f"/v1/models/{MODEL_NAME}"
POLL = "0.2"


def config_text() -> str:
    return (
        "model_config_list {\n  config {\n"
        f'    name: "{MODEL_NAME}"\n    base_path: "{MODEL_NAME}"\n'
        '    model_platform: "tensorflow"\n'
        "    model_version_policy { latest { num_versions: 2 } }\n  }\n}\n"
    )


def answered_by(client: httpx.Client, path: str = f"{MODEL}:predict") -> str:
    response = client.post(path, json={"instances": [[[0.0] * 28] * 28]})
    assert response.status_code == 200, response.text
    return response.json()["model_version"]


def metric(client: httpx.Client, name: str) -> float:
    """The sum of a Prometheus counter's samples in /metrics."""
    total = 0.0
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture
def servers():
    started = []
    yield started
    for server in started:
        server.stop()


def test_feedback_through_the_service_is_in_the_next_retrain_and_serves_as_canary(
    trained_model, small_data_dir, real_data_dir, tmp_path, servers
):
    base = copy_repository(trained_model, tmp_path)
    config = base / "models.config"
    write_config(config, config_text())
    feedback_dir = tmp_path / "feedback"
    server = start_server(
        tmp_path / "server.log",
        MODEL_CONFIG_FILE=str(config),
        MODEL_CONFIG_FILE_POLL_SECONDS=POLL,
        MODEL_POLL_SECONDS=POLL,
        FEEDBACK_DIR=str(feedback_dir),
        FEEDBACK_SHARD_IMAGES="10",
    )
    servers.append(server)
    _, images, labels = data.load_split(real_data_dir, "train")
    extra = tmp_path / "extra"
    data.write_idx(extra, "train", images[600:1800], labels[600:1800])
    names = trained_model_labels(trained_model)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        version = answered_by(client)
        for start in range(1800, 1825, 5):  # 25 images: two shards of 10 close, 5 wait
            body = {
                "instances": images[start : start + 5].astype(int).tolist(),
                "labels": [names[k] for k in labels[start : start + 5]],
                "model_version": version,
            }
            response = client.post(f"{MODEL}/feedback", json=body)
            assert response.status_code == 200, response.text
        assert metric(client, "feedback_examples_total") == 25

        done = run_training(
            "retrain",
            "--data-dir", small_data_dir,
            "--model-dir", tmp_path / "runs",
            "--export-dir", base / MODEL_NAME,
            "--extra-data", extra,
            "--feedback-dir", feedback_dir,
            "--config", config,
            "--publish", "canary",
            "--max-steps", 60,
            "--batch-size", 50,
            "--eval-every-secs", 1000,
            "--hooks", "none",
            "--deterministic",
        )  # fmt: skip
        (row,) = [line for line in done.stdout.splitlines() if line.startswith("feedback ")]
        assert row.split()[1] == "20"  # the two closed shards
        blessing = json.loads((base / MODEL_NAME / "2" / ASSETS_EXTRA / BLESSING_FILE).read_text())
        # Measured (--deterministic): 0.813 on the test split and 0.810 on the reference
        # against the session model's 0.750 and 0.753, ahead by 19 of the 300 images (9 of
        # the 158).
        for check in ("accuracy/test split", "accuracy/reference"):
            assert blessing["candidate"][check] >= blessing["baseline"][check] + 0.03, check
        (feedback,) = [s for s in blessing["data"]["sources"] if s["source"] == "feedback"]
        assert (feedback["read"], feedback["shards"]) == (20, 2)
        assert feedback["answered_by_version"] == {version: 20}

        # Within the poll interval the canary label answers with 2; the rest stays on 1.
        canary = f"{MODEL}/labels/canary:predict"
        wait_for(
            lambda: (
                (
                    response := client.post(canary, json={"instances": [[[0.0] * 28] * 28]})
                ).is_success
                and response.json()["model_version"] == "2"
            ),
            "the canary label to serve version 2",
            server,
        )
        assert [answered_by(client) for _ in range(10)] == ["1"] * 10
        assert client.get(f"{MODEL}/rollout").json()["labels"] == {"stable": 1, "canary": 2}


def trained_model_labels(trained_model) -> tuple[str, ...]:
    from artifact.repository import version_labels

    return version_labels(trained_model.version_path)


def image_with_id(number: int) -> list:
    """A 28x28 image that says which it is (first two pixels)."""
    pixels = np.zeros((28, 28), int)
    pixels[0, 0], pixels[0, 1] = number % 256, number // 256
    return pixels.tolist()


def ids_of(shards) -> list[int]:
    return [int(im[0, 0]) + 256 * int(im[0, 1]) for s in shards for im in s.images]


def committed_images(shard: Path) -> int:
    """The examples an open shard had committed: its committed count (what the next writer
    recovers, at most; artifact/feedback/)."""
    text = (shard / COMMITTED_FILE).read_text().strip()
    return int(text) if text.isdigit() else 0


def test_killing_the_service_mid_write_loses_no_acknowledged_feedback(
    trained_model, tmp_path, servers
):
    base = copy_repository(trained_model, tmp_path)
    feedback_dir, log_dir = tmp_path / "feedback", tmp_path / "prediction-logs"
    settings = {
        "MODEL_BASE_PATH": str(base),
        "FEEDBACK_DIR": str(feedback_dir),
        "FEEDBACK_SHARD_IMAGES": "3",
        "PREDICTION_LOG_SAMPLING_RATE": "1",
        "PREDICTION_LOG_DIR": str(log_dir),
        "PREDICTION_LOG_FILE_RECORDS": "4",
    }
    server = start_server(tmp_path / "first.log", **settings)
    servers.append(server)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for _ in range(10):
            answered_by(client)
        wait_for(lambda: metric(client, "prediction_log_records_total") == 10, "10 logged", server)
    acknowledged: set[int] = set()
    sent: set[int] = set()
    lock = threading.Lock()
    enough = threading.Event()

    def post(worker: int) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for i in range(10_000):
                numbers = [worker * 10_000 + i * 2 + k for k in range(1 + i % 2)]
                with lock:
                    sent.update(numbers)
                body = {
                    "instances": [image_with_id(n) for n in numbers],
                    "labels": [n % 10 for n in numbers],
                }
                try:
                    response = client.post(f"{MODEL}/feedback", json=body)
                except httpx.TransportError:
                    return  # killed
                assert response.status_code == 200, response.text
                with lock:
                    acknowledged.update(numbers)
                    if len(acknowledged) >= 60:
                        enough.set()

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        workers = [pool.submit(post, n) for n in range(1, 4)]
        assert enough.wait(120), server.log()
        server.process.kill()  # SIGKILL, in the middle of the writes
        for worker in workers:
            worker.result()
    server.process.wait(30)
    store = store_dir(feedback_dir, MODEL_NAME)
    before_restart = stored_shards(store)  # every closed shard reads
    assert set(ids_of(before_restart)) <= sent
    # Left open by the kill (none only when the kill came right after a rotation), and what
    # it had committed: a kill before a fresh shard's first commit leaves it empty.
    left_open = list(store.glob(".open-*"))
    assert len(left_open) <= 1
    committed = [committed_images(path) for path in left_open]

    # The next service to start recovers what the dead one left open, then closes its own.
    restarted = start_server(tmp_path / "second.log", **settings)
    servers.append(restarted)
    assert restarted.stop() == 0, restarted.log()  # drained and closed: exit 0
    shards = stored_shards(store)
    stored = ids_of(shards)
    assert len(stored) == len(set(stored))  # nothing twice
    assert acknowledged <= set(stored) <= sent
    assert not list(store.glob(".open-*"))
    if any(committed):
        assert "Recovered the open feedback shard of a dead writer" in restarted.log()
    for shard in shards:
        assert [int(k) for k in shard.labels] == [n % 10 for n in ids_of([shard])]
        assert shard.senders == ("anonymous",) * len(shard)

    # The prediction logs: TF Serving's PredictionLog records, read by TensorFlow.
    files = closed_logs(log_dir / MODEL_NAME)
    records = [
        prediction_log_pb2.PredictionLog.FromString(record)
        for path in files
        for record in tf.data.TFRecordDataset(str(path)).as_numpy_iterator()
    ]
    assert len(records) == 10
    for entry in records:
        assert entry.log_metadata.model_spec.name == MODEL_NAME
        assert entry.log_metadata.model_spec.version.value == 1
        assert entry.log_metadata.sampling_config.sampling_rate == 1.0
        request, response = entry.predict_log.request, entry.predict_log.response
        assert tf.make_ndarray(request.inputs[INPUT_KEY]).shape == (1, 28, 28)
        assert tf.make_ndarray(response.outputs[PROBABILITIES_KEY]).shape == (1, 10)
        assert tf.make_ndarray(response.outputs[CLASSES_KEY]).dtype == np.int64


def test_prediction_log_files_rotate_and_an_orphan_is_cut_to_whole_records(tmp_path):
    """A dead writer's open file (here: a torn last record) is closed by the next logger."""
    from prometheus_client import CollectorRegistry

    from service.prediction_log import OPEN_PREFIX, SUFFIX, PredictionLogger
    from service.types import PredictResult

    images = np.zeros((2, 28, 28), np.float32)
    result = PredictResult(
        MODEL_NAME,
        3,
        {CLASSES_KEY: np.array([1, 2]), PROBABILITIES_KEY: np.full((2, 10), 0.1, np.float32)},
        tuple("abcdefghij"),
    )
    logger = PredictionLogger(tmp_path, 1.0, 3, 10**8, CollectorRegistry(), seed=0)
    logger.start()
    for _ in range(4):
        logger(MODEL_NAME, "serving_default", images, result)
    logger.close()
    assert [count_records(p) for p in closed_logs(tmp_path / MODEL_NAME)] == [3, 1]
    record = logger.record(MODEL_NAME, "serving_default", images, result)
    orphan = tmp_path / MODEL_NAME / f"{OPEN_PREFIX}dead-writer{SUFFIX}"
    with tf.io.TFRecordWriter(str(orphan)) as writer:
        writer.write(record)
        writer.write(record)
    orphan.write_bytes(orphan.read_bytes()[:-7])  # the second record torn
    second = PredictionLogger(tmp_path, 1.0, 3, 10**8, CollectorRegistry(), seed=0)
    second.start()
    second.close()
    assert not orphan.exists()
    assert sorted(count_records(p) for p in closed_logs(tmp_path / MODEL_NAME)) == [1, 1, 3]


def count_records(path: Path) -> int:
    return sum(1 for _ in tf.data.TFRecordDataset(str(path)))
