"""What TensorFlow itself answers, for the live tests that hold the service's answers against
`tf.saved_model.load`: a signature's outputs, rows of features as the raw receiver's arrays,
and as serialized tf.Examples written by TensorFlow's own protos. Imports TensorFlow: only
live tests use it."""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def reference(loaded: dict, model: str, signature: str, **inputs) -> dict[str, np.ndarray]:
    """A loaded SavedModel's (`loaded[model]`) signature run on numpy inputs."""
    outputs = loaded[model].signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()})
    return {k: v.numpy() for k, v in outputs.items()}


def columns(rows: list[dict]) -> dict[str, np.ndarray]:
    """Rows of features as the raw receiver's arrays (float32, int64, bytes)."""
    out = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        if isinstance(values[0], str):
            out[key] = np.array([v.encode() for v in values], dtype=object)
        elif isinstance(values[0], int):
            out[key] = np.array(values, np.int64)
        else:
            out[key] = np.array(values, np.float32)
    return out


def tf_example(features: dict) -> tf.train.Example:
    """A tf.Example of features: strings as bytes, integers as int64, other numbers float."""
    feature = {}
    for key, value in features.items():
        if isinstance(value, str):
            feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
        elif isinstance(value, int):
            feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        else:
            feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
    return tf.train.Example(features=tf.train.Features(feature=feature))


def serialized(rows: list[dict]) -> np.ndarray:
    """Rows of features as a parsing receiver's input: serialized tf.Examples."""
    return np.array([tf_example(r).SerializeToString() for r in rows], dtype=object)
