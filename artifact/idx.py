"""MNIST-format (IDX) files without TensorFlow: found, validated, read and written.

Both sides read this format: the trainer's data (training/data.py builds its tf.data input
functions on these checks) and the feedback store's shards (artifact/feedback/); the tests
of either side make small MNIST-format folders with `write_idx`. Every check names the file
and what is wrong with it (`DataError`).
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import struct
from pathlib import Path

import numpy as np

from artifact.contract import IMAGE_HEIGHT, IMAGE_WIDTH, NUM_CLASSES


class DataError(Exception):
    """A data file is missing or not valid; the message names the file and the problem."""


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
