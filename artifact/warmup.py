"""TF Serving's warmup file: `assets.extra/tf_serving_warmup_requests`, read and written here.

The file is a TFRecord of `PredictionLog` records (TF Serving's format). TF Serving replays
them when it loads a version, and so does the in-process backend, so the first real request
does not pay for tracing. Exports write real test images into it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

from artifact.contract import ASSETS_EXTRA, IMAGE_SHAPE, INPUT_KEY, SIGNATURE_NAME, WARMUP_FILE
from artifact.saved_model import signature_def_map

# Warmup batch sizes for the default signature: one image (the common request) and a small
# batch (what dynamic batching sends); every other signature is warmed with one image.
WARMUP_BATCH_SIZES = (1, 8)


def warmup_path(version_path: str | Path) -> Path:
    """Where a version's warmup file lives."""
    return Path(version_path) / ASSETS_EXTRA / WARMUP_FILE


def read_warmup_requests(version_path: str | Path) -> list[predict_pb2.PredictRequest]:
    """The PredictRequests of a version's warmup file; [] when it has none.

    Only predict_log records are kept, as they are all this model uses.

    Raises:
        ValueError: the file is not a TFRecord of PredictionLog records.
    """
    path = warmup_path(version_path)
    if not path.is_file():
        return []
    requests = []
    try:
        for record in tf.data.TFRecordDataset(str(path)).as_numpy_iterator():
            log = prediction_log_pb2.PredictionLog.FromString(record)
            if log.WhichOneof("log_type") == "predict_log":
                requests.append(log.predict_log.request)
    except (tf.errors.DataLossError, DecodeError) as err:
        raise ValueError(
            f"{ASSETS_EXTRA}/{WARMUP_FILE}: not a TFRecord of PredictionLog records ({err})"
        ) from err
    return requests


def build_warmup_requests(
    version_path: str | Path, model_name: str, images: np.ndarray | None = None
) -> list[predict_pb2.PredictRequest]:
    """The PredictRequests TF Serving should replay when it loads this SavedModel.

    Args:
        version_path: the (staged) SavedModel, read for its signatures.
        model_name: put in each request's model_spec (TF Serving ignores it during warmup).
        images: float32 [n, 28, 28] in [0, 1] to send; by default all-zero images.
    """
    largest = max(WARMUP_BATCH_SIZES)
    if images is None or len(images) == 0:
        images = np.zeros((largest, *IMAGE_SHAPE), np.float32)
    images = np.asarray(images, np.float32)
    requests = []
    for name, signature in sorted(signature_def_map(version_path).signature_def.items()):
        # Only the signatures this service can call: one `image` input.
        if set(signature.inputs) != {INPUT_KEY}:
            continue
        sizes = WARMUP_BATCH_SIZES if name == SIGNATURE_NAME else WARMUP_BATCH_SIZES[:1]
        for size in sizes:
            # Repeat the images when fewer were given than the batch size asks for.
            batch = np.resize(images, (size, *IMAGE_SHAPE))
            request = predict_pb2.PredictRequest()
            request.model_spec.name = model_name
            request.model_spec.signature_name = name
            request.inputs[INPUT_KEY].CopyFrom(tf.make_tensor_proto(batch, tf.float32))
            requests.append(request)
    return requests


def write_warmup_file(version_path: str | Path, requests) -> Path:
    """Write requests as the version's warmup file, in TF Serving's format."""
    path = warmup_path(version_path)
    path.parent.mkdir(exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for request in requests:
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)
            )
            writer.write(log.SerializeToString())
    return path
