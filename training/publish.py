"""Publish a checkpoint as a new integer version in TensorFlow Serving's repository layout.

A version appears atomically: the SavedModel, its labels, its evaluation report and its warmup
requests are built in a hidden staging directory beside the versions and renamed into place
only when complete, so TF Serving and our service, which poll the folder, never see a
half-written version.

The gated retrain stages its candidate outside the repository (`staged_version`, in its run
dir), so that a candidate that is not blessed leaves the repository untouched, and publishes
it with training.versions' `publish_staged` (or leaves it for the publish step,
training/staging.py). The renames themselves, which need no TensorFlow, are in
training/versions.py.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
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
from artifact.saved_model import SavedModelPredictor
from artifact.storage import is_url
from artifact.warmup import WARMUP_BATCH_SIZES, build_warmup_requests, write_warmup_file
from training.evaluation_report import build_report
from training.plots import write_export_plots
from training.runs import EVAL_BATCH_SIZE
from training.versions import STAGING_PREFIX, publish_next, publish_remote, sweep_stale_staging


def serving_input_receiver_fn():
    """Raw receiver: one float32 [None, 28, 28] tensor named 'image', pixels in [0, 1]."""
    # A bare placeholder fails in TF2's eager mode ("tf.placeholder() is not compatible with
    # eager execution"); made in a throwaway graph, only its dtype and shape are used.
    with tf.Graph().as_default():
        image = tf.compat.v1.placeholder(tf.float32, [None, IMAGE_HEIGHT, IMAGE_WIDTH], INPUT_KEY)
    return tf.estimator.export.build_raw_serving_input_receiver_fn({INPUT_KEY: image})


def export_model(
    estimator: tf.estimator.Estimator,
    export_base: str | Path,
    labels: tuple[str, ...],
    build_report: Callable[[Path], dict] | None = None,
    checkpoint_path: str | None = None,
    warmup_images: np.ndarray | None = None,
    write_extras: Callable[[Path, dict | None], object] | None = None,
) -> Path | str:
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
        The published version directory, e.g. models/fashion_mnist/3; for an export_base on
        object storage (s3://bucket/models/fashion_mnist), the version's URL: staged in a
        local temporary folder, then uploaded with its manifest last (artifact/storage.py).
    """
    if is_url(str(export_base)):
        url = str(export_base).rstrip("/")
        with tempfile.TemporaryDirectory(prefix="export-") as where, staged_version(
            estimator, where, url.rsplit("/", 1)[-1], labels, build_report, checkpoint_path,
            warmup_images, write_extras,
        ) as staged:  # fmt: skip
            return publish_remote(staged, url)
    base = Path(export_base)
    base.mkdir(parents=True, exist_ok=True)
    sweep_stale_staging(base)
    with staged_version(
        estimator, base, base.name, labels, build_report, checkpoint_path, warmup_images,
        write_extras,
    ) as staged:  # fmt: skip
        return publish_next(staged, base)


@contextlib.contextmanager
def staged_version(
    estimator: tf.estimator.Estimator,
    where: str | Path,
    model_name: str,
    labels: tuple[str, ...],
    build_report: Callable[[Path], dict] | None = None,
    checkpoint_path: str | None = None,
    warmup_images: np.ndarray | None = None,
    write_extras: Callable[[Path, dict | None], object] | None = None,
) -> Iterator[Path]:
    """A complete version (SavedModel, labels, report, warmup requests) built in a hidden
    folder under `where`, removed when the block ends unless it was renamed away: what
    export_model builds, where the gated retrain wants it (its run dir, not the repository).

    Args:
        where: the folder to stage in (the repository, or a run dir).
        model_name: the name the warmup requests carry (the repository folder's name).
        The rest: as export_model's.
    """
    with _staged_saved_model(
        estimator, where, serving_input_receiver_fn(), checkpoint_path
    ) as staged:
        extra = staged / ASSETS_EXTRA
        (extra / LABELS_FILE).write_text("\n".join(labels) + "\n", encoding="utf-8")
        write_warmup_file(staged, build_warmup_requests(staged, model_name, warmup_images))
        report = build_report(staged) if build_report is not None else None
        if report is not None:
            (extra / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        if write_extras is not None:
            write_extras(extra, report)
        yield staged


@contextlib.contextmanager
def _staged_saved_model(estimator, where, receiver_fn, checkpoint_path=None) -> Iterator[Path]:
    """The estimator's SavedModel exported into a hidden staging folder under `where`, with
    an empty assets.extra/; the folder is removed when the block ends unless renamed away."""
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=where))
    try:
        staged = Path(
            estimator.export_saved_model(
                str(staging), receiver_fn, checkpoint_path=checkpoint_path
            ).decode()
        )
        (staged / ASSETS_EXTRA).mkdir(exist_ok=True)
        yield staged
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def export_version(
    estimator: tf.estimator.Estimator,
    export_base: str | Path,
    receiver_fn: Callable,
    write_assets: Callable[[Path], object],
    checkpoint_path: str | None = None,
) -> Path | str:
    """Export any Estimator through any serving input receiver as the next version.

    What export_model does for the image contract, for every other model (pre-made
    Estimators on feature columns, image folders of any size): staged in a hidden folder
    beside the versions, published by one rename, never half-written.

    Args:
        receiver_fn: the serving input receiver function (raw or tf.Example parsing).
        write_assets: called with the staged version's folder before it is published, to
            write assets.extra/ (labels, evaluation report) from the staged SavedModel
            itself; whatever it raises leaves no version behind.
    Returns:
        The published version directory (its URL on object storage, as export_model).
    """
    if is_url(str(export_base)):
        with (
            tempfile.TemporaryDirectory(prefix="export-") as where,
            _staged_saved_model(estimator, where, receiver_fn, checkpoint_path) as staged,
        ):
            write_assets(staged)
            return publish_remote(staged, str(export_base))
    base = Path(export_base)
    base.mkdir(parents=True, exist_ok=True)
    sweep_stale_staging(base)
    with _staged_saved_model(estimator, base, receiver_fn, checkpoint_path) as staged:
        write_assets(staged)
        return publish_next(staged, base)


def export_evaluated(
    estimator, export_dir, labels, test_images, test_labels, context
) -> Path | str:
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

    def write_plots(extra: Path, report: dict | None) -> object:
        if report is None:  # export_model passes what `build` made
            raise ValueError("no evaluation report to plot")
        return write_export_plots(extra, report, context.get("model_dir"))

    return export_model(
        estimator,
        export_dir,
        labels,
        build,
        warmup_images=normalize_pixels(test_images[: max(WARMUP_BATCH_SIZES)]),
        write_extras=write_plots,
    )
