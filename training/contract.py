"""The one contract between training and serving.

Signature and tensor names, input shape and dtype, pixel preprocessing and class labels are
defined here once and imported by the export code, both serving backends and the tests.
"""

from __future__ import annotations

import numpy as np

SIGNATURE_NAME = "serving_default"
# The custom model_fn's PredictOutput key; TF exports it as a second signature besides the default.
PREDICT_OUTPUT_KEY = "classify"
INPUT_KEY = "image"
CLASSES_KEY = "classes"
PROBABILITIES_KEY = "probabilities"

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
