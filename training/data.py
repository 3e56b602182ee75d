"""MNIST-format (IDX) data: validated file discovery and tf.data input functions.

The IDX files are checked in Python (magic numbers, counts, 28x28, labels 0-9, truncation) and
then read inside the TensorFlow graph, so the data set never becomes a graph constant: feeding
`from_tensor_slices` a numpy array inside an Estimator input_fn embeds all 47 MB of pixels in
graph.pbtxt and every checkpoint's .meta (614 MB of graph.pbtxt and 180 MB per checkpoint
.meta after 600 steps, measured with TF 2.15), and spends most of a minute at start.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from artifact.contract import IMAGE_HEIGHT, IMAGE_WIDTH, INPUT_KEY, normalize_pixels

# The files' checks and their reading and writing need no TensorFlow: artifact/idx.py, shared
# with the feedback store and the service side's tests; importable from here as before.
from artifact.idx import (  # noqa: F401
    DEFAULT_DATA_DIR,
    IMAGES_HEADER_BYTES,
    IMAGES_MAGIC,
    LABELS_HEADER_BYTES,
    LABELS_MAGIC,
    SPLITS,
    DataError,
    IdxSplit,
    has_split,
    load_split,
    parse_images,
    parse_labels,
    read_bytes,
    read_images,
    read_labels,
    write_idx,
)


def _is_gzip(path: str) -> bool:
    # By content, as read_bytes() decides: a gzipped file need not be named .gz.
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _decode_idx(path: str, header_bytes: int):
    """Graph ops that read one IDX file and return its payload as a flat uint8 tensor."""
    data = tf.io.read_file(path)
    if _is_gzip(path):
        data = tf.io.decode_compressed(data, compression_type="GZIP")
    return tf.io.decode_raw(tf.strings.substr(data, header_bytes, -1), tf.uint8)


def dataset(split: IdxSplit):
    """A tf.data.Dataset of ({'image': float32 [28, 28]}, int32 label) for a validated split.

    The pixels are read by graph ops from the files (not embedded as constants), sliced with
    `from_tensor_slices` and mapped through the shared `normalize_pixels`.
    """
    images = tf.reshape(
        _decode_idx(split.images_path, IMAGES_HEADER_BYTES),
        [split.count, IMAGE_HEIGHT, IMAGE_WIDTH],
    )
    labels = _decode_idx(split.labels_path, LABELS_HEADER_BYTES)
    ds = tf.data.Dataset.from_tensor_slices((images, labels))
    return ds.map(
        lambda image, label: ({INPUT_KEY: normalize_pixels(image)}, tf.cast(label, tf.int32)),
        num_parallel_calls=tf.data.AUTOTUNE,
    )


def train_input_fn(split: IdxSplit, batch_size: int, seed: int | None = None):
    """Training input: cached, shuffled each epoch, batched, repeated forever, prefetched."""
    return (
        dataset(split)
        .cache()
        .shuffle(min(split.count, 60_000), seed=seed, reshuffle_each_iteration=True)
        .batch(batch_size)
        .repeat()
        .prefetch(tf.data.AUTOTUNE)
    )


def eval_input_fn(split: IdxSplit, batch_size: int):
    """Evaluation input: one pass over the split in order."""
    return dataset(split).batch(batch_size).prefetch(tf.data.AUTOTUNE)


def predict_input_fn(images: np.ndarray, batch_size: int):
    """Prediction input over uint8 or float images already in memory (batch prediction)."""
    if images.dtype == np.uint8:
        images = normalize_pixels(images)
    ds = tf.data.Dataset.from_tensor_slices({INPUT_KEY: images.astype(np.float32)})
    return ds.batch(batch_size)
