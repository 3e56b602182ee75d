"""Reading closed shards (the retrain job): their bookkeeping, their examples, and the shared
lock that holds the store against expiry while a reader streams it."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from artifact import tf_example, tfrecord
from artifact.contract import IMAGE_HEIGHT, IMAGE_WIDTH, NUM_CLASSES
from artifact.feedback.layout import (
    CLOSED_PREFIX,
    COMMITTED_FILE,
    EXAMPLES_FILE,
    EXAMPLES_FORMAT,
    EXPIRE_LOCK_FILE,
    IDX_FORMAT,
    IMAGE_BYTES,
    IMAGES_FILE,
    IMAGES_HEADER,
    IMAGES_MAGIC,
    LABELS_FILE,
    LABELS_HEADER,
    LABELS_MAGIC,
    PROVENANCE_FILE,
    SENDER_IMAGE_BYTES,
    SENDER_PATTERN,
    UNKNOWN_SENDER,
    VERSIONS_FILE,
    FeedbackFormatError,
    _compacted_from,
    _read,
    _size,
)

# --- reading (the retrain job) ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """A closed shard's bookkeeping, without its examples: how many, in which format, who
    sent each and when, and the version that answered each."""

    path: Path
    format: str  # EXAMPLES_FORMAT or IDX_FORMAT
    versions: tuple[int | None, ...]
    senders: tuple[str, ...]  # UNKNOWN_SENDER in MNIST-format shards older than provenance
    received_at: tuple[str | None, ...]  # as written: UTC, ISO 8601; None when not recorded
    example_bytes: float  # what one example takes on disk (the record file's share)

    def __len__(self) -> int:
        return len(self.versions)


@dataclasses.dataclass(frozen=True)
class Shard:
    """One closed MNIST-format shard's content (the format of earlier versions)."""

    path: Path
    images: np.ndarray  # uint8 [n, 28, 28]
    labels: np.ndarray  # uint8 [n], class ids
    versions: tuple[int | None, ...]  # the version that answered each image, when known
    # Who sent each image (UNKNOWN_SENDER in shards older than provenance) and when, as
    # written: UTC, ISO 8601 (None when not recorded).
    senders: tuple[str, ...] = ()
    received_at: tuple[str | None, ...] = ()

    def __len__(self) -> int:
        return len(self.labels)


def closed_shards(directory: str | Path) -> list[Path]:
    """A model's closed shards, oldest first (their names start with the closing time)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = sorted(
        p for p in directory.iterdir() if p.name.startswith(CLOSED_PREFIX) and p.is_dir()
    )
    # A shard a compaction replaced, still there after a crash: its examples are in the new one.
    replaced = {_compacted_from(p) for p in found}
    return [p for p in found if p.name not in replaced]


def shard_format(path: str | Path) -> str:
    """EXAMPLES_FORMAT, or IDX_FORMAT for an MNIST-format shard (one without examples)."""
    return IDX_FORMAT if (Path(path) / IMAGES_FILE).exists() else EXAMPLES_FORMAT


def read_info(path: str | Path) -> ShardInfo:
    """Read and check one closed shard's bookkeeping (the counts of its files agree), not its
    examples.

    Raises:
        FeedbackFormatError: a file is missing, unreadable, of another length than its count
            says, or not what this module writes (the message names it).
    """
    path = Path(path)
    if shard_format(path) == IDX_FORMAT:
        count = _idx_count(path)
        example_bytes = float(SENDER_IMAGE_BYTES)
    else:
        count = _read_committed(path / COMMITTED_FILE)
        size = _size(path / EXAMPLES_FILE)
        if count and size < count * tfrecord.RECORD_OVERHEAD:
            raise FeedbackFormatError(
                f"{path / EXAMPLES_FILE}: {size} bytes cannot hold the {count} records "
                f"{COMMITTED_FILE} says it has"
            )
        example_bytes = size / count if count else 0.0
    versions = _parse_versions(path / VERSIONS_FILE, count)
    senders, received = _parse_provenance(path / PROVENANCE_FILE, count)
    return ShardInfo(path, shard_format(path), versions, senders, received, example_bytes)


def read_records(path: str | Path) -> list[bytes]:
    """The serialized tf.Examples of one closed tf.Example shard, in order, every CRC checked.

    Raises:
        FeedbackFormatError: a record is torn or damaged, or there are not as many as
            committed.txt says.
    """
    path = Path(path)
    count = _read_committed(path / COMMITTED_FILE)
    data = _read(path / EXAMPLES_FILE)
    try:
        spans = tfrecord.record_spans(data)
    except tfrecord.RecordError as err:
        raise FeedbackFormatError(f"{path / EXAMPLES_FILE}: {err}") from err
    if len(spans) != count:
        raise FeedbackFormatError(
            f"{path / EXAMPLES_FILE}: {len(spans)} records, {COMMITTED_FILE} says {count}"
        )
    return [data[start : start + length] for start, length in spans]


def read_examples(path: str | Path) -> list[dict[str, tuple[str, list]]]:
    """The decoded tf.Examples of one closed tf.Example shard (tools and tests; the retrain
    reads the records with TensorFlow)."""
    return [tf_example.decode_example(record) for record in read_records(path)]


def read_shard(path: str | Path) -> Shard:
    """Read and check one closed MNIST-format shard (the format of earlier versions).

    Raises:
        FeedbackFormatError: a file is missing, unreadable, truncated or not what this module
            writes (the message names it), or the shard holds tf.Examples.
    """
    path = Path(path)
    if shard_format(path) != IDX_FORMAT:
        raise FeedbackFormatError(f"{path}: holds tf.Examples, not MNIST-format images")
    images_data = _read(path / IMAGES_FILE)
    labels_data = _read(path / LABELS_FILE)
    count = _check_idx(path, images_data, len(images_data), labels_data, len(labels_data))
    labels = np.frombuffer(labels_data, np.uint8, offset=LABELS_HEADER)
    if count and labels.max() >= NUM_CLASSES:
        raise FeedbackFormatError(f"{path / LABELS_FILE}: a label is outside 0-{NUM_CLASSES - 1}")
    images = np.frombuffer(images_data, np.uint8, offset=IMAGES_HEADER)
    versions = _parse_versions(path / VERSIONS_FILE, count)
    senders, received = _parse_provenance(path / PROVENANCE_FILE, count)
    return Shard(
        path, images.reshape(count, IMAGE_HEIGHT, IMAGE_WIDTH), labels, versions, senders, received
    )


def _check_idx(
    path: Path, images_head: bytes, images_size: int, labels_head: bytes, labels_size: int
) -> int:
    """The image count of an MNIST-format shard from its two headers and file sizes (they
    agree, or FeedbackFormatError names the file)."""
    if len(images_head) < IMAGES_HEADER or len(labels_head) < LABELS_HEADER:
        raise FeedbackFormatError(f"{path}: an IDX header is truncated")
    magic, count, rows, cols = struct.unpack(">IIII", images_head[:IMAGES_HEADER])
    if magic != IMAGES_MAGIC or (rows, cols) != (IMAGE_HEIGHT, IMAGE_WIDTH):
        raise FeedbackFormatError(f"{path / IMAGES_FILE}: not an IDX file of 28x28 images")
    if images_size != IMAGES_HEADER + count * IMAGE_BYTES:
        raise FeedbackFormatError(
            f"{path / IMAGES_FILE}: header says {count} images, the file has {images_size} bytes"
        )
    magic, label_count = struct.unpack(">II", labels_head[:LABELS_HEADER])
    if magic != LABELS_MAGIC or labels_size != LABELS_HEADER + label_count:
        raise FeedbackFormatError(f"{path / LABELS_FILE}: not an IDX labels file of its length")
    if label_count != count:
        raise FeedbackFormatError(f"{path}: {count} images but {label_count} labels")
    return count


def _idx_count(path: Path) -> int:
    """An MNIST-format shard's count from its headers and file sizes, without its pixels."""
    heads, sizes = [], []
    for name, header in ((IMAGES_FILE, IMAGES_HEADER), (LABELS_FILE, LABELS_HEADER)):
        try:
            with open(path / name, "rb") as f:
                heads.append(f.read(header))
                sizes.append(os.fstat(f.fileno()).st_size)
        except OSError as err:
            raise FeedbackFormatError(f"{path / name}: cannot read: {err.strerror or err}") from err
    return _check_idx(path, heads[0], sizes[0], heads[1], sizes[1])


def _read_committed(path: Path) -> int:
    text = _read(path)
    try:
        return int(text.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError) as err:
        raise FeedbackFormatError(
            f"{path}: expected a count of examples, got {text[:40]!r}"
        ) from err


def _parse_versions(path: Path, count: int) -> tuple[int | None, ...]:
    if not path.is_file():
        return (None,) * count
    lines = _read(path).decode("ascii", errors="replace").split("\n")
    if lines[-1] == "":
        lines.pop()
    if len(lines) != count or not all(line == "" or line.isdigit() for line in lines):
        raise FeedbackFormatError(f"{path}: expected {count} lines of version numbers")
    return tuple(int(line) if line else None for line in lines)


def _parse_provenance(path: Path, count: int) -> tuple[tuple[str, ...], tuple[str | None, ...]]:
    if not path.is_file():
        return (UNKNOWN_SENDER,) * count, (None,) * count
    lines = _read(path).decode("ascii", errors="replace").split("\n")
    if lines[-1] == "":
        lines.pop()
    if len(lines) != count:
        raise FeedbackFormatError(f"{path}: expected {count} lines of `<received at> <sender>`")
    senders, received = [], []
    for number, line in enumerate(lines, 1):
        when, _, sender = line.partition(" ")
        if not SENDER_PATTERN.fullmatch(sender) or not _is_time(when):
            raise FeedbackFormatError(
                f"{path}:{number}: expected `<received at, UTC ISO 8601> <sender>`, got "
                f"{line[:80]!r}"
            )
        senders.append(sender)
        received.append(when)
    return tuple(senders), tuple(received)


def _is_time(text: str) -> bool:
    try:
        dt.datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


def provenance_line(sender: str, received_at: dt.datetime) -> bytes:
    """One provenance.txt line: `<received at> <sender>`.

    Raises:
        ValueError: the sender's name does not match SENDER_PATTERN.
    """
    if not SENDER_PATTERN.fullmatch(sender):
        raise ValueError(f"a sender's name must match {SENDER_PATTERN.pattern}, got {sender!r}")
    when = received_at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{when} {sender}\n".encode("ascii")


@contextlib.contextmanager
def reading(directory: str | Path) -> Iterator[None]:
    """Hold the store against expiry while a reader streams its shards: a shared flock on
    `.expire.lock` (made when the store is writable), which `expire` takes exclusively (it
    waits). A read-only store that was never expired has no lock file: it is read unlocked."""
    path = Path(directory) / EXPIRE_LOCK_FILE
    fd = None
    for flags in (os.O_RDONLY | os.O_CREAT, os.O_RDONLY):
        with contextlib.suppress(OSError):
            fd = os.open(path, flags, 0o644)
            break
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        if fd is not None:
            os.close(fd)
