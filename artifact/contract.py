"""The one contract between training and serving.

Signature and tensor names, input shape and dtype, pixel rules, class labels and how a
prediction is shown to a person are defined here once and imported by the export code, both
serving backends, batch prediction and the tests. Nothing here imports TensorFlow: the
SavedModel and its signature are the contract, not the code that trained it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import orjson

SIGNATURE_NAME = "serving_default"
# The custom model_fn's PredictOutput key; TF exports it as a second signature besides the default.
PREDICT_OUTPUT_KEY = "classify"
INPUT_KEY = "image"
CLASSES_KEY = "classes"
PROBABILITIES_KEY = "probabilities"
OUTPUT_KEYS = (CLASSES_KEY, PROBABILITIES_KEY)

IMAGE_HEIGHT = 28
IMAGE_WIDTH = 28
IMAGE_SHAPE = (IMAGE_HEIGHT, IMAGE_WIDTH)
NUM_CLASSES = 10
PIXEL_MAX = 255.0

# Files under a version's assets.extra/ (TF Serving ignores that folder's content).
ASSETS_EXTRA = "assets.extra"
LABELS_FILE = "labels.txt"
REPORT_FILE = "evaluation.json"
# TF Serving replays this TFRecord of PredictionLog requests when it loads a version; so does
# the in-process backend (the name and format are TF Serving's).
WARMUP_FILE = "tf_serving_warmup_requests"
# PNG plots the export draws beside the report (training/plots.py); the service's page shows
# whichever of them a version has. Classifiers get the confusion matrix, regressors predicted
# against true and the residuals; every task its learning curves.
CONFUSION_MATRIX_PLOT = "confusion_matrix.png"
LEARNING_CURVES_PLOT = "learning_curves.png"
PREDICTED_VS_TRUE_PLOT = "predicted_vs_true.png"
RESIDUALS_PLOT = "residuals.png"
CLASSIFIER_PLOTS = (CONFUSION_MATRIX_PLOT, LEARNING_CURVES_PLOT)
REGRESSOR_PLOTS = (PREDICTED_VS_TRUE_PLOT, RESIDUALS_PLOT, LEARNING_CURVES_PLOT)
EXPORT_PLOTS = (CONFUSION_MATRIX_PLOT, LEARNING_CURVES_PLOT, PREDICTED_VS_TRUE_PLOT, RESIDUALS_PLOT)
# Retraining's verdict on a version, candidate against baseline, when it wrote one.
BLESSING_FILE = "blessing.json"

FASHION_MNIST_LABELS = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
DIGIT_LABELS = tuple(str(d) for d in range(NUM_CLASSES))
LABEL_PRESETS = {"fashion": FASHION_MNIST_LABELS, "digits": DIGIT_LABELS}


def normalize_pixels(pixels):
    """Scale 0-255 pixels to float32 in [0, 1]: the one preprocessing step, train and serve.

    Accepts a numpy array (serving, batch prediction) or a tf.Tensor (the tf.data pipeline).
    """
    if isinstance(pixels, np.ndarray):
        return pixels.astype(np.float32) / np.float32(PIXEL_MAX)
    # Only the training pipeline passes tensors; serving code never imports TensorFlow here.
    import tensorflow as tf

    return tf.cast(pixels, tf.float32) / PIXEL_MAX


def resolve_labels(spec: str, data_dir: str | None = None) -> tuple[str, ...]:
    """Class labels from a preset name (`fashion`, `digits`), a comma list, or `auto`.

    `auto` picks the Fashion-MNIST names when the data directory's path mentions "fashion",
    and the digits 0-9 otherwise (MNIST itself).

    Raises:
        ValueError: the list does not have exactly NUM_CLASSES distinct names.
    """
    if spec == "auto":
        spec = "fashion" if data_dir and "fashion" in str(data_dir).lower() else "digits"
    if spec in LABEL_PRESETS:
        return LABEL_PRESETS[spec]
    labels = tuple(part.strip() for part in spec.split(","))
    if len(labels) != NUM_CLASSES or len(set(labels)) != NUM_CLASSES or not all(labels):
        raise ValueError(
            f"--labels: expected a preset ({', '.join(LABEL_PRESETS)}) or {NUM_CLASSES} distinct "
            f"comma-separated names, got {len(labels)} name(s): {spec!r}"
        )
    return labels


# --- pixels: what a person may send --------------------------------------------------------


class PixelError(ValueError):
    """Pixels that break the rules; `index` is the first offending image of the batch."""

    def __init__(self, index: int, problem: str):
        super().__init__(f"image {index}: {problem}")
        self.index = index
        self.problem = problem


def first_bad(mask: np.ndarray) -> int:
    """The index of the first image [n, ...] with any True in a boolean mask of its shape."""
    return int(np.argmax(mask.reshape(len(mask), -1).any(axis=1)))


FLOAT32_MAX = float(np.finfo(np.float32).max)


def finite_float32(array: np.ndarray) -> np.ndarray:
    """float32 as the model takes it; PixelError when a value is not finite in float32."""
    if array.dtype.kind == "f":
        # Checked before the cast: past float32's range a value would become inf (with a
        # warning), and NaN compares false: both fail this one pass.
        largest = np.abs(array).max() if array.size else 0.0
        if not largest <= FLOAT32_MAX:
            bad = ~(np.abs(array) <= FLOAT32_MAX)
            raise PixelError(first_bad(bad), "values must be finite numbers (NaN/Inf or too large)")
    return array.astype(np.float32)


def pixels_to_input(array: np.ndarray) -> np.ndarray:
    """A person's pixels [n, 28, 28] to model input: integers 0-255 are scaled, floats must
    already be in [0, 1] (the service's JSON rule and batch prediction's .npy rule).

    Raises:
        PixelError: integers outside 0-255, floats outside [0, 1], NaN or Inf.
    """
    if array.dtype.kind in "iu":
        if array.size and (array.min() < 0 or array.max() > 255):
            raise PixelError(first_bad((array < 0) | (array > 255)), "integer pixels must be 0-255")
        return normalize_pixels(array.astype(np.uint8))
    if array.dtype.kind != "f":
        raise PixelError(0, f"expected integer or float pixels, got dtype {array.dtype}")
    images = finite_float32(array)
    if images.size and (images.min() < 0.0 or images.max() > 1.0):
        raise PixelError(
            first_bad((images < 0) | (images > 1)),
            "float pixels must be in [0, 1]; send 0-255 values as integers",
        )
    return images


# How far a row of probabilities may sum from 1 (float32 softmax rounding is ~1e-7 per term).
PROBABILITY_SUM_TOLERANCE = 1e-3


def output_problems(outputs: dict[str, np.ndarray], finite_rows_only: bool = False) -> list[str]:
    """What is wrong with a prediction's contract outputs; [] when nothing is.

    Only probabilities-like outputs are checked: a float `probabilities` output (any
    classifier's, pre-made heads' included) and integer `classes` beside it (a
    label_vocabulary's string classes are names, not ids). `probabilities` must be finite,
    within [0, 1] and each row sum to 1; `classes` must be class ids of those rows. With
    `finite_rows_only`, rows holding NaN or Inf are left out (what a model gives for a NaN
    input, which TF Serving passes to it: not the model's fault). Cheap (a few numpy passes over
    [n, 10]): the service checks every answer too, and counts the ones that fail.
    """
    problems = []
    probabilities = outputs.get(PROBABILITIES_KEY)
    if probabilities is not None and probabilities.dtype.kind != "f":
        probabilities = None  # not probabilities-like: another model's output of that name
    if probabilities is not None and finite_rows_only and probabilities.ndim == 2:
        probabilities = probabilities[np.isfinite(probabilities).all(axis=1)]
    if probabilities is not None and probabilities.size:
        if not np.isfinite(probabilities).all():
            problems.append("probabilities are not all finite")
        elif probabilities.min() < 0.0 or probabilities.max() > 1.0:
            problems.append(
                f"probabilities outside [0, 1] (from {probabilities.min():g} to "
                f"{probabilities.max():g})"
            )
        else:
            sums = probabilities.reshape(len(probabilities), -1).sum(axis=1)
            worst = float(np.abs(sums - 1.0).max())
            if worst > PROBABILITY_SUM_TOLERANCE:
                problems.append(f"a row of probabilities sums to {1.0 + worst:g}, not 1")
    classes = outputs.get(CLASSES_KEY)
    if classes is not None and classes.dtype.kind not in "iu":
        classes = None  # class names (a label_vocabulary's), not ids
    if classes is not None and probabilities is not None and classes.size:
        width = probabilities.shape[-1] if probabilities.ndim == 2 else NUM_CLASSES
        if classes.min() < 0 or classes.max() >= width:
            problems.append(f"classes outside 0-{width - 1}")
    return problems


# --- predictions: what a person gets back ---------------------------------------------------


def prediction_rows(
    classes: Iterable, probabilities: Iterable, labels: tuple[str, ...]
) -> Iterator[dict]:
    """One object per image, as `/predict` and batch prediction show it: class id, its label
    and every class's probability keyed by label."""
    for class_id, row in zip(classes, probabilities, strict=True):
        yield {
            "class_id": int(class_id),
            "label": labels[int(class_id)],
            "probabilities": dict(zip(labels, row, strict=True)),
        }


def to_json(content: Any) -> bytes:
    """The one JSON encoder of answers: numpy arrays and scalars go straight through orjson,
    so the service and batch prediction write the same bytes for the same numbers."""
    return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
