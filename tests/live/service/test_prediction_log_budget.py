"""Prediction logs (service/prediction_log.py) rotate within PREDICTION_LOG_MAX_BYTES: the
oldest closed files make room for new records instead of new records being dropped; and the
clients' images in them are for the service's user only (files 0600, folders 0700).

Slow: TF Serving's PredictionLog protos and TFRecordWriter are TensorFlow's.
"""

from __future__ import annotations

import stat

import numpy as np
import tensorflow as tf
from prometheus_client import CollectorRegistry
from tensorflow_serving.apis import prediction_log_pb2

from artifact.contract import CLASSES_KEY, INPUT_KEY, PROBABILITIES_KEY
from service.prediction_log import RECORD_OVERHEAD, PredictionLogger, closed_logs
from service.types import PredictResult

MODEL_NAME = "fashion_mnist"
RECORDS = 12
KEPT_RECORDS = 5  # the budget holds this many records


def result() -> PredictResult:
    return PredictResult(
        MODEL_NAME,
        1,
        {CLASSES_KEY: np.array([1]), PROBABILITIES_KEY: np.full((1, 10), 0.1, np.float32)},
        tuple("abcdefghij"),
    )


def images(number: int) -> np.ndarray:
    """One image whose every pixel is `number`: which prediction a record is, read back."""
    return np.full((1, 28, 28), number, np.float32)


def logged_numbers(folder) -> list[int]:
    numbers = []
    for path in closed_logs(folder):
        for raw in tf.data.TFRecordDataset(str(path)):
            entry = prediction_log_pb2.PredictionLog.FromString(raw.numpy())
            numbers.append(
                int(tf.make_ndarray(entry.predict_log.request.inputs[INPUT_KEY])[0, 0, 0])
            )
    return numbers


def test_the_oldest_closed_files_make_room_and_files_are_private(tmp_path):
    directory = tmp_path / "logs"
    registry = CollectorRegistry()
    probe = PredictionLogger(directory, 1.0, 2, 10**9, CollectorRegistry(), seed=0)
    size = len(probe.record(MODEL_NAME, "serving_default", images(0), result())) + RECORD_OVERHEAD
    logger = PredictionLogger(directory, 1.0, 2, KEPT_RECORDS * size, registry, seed=0)
    logger.start()
    for number in range(RECORDS):
        logger(MODEL_NAME, "serving_default", images(number), result())
    logger.close()

    folder = directory / MODEL_NAME
    files = closed_logs(folder)
    assert sum(path.stat().st_size for path in files) <= KEPT_RECORDS * size
    # The newest records are kept, the oldest files went; nothing was dropped on the way.
    kept = logged_numbers(folder)
    assert kept == list(range(RECORDS - len(kept), RECORDS)) and len(kept) >= KEPT_RECORDS - 1
    assert registry.get_sample_value(
        "prediction_log_dropped_total", {"model": MODEL_NAME, "reason": "max_bytes"}
    ) in (None, 0.0)
    assert (
        registry.get_sample_value("prediction_log_records_total", {"model": MODEL_NAME}) == RECORDS
    )
    assert {stat.S_IMODE(path.stat().st_mode) for path in files} == {0o600}
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


def test_a_record_larger_than_the_budget_is_dropped_and_counted(tmp_path):
    registry = CollectorRegistry()
    logger = PredictionLogger(tmp_path / "logs", 1.0, 2, 100, registry, seed=0)
    logger.start()
    logger(MODEL_NAME, "serving_default", images(1), result())
    logger.close()
    assert (
        registry.get_sample_value(
            "prediction_log_dropped_total", {"model": MODEL_NAME, "reason": "max_bytes"}
        )
        == 1.0
    )
    assert closed_logs(tmp_path / "logs" / MODEL_NAME) == []
