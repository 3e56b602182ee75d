"""Publish a checkpoint as a new integer version in TensorFlow Serving's repository layout.

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

from artifact.contract import (
    ASSETS_EXTRA,
    IMAGE_HEIGHT,
    IMAGE_WIDTH,
    INPUT_KEY,
    LABELS_FILE,
    REPORT_FILE,
    normalize_pixels,
)
from artifact.repository import parse_version
from artifact.saved_model import SavedModelPredictor
from artifact.warmup import WARMUP_BATCH_SIZES, build_warmup_requests, write_warmup_file
from training.evaluation import build_report
from training.plots import write_export_plots
from training.runs import EVAL_BATCH_SIZE

STAGING_PREFIX = ".export-"
# Staging directories older than this belong to a killed export and are swept away.
STALE_STAGING_SECONDS = 3600


def serving_input_receiver_fn():
    """Raw receiver: one float32 [None, 28, 28] tensor named 'image', pixels in [0, 1]."""
    # A bare placeholder fails in TF2's eager mode ("tf.placeholder() is not compatible with
    # eager execution"); made in a throwaway graph, only its dtype and shape are used.
    with tf.Graph().as_default():
        image = tf.compat.v1.placeholder(tf.float32, [None, IMAGE_HEIGHT, IMAGE_WIDTH], INPUT_KEY)
    return tf.estimator.export.build_raw_serving_input_receiver_fn({INPUT_KEY: image})


def _sweep_stale_staging(base: Path) -> None:
    cutoff = time.time() - STALE_STAGING_SECONDS
    for path in base.glob(STAGING_PREFIX + "*"):
        if path.is_dir() and path.stat().st_mtime < cutoff:
            shutil.rmtree(path, ignore_errors=True)


def _publish(staged: Path, base: Path) -> Path:
    """Rename a complete staged version to the next free integer; atomic on one filesystem."""
    while True:
        # Every version-named folder counts, loadable or not: a number is never reused.
        numbers = (parse_version(p.name) for p in base.iterdir())
        existing = [v for v in numbers if v is not None]
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
    write_extras: Callable[[Path, dict | None], object] | None = None,
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
        write_extras: called with the staged assets.extra folder and the report (None
            without build_report) to write more files there, such as plots, before the
            version is published.
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
        write_warmup_file(staged, build_warmup_requests(staged, base.name, warmup_images))
        report = build_report(staged) if build_report is not None else None
        if report is not None:
            (extra / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        if write_extras is not None:
            write_extras(extra, report)
        return _publish(staged, base)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def export_evaluated(estimator, export_dir, labels, test_images, test_labels, context) -> Path:
    """Export a new version with its evaluation report on the test split, its plots (the
    confusion matrix, and the learning curves from the run's event files) and TF Serving
    warmup requests made of real test images.

    The report comes from the staged SavedModel itself, so it describes exactly what is
    published.

    Args:
        test_images, test_labels: uint8 [n, 28, 28] and [n].
        context: what the report records besides the metrics (runs.report_context());
            its model_dir is the run whose event files give the learning curves.
    """

    def build(version_path: Path) -> dict:
        predictor = SavedModelPredictor(version_path)
        classes, _ = predictor.predict_batched(normalize_pixels(test_images), EVAL_BATCH_SIZE)
        return build_report(test_labels, classes, labels, **context)

    return export_model(
        estimator,
        export_dir,
        labels,
        build,
        warmup_images=normalize_pixels(test_images[: max(WARMUP_BATCH_SIZES)]),
        write_extras=lambda extra, report: write_export_plots(
            extra, report, context.get("model_dir")
        ),
    )
