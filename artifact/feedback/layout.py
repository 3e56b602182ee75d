"""The store's layout on disk: file and folder names, the formats' constants, the errors,
and the low-level reads and writes every side of the store shares."""

from __future__ import annotations

import errno
import os
import re
import secrets
import socket
import struct
from collections.abc import Sequence
from pathlib import Path

from artifact.contract import IMAGE_HEIGHT, IMAGE_WIDTH

EXAMPLES_FILE = "examples.tfrecord"
COMMITTED_FILE = "committed.txt"
VERSIONS_FILE = "versions.txt"
PROVENANCE_FILE = "provenance.txt"
# The MNIST-format shards of earlier versions.
IMAGES_FILE = "train-images-idx3-ubyte"
LABELS_FILE = "train-labels-idx1-ubyte"
CLOSED_PREFIX = "shard-"
OPEN_PREFIX = ".open-"
NEW_PREFIX = ".new-"  # an open shard being created
COMPACT_PREFIX = ".compact-"  # a compacted shard being written
# The label's feature in each example: a name no signature's input is likely to have (the
# service refuses feedback for a signature with an input of this name).
LABEL_FEATURE = "feedback/label"
# A shard's format: tf.Example records, or the MNIST-format images of earlier versions.
EXAMPLES_FORMAT, IDX_FORMAT = "tf.Example", "idx"
# The sender of an example when no tokens are configured, and of images stored before senders
# were recorded.
ANONYMOUS = "anonymous"
UNKNOWN_SENDER = "unknown"
# A sender's name as stored: a token's name (service/security.py checks the same pattern).
SENDER_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
# What one image of an MNIST-format shard takes of its sender's share: its pixels and label.
SENDER_IMAGE_BYTES = 28 * 28 + 1
# A `.new-` (or `.compact-`) folder this old belongs to a writer that died while creating it.
STALE_NEW_SECONDS = 3600
# A refused request measures the store again when the last measure is this old.
REMEASURE_SECONDS = 10.0
IMAGES_MAGIC = 2051  # IDX: unsigned bytes, 3 dimensions
LABELS_MAGIC = 2049  # IDX: unsigned bytes, 1 dimension
IMAGES_HEADER = 16
LABELS_HEADER = 8
IMAGE_BYTES = IMAGE_HEIGHT * IMAGE_WIDTH
COMMITTED_DIGITS = 20  # committed.txt: the count in 20 digits and a newline, rewritten in place
# Errors that mean "no room" (a full disk, a quota, a file-size limit): the service answers 507.
NO_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_UNSAFE = re.compile(r"[^A-Za-z0-9_.]+")


class FeedbackFormatError(ValueError):
    """A closed shard is not what this module writes; the message names the file."""


class FeedbackStoreFull(Exception):
    """No room for a request (FEEDBACK_MAX_BYTES, or the disk): nothing of it was stored."""


class SenderShareFull(FeedbackStoreFull):
    """The request would take its sender past its share of the store (FEEDBACK_SENDER_SHARE):
    nothing of it was stored."""


class FeedbackWriteError(Exception):
    """The store could not be written; nothing of the request was stored. `cause`: the OSError."""

    def __init__(self, message: str, cause: OSError):
        super().__init__(message)
        self.cause = cause


def store_dir(feedback_dir: str | Path, model: str) -> Path:
    """Where one model's shards live."""
    return Path(feedback_dir) / model


def writer_id() -> str:
    """A name no other writer has: host, process and a random part."""
    host = _UNSAFE.sub("_", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


def _images_header(count: int) -> bytes:
    return struct.pack(">IIII", IMAGES_MAGIC, count, IMAGE_HEIGHT, IMAGE_WIDTH)


def _labels_header(count: int) -> bytes:
    return struct.pack(">II", LABELS_MAGIC, count)


def _committed(count: int) -> bytes:
    return f"{count:0{COMMITTED_DIGITS}d}\n".encode("ascii")


GONE_PREFIX = ".gone-"  # a closed shard being removed
COMPACTED_FROM_FILE = "compacted-from.txt"  # in a compacted shard: the shard it replaces
EXPIRE_LOCK_FILE = ".expire.lock"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise FeedbackFormatError(f"{path}: cannot read: {err.strerror or err}") from err


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as err:
        raise FeedbackFormatError(f"{path}: cannot read: {err.strerror or err}") from err


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode_versions(versions: Sequence[int | None]) -> bytes:
    """versions.txt lines for a request's examples."""
    return "".join(f"{v}\n" if v is not None else "\n" for v in versions).encode("ascii")


def _compacted_from(path: Path) -> str | None:
    try:
        name = (path / COMPACTED_FROM_FILE).read_text(encoding="ascii").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    return name if name.startswith(CLOSED_PREFIX) and "/" not in name else None
