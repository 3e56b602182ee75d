"""The warmup file the export writes: TF Serving's format, answerable, and replayed in-process."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tensorflow as tf
from support.servers import MODEL_NAME
from support.tfserving_standin import TFServingStandIn
from tensorflow_serving.apis import prediction_log_pb2, prediction_service_pb2_grpc

from artifact.contract import (
    ASSETS_EXTRA,
    IMAGE_SHAPE,
    INPUT_KEY,
    PREDICT_OUTPUT_KEY,
    SIGNATURE_NAME,
    WARMUP_FILE,
)
from artifact.saved_model import SavedModelPredictor
from artifact.warmup import read_warmup_requests


@pytest.fixture(scope="module")
def warmup_path(trained_model):
    path = trained_model.version_path / ASSETS_EXTRA / WARMUP_FILE
    assert path.is_file(), f"the export wrote no {WARMUP_FILE}"
    return path


@pytest.fixture(scope="module")
def standin(trained_model) -> Iterator[TFServingStandIn]:
    server = TFServingStandIn(trained_model.export_base.parent, MODEL_NAME).start()
    yield server
    server.stop()


def test_the_file_is_a_tfrecord_of_prediction_logs(warmup_path):
    # Read with TF's own reader and the proto alone, as TF Serving does.
    logs = [
        prediction_log_pb2.PredictionLog.FromString(record)
        for record in tf.data.TFRecordDataset(str(warmup_path)).as_numpy_iterator()
    ]
    assert 0 < len(logs) <= 1000  # TF Serving's limit
    assert all(log.WhichOneof("log_type") == "predict_log" for log in logs)
    requests = [log.predict_log.request for log in logs]
    by_signature = {}
    for request in requests:
        assert set(request.inputs) == {INPUT_KEY}
        tensor = request.inputs[INPUT_KEY]
        assert tensor.dtype == tf.float32.as_datatype_enum
        batch = tf.make_ndarray(tensor)
        assert batch.shape[1:] == IMAGE_SHAPE
        assert batch.min() >= 0.0 and batch.max() <= 1.0
        by_signature.setdefault(request.model_spec.signature_name, []).append(len(batch))
    # Both signatures the model exports; the default one at batch 1 and a bigger batch.
    assert set(by_signature) == {SIGNATURE_NAME, PREDICT_OUTPUT_KEY}
    assert 1 in by_signature[SIGNATURE_NAME] and max(by_signature[SIGNATURE_NAME]) > 1
    # read_warmup_requests reads the same requests.
    assert read_warmup_requests(warmup_path.parent.parent) == requests


def test_the_stand_in_answers_every_warmup_request(trained_model, standin):
    requests = read_warmup_requests(trained_model.version_path)
    assert requests
    with grpc.insecure_channel(standin.address) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for request in requests:
            response = stub.Predict(request, timeout=30)
            n = tf.make_ndarray(request.inputs[INPUT_KEY]).shape[0]
            assert response.model_spec.version.value == 1
            assert response.model_spec.signature_name == request.model_spec.signature_name
            assert tf.make_ndarray(response.outputs["classes"]).shape == (n,)
            probabilities = tf.make_ndarray(response.outputs["probabilities"])
            assert probabilities.shape == (n, 10)
            np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-4)


def test_the_in_process_model_replays_the_file(trained_model, tmp_path):
    requests = read_warmup_requests(trained_model.version_path)
    assert SavedModelPredictor(trained_model.version_path).warm_up(requests) == len(requests)

    # Without the file: one zero image, nothing replayed.
    bare = shutil.copytree(trained_model.version_path, tmp_path / "1")
    (bare / ASSETS_EXTRA / WARMUP_FILE).unlink()
    assert read_warmup_requests(bare) == []
    assert SavedModelPredictor(bare).warm_up(read_warmup_requests(bare)) == 0


def test_a_damaged_file_is_refused(trained_model, tmp_path):
    damaged = shutil.copytree(trained_model.version_path, tmp_path / "1")
    path = damaged / ASSETS_EXTRA / WARMUP_FILE
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(ValueError, match=WARMUP_FILE):
        read_warmup_requests(damaged)


def test_the_warmup_requests_carry_real_test_images(warmup_path, small_test_data):
    """Zeros would warm the code paths but not look like traffic; the export sends test images."""
    from artifact.contract import normalize_pixels

    images, _ = small_test_data
    batches = [
        tf.make_ndarray(log.predict_log.request.inputs[INPUT_KEY])
        for log in map(
            prediction_log_pb2.PredictionLog.FromString,
            tf.data.TFRecordDataset(str(warmup_path)).as_numpy_iterator(),
        )
    ]
    largest = max(batches, key=len)
    np.testing.assert_array_equal(largest, normalize_pixels(images[: len(largest)]))
