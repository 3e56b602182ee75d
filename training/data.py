"""MNIST-format (IDX) data: validated file discovery and tf.data input functions.

The IDX files are checked in Python (magic numbers, counts, 28x28, labels 0-9, truncation) and
then read inside the TensorFlow graph, so the data set never becomes a graph constant: feeding
`from_tensor_slices` a numpy array inside an Estimator input_fn embeds all 47 MB of pixels in
graph.pbtxt and every checkpoint's .meta (614 MB of graph.pbtxt and 180 MB per checkpoint
.meta after 600 steps, measured with TF 2.15), and spends most of a minute at start.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import struct
from pathlib import Path

import numpy as np
import tensorflow as tf

from artifact.contract import IMAGE_HEIGHT, IMAGE_WIDTH, INPUT_KEY, NUM_CLASSES, normalize_pixels

# Defined beside UsageError (no TensorFlow there), still importable from here as before.
from training.errors import DataError

IMAGES_MAGIC = 2051  # 0x00000803: unsigned byte, 3 dimensions
LABELS_MAGIC = 2049  # 0x00000801: unsigned byte, 1 dimension
IMAGES_HEADER_BYTES = 16
LABELS_HEADER_BYTES = 8
DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"
SPLITS = {"train": "train", "test": "t10k"}


@dataclasses.dataclass(frozen=True)
class IdxSplit:
    """One validated split: an images file, a labels file and their example count."""

    images_path: str
    labels_path: str
    count: int


def _find(data_dir: Path, prefix: str, kind: str) -> Path:
    # Both spellings occur in the wild: train-images-idx3-ubyte and train-images.idx3-ubyte.
    ndim = 3 if kind == "images" else 1
    names = [f"{prefix}-{kind}-idx{ndim}-ubyte", f"{prefix}-{kind}.idx{ndim}-ubyte"]
    for name in names:
        for suffix in (".gz", ""):
            path = data_dir / (name + suffix)
            if path.is_file():
                return path
    raise DataError(f"{data_dir / (names[0] + '.gz')}: file not found (nor without .gz)")


def read_bytes(path: str | os.PathLike) -> bytes:
    """The file's bytes, gunzipped when it is gzip; DataError when unreadable or truncated."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise DataError(f"{path}: cannot read: {err.strerror}") from err
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except EOFError as err:
            raise DataError(f"{path}: truncated gzip stream") from err
        except (OSError, gzip.BadGzipFile) as err:
            raise DataError(f"{path}: corrupt gzip data: {err}") from err
    if path.suffix == ".gz":
        raise DataError(f"{path}: named .gz but is not gzip data")
    return raw


def parse_images(data: bytes, path: str | os.PathLike) -> np.ndarray:
    """Validate an IDX3 images file's bytes and return uint8 [count, 28, 28]."""
    if len(data) < IMAGES_HEADER_BYTES:
        raise DataError(f"{path}: too short for an IDX images header ({len(data)} bytes)")
    magic, count, rows, cols = struct.unpack(">IIII", data[:IMAGES_HEADER_BYTES])
    if magic != IMAGES_MAGIC:
        raise DataError(
            f"{path}: wrong magic number {magic:#010x}, expected {IMAGES_MAGIC:#010x} (IDX images)"
        )
    if (rows, cols) != (IMAGE_HEIGHT, IMAGE_WIDTH):
        raise DataError(f"{path}: images are {rows}x{cols}, expected {IMAGE_HEIGHT}x{IMAGE_WIDTH}")
    expected = IMAGES_HEADER_BYTES + count * rows * cols
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "has trailing bytes"
        raise DataError(
            f"{path}: {what}: header says {count} images ({expected} bytes), file has {len(data)}"
        )
    pixels = np.frombuffer(data, np.uint8, offset=IMAGES_HEADER_BYTES)
    return pixels.reshape(count, rows, cols)


def parse_labels(data: bytes, path: str | os.PathLike) -> np.ndarray:
    """Validate an IDX1 labels file's bytes and return uint8 [count] with values 0-9."""
    if len(data) < LABELS_HEADER_BYTES:
        raise DataError(f"{path}: too short for an IDX labels header ({len(data)} bytes)")
    magic, count = struct.unpack(">II", data[:LABELS_HEADER_BYTES])
    if magic != LABELS_MAGIC:
        raise DataError(
            f"{path}: wrong magic number {magic:#010x}, expected {LABELS_MAGIC:#010x} (IDX labels)"
        )
    expected = LABELS_HEADER_BYTES + count
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "has trailing bytes"
        raise DataError(
            f"{path}: {what}: header says {count} labels ({expected} bytes), file has {len(data)}"
        )
    labels = np.frombuffer(data, np.uint8, offset=LABELS_HEADER_BYTES)
    if count and labels.max() >= NUM_CLASSES:
        bad = int(np.argmax(labels >= NUM_CLASSES))
        raise DataError(
            f"{path}: label {labels[bad]} at index {bad} is outside 0-{NUM_CLASSES - 1}"
        )
    return labels


def read_images(path: str | os.PathLike) -> np.ndarray:
    """Read and validate an IDX images file (gzipped or not): uint8 [count, 28, 28]."""
    return parse_images(read_bytes(path), path)


def read_labels(path: str | os.PathLike) -> np.ndarray:
    """Read and validate an IDX labels file (gzipped or not): uint8 [count]."""
    return parse_labels(read_bytes(path), path)


def has_split(data_dir: str | os.PathLike, split: str) -> bool:
    """Whether a directory holds a split's images file ('train' or 'test'), either spelling."""
    try:
        _find(Path(data_dir), SPLITS[split], "images")
    except DataError:
        return False
    return True


def load_split(data_dir: str | os.PathLike, split: str) -> tuple[IdxSplit, np.ndarray, np.ndarray]:
    """Find, validate and read one split ('train' or 'test') of an MNIST-format directory.

    Returns:
        The split's description and its uint8 images [n, 28, 28] and labels [n].
    Raises:
        DataError: a file is missing, unreadable, truncated or not valid IDX, or the image
            and label counts differ.
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"{data_dir}: data directory not found")
    images_path = _find(data_dir, SPLITS[split], "images")
    labels_path = _find(data_dir, SPLITS[split], "labels")
    images = read_images(images_path)
    labels = read_labels(labels_path)
    if len(images) != len(labels):
        raise DataError(
            f"{images_path}: {len(images)} images but {labels_path.name} has {len(labels)} labels"
        )
    if len(images) == 0:
        raise DataError(f"{images_path}: holds no images")
    return IdxSplit(str(images_path), str(labels_path), len(images)), images, labels


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


def write_idx(
    directory: str | os.PathLike,
    split: str,
    images: np.ndarray,
    labels: np.ndarray,
    compress: bool = True,
) -> IdxSplit:
    """Write images and labels as an MNIST-format split (used to make subsets and test data)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    prefix = SPLITS[split]
    suffix = ".gz" if compress else ""
    opener = gzip.open if compress else open
    images_path = directory / f"{prefix}-images-idx3-ubyte{suffix}"
    labels_path = directory / f"{prefix}-labels-idx1-ubyte{suffix}"
    n, rows, cols = images.shape
    with opener(images_path, "wb") as f:
        f.write(struct.pack(">IIII", IMAGES_MAGIC, n, rows, cols))
        f.write(np.ascontiguousarray(images, dtype=np.uint8).tobytes())
    with opener(labels_path, "wb") as f:
        f.write(struct.pack(">II", LABELS_MAGIC, len(labels)))
        f.write(np.ascontiguousarray(labels, dtype=np.uint8).tobytes())
    return IdxSplit(str(images_path), str(labels_path), n)
