"""The records: a request's inputs and labels as tf.Example bytes."""

from __future__ import annotations

import numpy as np

from artifact import tf_example
from artifact.feedback.layout import LABEL_FEATURE

# --- the records --------------------------------------------------------------------------


def _feature_kind(dtype: np.dtype) -> str:
    if dtype.kind == "f":
        return tf_example.FLOAT
    if dtype.kind in "iub":
        return tf_example.INT64
    if dtype.kind in "OSU":
        return tf_example.BYTES
    raise ValueError(f"a tf.Example cannot hold values of dtype {dtype}")


def _byte_values(values: np.ndarray) -> list[bytes]:
    return [v if isinstance(v, bytes) else str(v).encode("utf-8") for v in values.tolist()]


def feedback_examples(inputs: dict[str, np.ndarray], labels: np.ndarray) -> list[bytes]:
    """One serialized tf.Example per instance: each input's values (flattened, by its dtype:
    float_list, int64_list or bytes_list) under its name, and the label under LABEL_FEATURE
    (int64 for a class id, float for a regressed value).

    Args:
        inputs: each input by name, [n, ...] (the batch dimension first).
        labels: [n] integer class ids or float values.
    Raises:
        ValueError: an input named LABEL_FEATURE, unequal batch sizes, or a dtype a
            tf.Example cannot hold.
    """
    if LABEL_FEATURE in inputs:
        raise ValueError(f"an input is named {LABEL_FEATURE!r}, the label's feature")
    labels = np.asarray(labels)
    count = len(labels)
    if any(len(value) != count for value in inputs.values()):
        raise ValueError(f"each input must hold {count} instances, one per label")
    label_kind = tf_example.INT64 if labels.dtype.kind in "iub" else tf_example.FLOAT
    kinds = {name: _feature_kind(value.dtype) for name, value in inputs.items()}
    records = []
    for i in range(count):
        features = {}
        for name, value in inputs.items():
            row = np.asarray(value[i]).ravel()
            kind = kinds[name]
            features[name] = (kind, _byte_values(row) if kind == tf_example.BYTES else row)
        features[LABEL_FEATURE] = (label_kind, [labels[i].item()])
        records.append(tf_example.encode_example(features))
    return records


def image_examples(images: np.ndarray, class_ids: np.ndarray, key: str) -> list[bytes]:
    """uint8 images [n, ...] as examples of float pixels in [0, 1] under `key` (what an image
    model's signature takes), with their class ids."""
    pixels = np.asarray(images, np.float32) / np.float32(255.0)
    return feedback_examples({key: pixels}, np.asarray(class_ids, np.int64))
