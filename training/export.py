"""Export a checkpoint as a new integer version in TensorFlow Serving's repository layout.

A version appears atomically: the SavedModel, its labels, its evaluation report and its warmup
requests are built in a hidden staging directory beside the versions and renamed into place
only when complete, so TF Serving and our service, which poll the folder, never see a
half-written version.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf

from training.contract import (
    ASSETS_EXTRA,
    IMAGE_HEIGHT,
    IMAGE_SHAPE,
    IMAGE_WIDTH,
    INPUT_KEY,
    LABELS_FILE,
    REPORT_FILE,
    SIGNATURE_NAME,
    WARMUP_FILE,
)
from training.saved_model import signature_def_map, version_dirs

STAGING_PREFIX = ".export-"
# Staging directories older than this belong to a killed export and are swept away.
STALE_STAGING_SECONDS = 3600
# Warmup batch sizes for the default signature: one image (the common request) and a small
# batch (what dynamic batching sends); every other signature is warmed with one image.
WARMUP_BATCH_SIZES = (1, 8)


def serving_input_receiver_fn():
    """Raw receiver: one float32 [None, 28, 28] tensor named 'image', pixels in [0, 1]."""
    # A bare placeholder fails in TF2's eager mode; only its dtype and shape are used.
    with tf.Graph().as_default():
        image = tf.compat.v1.placeholder(tf.float32, [None, IMAGE_HEIGHT, IMAGE_WIDTH], INPUT_KEY)
    return tf.estimator.export.build_raw_serving_input_receiver_fn({INPUT_KEY: image})


def warmup_requests(version_path: str | Path, model_name: str, images: np.ndarray | None = None):
    """The PredictRequests TF Serving should replay when it loads this SavedModel.

    Args:
        version_path: the (staged) SavedModel, read for its signatures.
        model_name: put in each request's model_spec (TF Serving ignores it during warmup).
        images: float32 [n, 28, 28] in [0, 1] to send; by default all-zero images.
    """
    from tensorflow_serving.apis import predict_pb2

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
    """Write requests as assets.extra/tf_serving_warmup_requests, TF Serving's warmup format."""
    from tensorflow_serving.apis import prediction_log_pb2

    path = Path(version_path) / ASSETS_EXTRA / WARMUP_FILE
    path.parent.mkdir(exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for request in requests:
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)
            )
            writer.write(log.SerializeToString())
    return path


def _sweep_stale_staging(base: Path) -> None:
    cutoff = time.time() - STALE_STAGING_SECONDS
    for path in base.glob(STAGING_PREFIX + "*"):
        if path.is_dir() and path.stat().st_mtime < cutoff:
            shutil.rmtree(path, ignore_errors=True)


def _publish(staged: Path, base: Path) -> Path:
    """Rename a complete staged version to the next free integer; atomic on one filesystem."""
    while True:
        existing = [v for v, _ in version_dirs(base)]
        existing += [int(p.name) for p in base.iterdir() if p.name.isdigit()]
        target = base / str(max(existing, default=0) + 1)
        try:
            staged.rename(target)
            return target
        except OSError:
            if not target.exists():
                raise
            # Another export took this number between our listing and the rename.


def export_model(
    estimator: tf.estimator.Estimator,
    export_base: str | Path,
    labels: tuple[str, ...],
    build_report: Callable[[Path], dict] | None = None,
    checkpoint_path: str | None = None,
    warmup_images: np.ndarray | None = None,
) -> Path:
    """Export the estimator's latest (or the given) checkpoint as a new version.

    Args:
        estimator: the trained Estimator.
        export_base: the model's directory, e.g. models/fashion_mnist.
        labels: class names, written to assets.extra/labels.txt.
        build_report: called with the staged SavedModel's path before it is published; its
            result is written to assets.extra/evaluation.json.
        checkpoint_path: a specific checkpoint instead of the latest.
        warmup_images: float32 [n, 28, 28] in [0, 1] for the warmup requests written to
            assets.extra/tf_serving_warmup_requests (a few real images are best); by default
            all-zero images.
    Returns:
        The published version directory, e.g. models/fashion_mnist/3.
    """
    base = Path(export_base)
    base.mkdir(parents=True, exist_ok=True)
    _sweep_stale_staging(base)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=base))
    try:
        staged = Path(
            estimator.export_saved_model(
                str(staging), serving_input_receiver_fn(), checkpoint_path=checkpoint_path
            ).decode()
        )
        extra = staged / ASSETS_EXTRA
        extra.mkdir(exist_ok=True)
        (extra / LABELS_FILE).write_text("\n".join(labels) + "\n", encoding="utf-8")
        write_warmup_file(staged, warmup_requests(staged, base.name, warmup_images))
        if build_report is not None:
            report = build_report(staged)
            (extra / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        return _publish(staged, base)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
