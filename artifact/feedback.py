"""Labeled feedback from production, stored as tf.Example records in TFRecord shards.

The format is the contract between the service, which writes it (`POST
/v1/models/{name}/feedback`, FEEDBACK_DIR), and the retrain job, which reads it
(`python -m training retrain --feedback-dir`). No TensorFlow here: both sides import it, and
the service writes the TFRecord framing and the tf.Examples itself (artifact/tfrecord.py,
artifact/tf_example.py).

    <FEEDBACK_DIR>/<model name>/
        shard-<closed at, UTC>-<writer>-<n>/    a closed shard: complete, never written again
            examples.tfrecord                   one tf.Example per labeled instance: each input
                                                of the signature under its name (its values
                                                flattened: float_list, int64_list or
                                                bytes_list by its dtype), and the label under
                                                `feedback/label` (a class id, int64, or a
                                                regressed value, float)
            committed.txt                       how many examples the shard holds
            versions.txt                        one line per example: the model version that
                                                answered it, empty when the client did not say
            provenance.txt                      one line per example: `<received at> <sender>`,
                                                the time in UTC (ISO 8601, seconds) and the
                                                sender's name (a token's name, never the
                                                token; `anonymous` without tokens)
            compacted-from.txt                  in a compacted shard: the shard it replaces
        .open-<writer>/                         a writer's current shard (the same files)
        .compact-<name>/, .gone-<name>/         a compacted shard being written, a removed one
                                                being deleted

Shards of the versions before tf.Example (28x28 images only) are MNIST-format folders
instead: train-images-idx3-ubyte and train-labels-idx1-ubyte (IDX, the class ids), with the
same versions.txt and provenance.txt (absent in shards older than provenance: their images
read with the sender `unknown` and no time). They are still read, recovered, expired and
compacted; nothing writes new ones.

Each writer (one per service process; several replicas may share the folder) appends to its
own open shard and renames it to a closed shard every `shard_examples` examples; the rename
is atomic, so a reader never sees half a shard. An append is durable before it is
acknowledged: the framed records, the versions and the provenance lines are written past the
committed end and fsynced, then the count in committed.txt is raised and fsynced: that count
is the commit (in an MNIST-format shard, the two IDX headers' counts). After a crash, a writer
cuts the shard back to the smallest of the committed count, the whole records (their CRCs
checked) and the lines, so a crash loses at most the request being written. A writer holds an
exclusive flock on its open shard's examples (or images) file while it lives; a writer that
finds another writer's open shard unlocked (its process died) recovers it and closes it. The
folder must be on a filesystem with working locks (local disks, NFSv4, CephFS, EFS).

Old examples are expired (`expire`, below; `python -m training expire-feedback`): a shard
whose examples are all too old is renamed away (`.gone-`) and deleted; a shard with some is
compacted: a new shard is written under a `.compact-` name, its files and folder fsynced,
renamed into place (its compacted-from.txt names the shard it replaces, which readers then
skip), and only then is the old one removed. A crash at any point loses no kept example and
leaves no half shard under a `shard-` name; the next expiry finishes or undoes the rest. A
retrain reading the store holds a shared flock on `.expire.lock` (when it exists), which
expiry takes exclusively: shards do not vanish under a retrain streaming them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import errno
import fcntl
import os
import re
import secrets
import shutil
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from artifact import tf_example, tfrecord
from artifact.contract import IMAGE_HEIGHT, IMAGE_WIDTH, NUM_CLASSES

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


# --- a sender's share ---------------------------------------------------------------------


@dataclasses.dataclass
class SenderTally:
    """Examples and bytes per sender."""

    examples: Counter = dataclasses.field(default_factory=Counter)
    bytes: Counter = dataclasses.field(default_factory=Counter)

    def add(self, other: SenderTally) -> None:
        self.examples.update(other.examples)
        self.bytes.update(other.bytes)


def sender_tally(directory: str | Path, cache: dict[str, SenderTally] | None = None) -> SenderTally:
    """Examples and bytes per sender in a model's store: every closed shard and every
    writer's open one (read as it is now: an open shard's lines past its commit may count, a
    bound, not a record). A sender's bytes are its examples times the shard's bytes per
    example (an MNIST-format image: SENDER_IMAGE_BYTES). `cache` (shard name -> tally) spares
    reading a closed shard twice: closed shards never change; entries of shards gone are
    dropped."""
    directory = Path(directory)
    total = SenderTally()
    if not directory.is_dir():
        return total
    seen = set()
    for path in directory.iterdir():
        closed = path.name.startswith(CLOSED_PREFIX)
        if not (closed or path.name.startswith(OPEN_PREFIX)):
            continue
        tally: SenderTally | None
        if closed and cache is not None and path.name in cache:
            tally = cache[path.name]
        else:
            tally = _tally_shard(path)
            if tally is None:
                continue  # renamed or removed under us
            if closed and cache is not None:
                cache[path.name] = tally
        seen.add(path.name)
        total.add(tally)
    if cache is not None:
        for name in set(cache) - seen:
            del cache[name]
    return total


def _tally_shard(shard: Path) -> SenderTally | None:
    idx = (shard / IMAGES_FILE).exists()
    try:
        text = (shard / PROVENANCE_FILE).read_bytes()
    except FileNotFoundError:
        if not idx:
            return None
        try:  # a shard older than provenance: its images are the unknown sender's
            size = os.stat(shard / LABELS_FILE).st_size
        except FileNotFoundError:
            return None
        images = max(size - LABELS_HEADER, 0)
        return SenderTally(
            Counter({UNKNOWN_SENDER: images}),
            Counter({UNKNOWN_SENDER: images * SENDER_IMAGE_BYTES}),
        )
    except OSError:
        return None
    # Complete lines only: an open shard's last line may be half written.
    examples = Counter(
        line.partition(b" ")[2].decode("ascii", "replace") for line in text.split(b"\n")[:-1]
    )
    if idx:
        per_example = float(SENDER_IMAGE_BYTES)
    else:
        try:
            size = os.stat(shard / EXAMPLES_FILE).st_size
        except OSError:
            return None
        per_example = size / max(sum(examples.values()), 1)
    return SenderTally(
        examples, Counter({sender: round(n * per_example) for sender, n in examples.items()})
    )


def store_bytes(directory: str | Path) -> int:
    """Bytes the store's files take (closed and open shards of every writer)."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            # A shard closed (renamed) under us is counted at its new name or not at all.
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


# --- writing (the service) --------------------------------------------------------------------


def check_writable_dir(path: str | Path) -> None:
    """Create the folder if needed and prove it writable (a file written, fsynced, removed).

    Raises:
        OSError: it cannot be created or written (read-only filesystem, a file in the way).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".probe-{writer_id()}"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, b"ok")
        os.fsync(fd)
    finally:
        os.close(fd)
        probe.unlink()


@dataclasses.dataclass(frozen=True)
class Appended:
    """What one append did: how many examples the open shard holds now, and the shard it
    closed."""

    count: int
    closed: Path | None


def _line_end(text: bytes, count: int) -> int:
    """The offset just past the first `count` lines of text."""
    end = 0
    for _ in range(count):
        end = text.index(b"\n", end) + 1
    return end


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


def _closed_name(writer: str, sequence: int) -> str:
    closed_at = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return f"{CLOSED_PREFIX}{closed_at}-{writer}-{sequence}"


def encode_versions(versions: Sequence[int | None]) -> bytes:
    """versions.txt lines for a request's examples."""
    return "".join(f"{v}\n" if v is not None else "\n" for v in versions).encode("ascii")


def _open_files(path: Path, names: Sequence[str], optional: Sequence[str] = ()) -> dict | None:
    """The shard's files opened for writing, the first one flocked; None when its writer
    still holds it, or a file is missing (left alone: nothing is deleted that is not
    understood)."""
    fds = {}
    try:
        for name in names:
            fds[name] = os.open(path / name, os.O_RDWR)
        for name in optional:
            with contextlib.suppress(FileNotFoundError):
                fds[name] = os.open(path / name, os.O_RDWR)
        fcntl.flock(fds[names[0]], fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, FileNotFoundError):
        for fd in fds.values():
            os.close(fd)
        return None
    return fds


def _lines_read(fd: int | None) -> bytes:
    return b"" if fd is None else os.pread(fd, os.fstat(fd).st_size, 0)


class _OpenShard:
    """A writer's open shard: its files at their committed ends, the first one locked."""

    def __init__(self, path: Path, fds: dict[str, int]):
        self.path = path
        self.fds = fds
        self.count = 0
        self.versions_end = 0
        self.provenance_end = 0

    @classmethod
    def adopt(cls, path: Path) -> _OpenShard | None:
        """Lock another writer's open shard (of either format) and bring it back to its last
        commit; None when its writer still holds it, or it is not a shard this module wrote."""
        shard_type = _IdxOpenShard if (path / IMAGES_FILE).exists() else _ExampleOpenShard
        fds = _open_files(path, shard_type.FILES, (PROVENANCE_FILE,))
        if fds is None:
            return None
        shard = shard_type(path, fds)
        try:
            shard.recover()
        except BaseException:
            shard.release()
            raise
        return shard

    def _line_counts(self, limit: int) -> tuple[int, bytes, bytes]:
        """The smallest of the lines' counts and `limit`, and the lines' texts."""
        versions = _lines_read(self.fds[VERSIONS_FILE])
        provenance = _lines_read(self.fds.get(PROVENANCE_FILE))
        counts = [versions.count(b"\n"), limit]
        if PROVENANCE_FILE in self.fds:
            counts.append(provenance.count(b"\n"))
        return min(counts), versions, provenance

    def _cut_lines(self, count: int, versions: bytes, provenance: bytes) -> None:
        self.versions_end = _line_end(versions, count)
        os.ftruncate(self.fds[VERSIONS_FILE], self.versions_end)
        if PROVENANCE_FILE in self.fds:
            self.provenance_end = _line_end(provenance, count)
            os.ftruncate(self.fds[PROVENANCE_FILE], self.provenance_end)

    def recover(self) -> None:
        """Truncate every file to the last commit (a whole one: the smallest of the counts
        its files hold) and fsync."""
        raise NotImplementedError

    def close_as(self, target: Path) -> None:
        """Rename to a closed shard (atomic), then release the files and the lock."""
        os.rename(self.path, target)
        _fsync_dir(target.parent)
        self.path = target
        self.release()

    def release(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}


class _ExampleOpenShard(_OpenShard):
    """An open tf.Example shard: its records, committed count, versions and provenance."""

    FILES = (EXAMPLES_FILE, COMMITTED_FILE, VERSIONS_FILE)

    def __init__(self, path: Path, fds: dict[str, int]):
        super().__init__(path, fds)
        self.examples_end = 0

    @classmethod
    def create(cls, path: Path) -> _ExampleOpenShard:
        """A new empty shard at path, locked; built under a `.new-` name and renamed, so other
        writers only ever see complete, locked open shards."""
        staging = path.with_name(NEW_PREFIX + path.name[len(OPEN_PREFIX) :])
        staging.mkdir()
        fds = {}
        try:
            for name, content in (
                (EXAMPLES_FILE, b""),
                (COMMITTED_FILE, _committed(0)),
                (VERSIONS_FILE, b""),
                (PROVENANCE_FILE, b""),
            ):
                fds[name] = os.open(staging / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                if name == EXAMPLES_FILE:
                    fcntl.flock(fds[name], fcntl.LOCK_EX | fcntl.LOCK_NB)
                _pwrite_all(fds[name], content, 0)
                os.fsync(fds[name])
            _fsync_dir(staging)
            os.rename(staging, path)
            _fsync_dir(path.parent)
        except BaseException:
            for fd in fds.values():
                os.close(fd)
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return cls(path, fds)

    def recover(self) -> None:
        examples, committed = self.fds[EXAMPLES_FILE], self.fds[COMMITTED_FILE]
        try:
            recorded = int(os.pread(committed, COMMITTED_DIGITS + 1, 0).decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            recorded = 0  # torn before its first commit
        count, versions, provenance = self._line_counts(recorded)
        count, end = tfrecord.whole_records(_lines_read(examples), count)
        self._cut_lines(count, versions, provenance)
        self._commit_at(count, end)

    def roll_back(self) -> None:
        """Back to the last commit this writer made (a failed append's bytes cut away)."""
        os.ftruncate(self.fds[VERSIONS_FILE], self.versions_end)
        os.ftruncate(self.fds[PROVENANCE_FILE], self.provenance_end)
        self._commit_at(self.count, self.examples_end)

    def _commit_at(self, count: int, examples_end: int) -> None:
        """The records cut at examples_end, `count` committed, every file fsynced."""
        os.ftruncate(self.fds[EXAMPLES_FILE], examples_end)
        _pwrite_all(self.fds[COMMITTED_FILE], _committed(count), 0)
        os.ftruncate(self.fds[COMMITTED_FILE], COMMITTED_DIGITS + 1)
        for fd in self.fds.values():
            os.fsync(fd)
        self.count, self.examples_end = count, examples_end

    def append(self, records: bytes, versions: bytes, provenance: bytes, added: int) -> None:
        """Write past the committed end, fsync, then commit by raising the committed count."""
        fds = self.fds
        _pwrite_all(fds[EXAMPLES_FILE], records, self.examples_end)
        _pwrite_all(fds[VERSIONS_FILE], versions, self.versions_end)
        _pwrite_all(fds[PROVENANCE_FILE], provenance, self.provenance_end)
        for name in (EXAMPLES_FILE, VERSIONS_FILE, PROVENANCE_FILE):
            os.fsync(fds[name])
        count = self.count + added
        _pwrite_all(fds[COMMITTED_FILE], _committed(count), 0)
        os.fsync(fds[COMMITTED_FILE])
        self.count = count
        self.examples_end += len(records)
        self.versions_end += len(versions)
        self.provenance_end += len(provenance)


class _IdxOpenShard(_OpenShard):
    """An MNIST-format shard an earlier version's writer left open: only recovered and
    closed, never appended to (one older than provenance has no provenance.txt)."""

    FILES = (IMAGES_FILE, LABELS_FILE, VERSIONS_FILE)

    def recover(self) -> None:
        images, labels = self.fds[IMAGES_FILE], self.fds[LABELS_FILE]
        images_size, labels_size = os.fstat(images).st_size, os.fstat(labels).st_size
        counts = [
            max(images_size - IMAGES_HEADER, 0) // IMAGE_BYTES,
            max(labels_size - LABELS_HEADER, 0),
        ]
        for fd, size, header in (
            (images, images_size, IMAGES_HEADER),
            (labels, labels_size, LABELS_HEADER),
        ):
            counts.append(struct.unpack(">I", os.pread(fd, 4, 4))[0] if size >= header else 0)
        count, versions, provenance = self._line_counts(min(counts))
        os.ftruncate(images, IMAGES_HEADER + count * IMAGE_BYTES)
        os.ftruncate(labels, LABELS_HEADER + count)
        self._cut_lines(count, versions, provenance)
        os.pwrite(images, _images_header(count), 0)
        os.pwrite(labels, _labels_header(count), 0)
        for fd in self.fds.values():
            os.fsync(fd)
        self.count = count


class FeedbackWriter:
    """Appends labeled examples to one model's store: durable, rotated, bounded; thread-safe.

    Args:
        directory: the model's store (store_dir(FEEDBACK_DIR, model)).
        shard_examples: close the open shard once it holds this many examples.
        max_bytes: refuse a request that would take the store (every writer's files) past
            this size.
        writer: this writer's name (default: host, pid and a random part).
        max_sender_bytes: refuse a request that would take its sender's examples in the store
            (every writer's) past this many bytes; None: no share.
        clock: seconds, for how old a measure of the store is (time.monotonic).
    """

    def __init__(
        self,
        directory: str | Path,
        shard_examples: int,
        max_bytes: int,
        writer: str | None = None,
        max_sender_bytes: int | None = None,
        clock=time.monotonic,
    ):
        if shard_examples < 1 or max_bytes < 1:
            raise ValueError("shard_examples and max_bytes must be positive")
        if max_sender_bytes is not None and max_sender_bytes < 1:
            raise ValueError("max_sender_bytes must be positive")
        self.directory = Path(directory)
        self.shard_examples = shard_examples
        self.max_bytes = max_bytes
        self.max_sender_bytes = max_sender_bytes
        self.writer = writer or writer_id()
        self._clock = clock
        self._lock = threading.Lock()
        self._shard: _ExampleOpenShard | None = None
        self._sequence = 0
        self._opened = False
        self._used = 0
        self._senders = SenderTally()
        self._sender_cache: dict[str, SenderTally] = {}
        self._measured = 0.0
        self.recovered: list[Path] = []

    @property
    def used_bytes(self) -> int:
        """The store's size as this writer last measured it, plus its own writes since."""
        return self._used

    def open(self) -> None:
        """Create the folder, recover the open shards of dead writers, measure the store.

        Raises:
            OSError: the folder cannot be created or written.
        """
        with self._lock:
            # Proves the folder writable now, not at the first request.
            check_writable_dir(self.directory)
            self._recover_dead_writers()
            self._measure()
            self._opened = True

    def sender_examples(self, sender: str) -> int:
        """A sender's examples in the store, as this writer last measured it plus its own
        writes since."""
        return self._senders.examples[sender]

    def sender_bytes(self, sender: str) -> int:
        """A sender's bytes in the store (sender_tally's), as last measured plus its writes."""
        return self._senders.bytes[sender]

    def _measure(self) -> None:
        """The store's bytes and examples per sender, afresh (other writers add to it, the
        retrain job expires and compacts it)."""
        self._used = store_bytes(self.directory)
        self._senders = sender_tally(self.directory, self._sender_cache)
        self._measured = self._clock()

    def _refusal(
        self, sender: str, added: int, added_bytes: int, need: int
    ) -> FeedbackStoreFull | None:
        if self._used + need > self.max_bytes:
            return FeedbackStoreFull(
                f"the feedback store {self.directory} holds {self._used:,} bytes; "
                f"{added} more examples would take it past FEEDBACK_MAX_BYTES="
                f"{self.max_bytes:,}: nothing was stored (the retrain job expires old shards, "
                "--feedback-max-age-days; or delete those it no longer needs to make room)"
            )
        held = self._senders.bytes[sender]
        if self.max_sender_bytes is not None and held + added_bytes > self.max_sender_bytes:
            return SenderShareFull(
                f"the sender {sender} has {self._senders.examples[sender]:,} examples "
                f"({held:,} bytes) in the feedback store {self.directory}; {added} more "
                f"({added_bytes:,} bytes) would take it past its share, "
                f"{self.max_sender_bytes:,} bytes (FEEDBACK_SENDER_SHARE of "
                "FEEDBACK_MAX_BYTES): nothing was stored"
            )
        return None

    def _recover_dead_writers(self) -> None:
        cutoff = time.time() - STALE_NEW_SECONDS
        for path in self.directory.glob(NEW_PREFIX + "*"):
            if path.is_dir() and path.stat().st_mtime < cutoff:
                shutil.rmtree(path, ignore_errors=True)  # never committed anything
        own = OPEN_PREFIX + self.writer
        for path in sorted(self.directory.glob(OPEN_PREFIX + "*")):
            if path.name == own or not path.is_dir():
                continue
            shard = _OpenShard.adopt(path)
            if shard is None:
                continue  # its writer is alive
            dead = path.name[len(OPEN_PREFIX) :]
            if shard.count:
                target = self.directory / _closed_name(dead, 0)
                shard.close_as(target)
                self.recovered.append(target)
            else:
                shard.release()
                shutil.rmtree(path, ignore_errors=True)

    def append(
        self,
        records: Sequence[bytes],
        versions: Sequence[int | None],
        sender: str = ANONYMOUS,
        received_at: dt.datetime | None = None,
    ) -> Appended:
        """Store examples; returns once they are on disk (fsynced).

        Args:
            records: serialized tf.Examples (feedback_examples'), one per example.
            versions: the version that answered each example, or None.
            sender: who sent them (a token's name; ANONYMOUS without tokens).
            received_at: when (default: now).
        Raises:
            FeedbackStoreFull: the request would take the store past max_bytes, or the disk
                (or a quota) is full; nothing of it was stored.
            SenderShareFull: it would take its sender past max_sender_bytes; nothing stored.
            FeedbackWriteError: any other write failure; nothing of it was stored.
        """
        if len(versions) != len(records):
            raise ValueError("one version (or None) per example")
        added = len(records)
        record_bytes = tfrecord.frame_many(records)
        version_bytes = encode_versions(versions)
        provenance_bytes = provenance_line(sender, received_at or dt.datetime.now(dt.UTC)) * added
        written = len(record_bytes) + len(version_bytes) + len(provenance_bytes)
        with self._lock:
            if not self._opened:
                raise RuntimeError("FeedbackWriter.open() was not called")
            need = written + (COMMITTED_DIGITS + 1 if self._shard is None else 0)
            refusal = self._refusal(sender, added, len(record_bytes), need)
            if refusal is not None and self._clock() - self._measured >= REMEASURE_SECONDS:
                # Room may have been made since (expiry, compaction, an operator).
                self._measure()
                refusal = self._refusal(sender, added, len(record_bytes), need)
            if refusal is not None:
                raise refusal
            try:
                if self._shard is None:
                    self._shard = self._open_shard()
                self._shard.append(record_bytes, version_bytes, provenance_bytes, added)
            except OSError as err:
                self._roll_back()
                if err.errno in NO_SPACE_ERRNOS:
                    raise FeedbackStoreFull(
                        f"no room to store feedback in {self.directory}: "
                        f"{err.strerror or err}; nothing of this request was stored"
                    ) from err
                raise FeedbackWriteError(
                    f"cannot store feedback in {self.directory}: {err.strerror or err}; "
                    "nothing of this request was stored",
                    err,
                ) from err
            self._used += written
            self._senders.examples[sender] += added
            self._senders.bytes[sender] += len(record_bytes)
            count, closed = self._shard.count, None
            if count >= self.shard_examples:
                closed = self._rotate()
            return Appended(count, closed)

    def _open_shard(self) -> _ExampleOpenShard:
        """A new open shard; or this writer's own, let go after a failed roll back, taken
        back at its last commit."""
        path = self.directory / (OPEN_PREFIX + self.writer)
        if path.is_dir():
            shard = _OpenShard.adopt(path)
            if isinstance(shard, _ExampleOpenShard):
                return shard
            if shard is not None:
                shard.release()
            raise OSError(errno.EEXIST, f"{path} is in the way of this writer's open shard")
        shard = _ExampleOpenShard.create(path)
        self._used += COMMITTED_DIGITS + 1
        return shard

    def _roll_back(self) -> None:
        """After a failed append: back to the last commit; a shard that cannot is let go."""
        shard = self._shard
        if shard is None:
            return
        try:
            shard.roll_back()
        except OSError:
            # Released: this writer takes it back at its commit on its next append (or the
            # next writer to open the store, when this one dies first).
            shard.release()
            self._shard = None

    def _rotate(self) -> Path | None:
        shard = self._shard
        if shard is None:
            return None
        self._sequence += 1
        target = self.directory / _closed_name(self.writer, self._sequence)
        try:
            shard.close_as(target)
        except OSError:
            return None  # stays open; tried again after the next append
        self._shard = None
        # Other writers add to the store too: measured afresh once a shard.
        self._measure()
        return target

    def close(self) -> Path | None:
        """Close the open shard (when it holds anything) so the retrain job can read it."""
        with self._lock:
            shard, self._shard = self._shard, None
            if shard is None:
                return None
            if shard.count == 0:
                path = shard.path
                shard.release()
                shutil.rmtree(path, ignore_errors=True)
                return None
            self._sequence += 1
            target = self.directory / _closed_name(self.writer, self._sequence)
            shard.close_as(target)
            return target


# --- expiry and compaction (the retrain job's side) -------------------------------------------

GONE_PREFIX = ".gone-"  # a closed shard being removed
COMPACTED_FROM_FILE = "compacted-from.txt"  # in a compacted shard: the shard it replaces
EXPIRE_LOCK_FILE = ".expire.lock"
_CLOSED_AT = re.compile(r"shard-(\d{8}T\d{12}Z)-")


@dataclasses.dataclass(frozen=True)
class Expired:
    """What `expire` did: shards removed whole, shards compacted, and examples dropped."""

    removed: tuple[str, ...]
    compacted: tuple[str, ...]
    examples_dropped: int
    examples_kept: int


def closed_at(path: str | Path) -> dt.datetime | None:
    """When a closed shard was closed, from its name (None for a name this module did not
    make)."""
    found = _CLOSED_AT.match(Path(path).name)
    if found is None:
        return None
    return dt.datetime.strptime(found[1], "%Y%m%dT%H%M%S%fZ").replace(tzinfo=dt.UTC)


def received_times(shard: ShardInfo | Shard) -> list[dt.datetime]:
    """When each example of a shard was received: its provenance time, or, in a shard older
    than provenance, the shard's closing time (the latest it can have been received)."""
    fallback = closed_at(shard.path) or dt.datetime.now(dt.UTC)
    times = []
    for when in shard.received_at or (None,) * len(shard):
        times.append(fallback if when is None else dt.datetime.fromisoformat(when))
    return times


def expire(directory: str | Path, max_age: dt.timedelta, now: dt.datetime | None = None) -> Expired:
    """Drop the closed shards' examples received more than `max_age` before `now`.

    A shard all of whose examples are older is removed (renamed to a `.gone-` name first, so
    a reader never sees half of it); a shard with some is compacted: its kept examples are
    written to a new shard under a `.compact-` name, every file and the folder fsynced, the
    new shard renamed in (it names the one it replaces in compacted-from.txt), and only then
    the old one removed. A crash at any point loses nothing and leaves no half shard: the
    next call finishes or undoes what was left (an unrenamed `.compact-` folder is removed,
    a replaced shard still present is removed). Open shards are not touched. One call at a
    time per store, and none while a retrain reads it (`reading`): an exclusive flock.

    Raises:
        FeedbackFormatError: a closed shard cannot be read (nothing of it is changed).
        OSError: the store cannot be written.
    """
    directory = Path(directory)
    now = now or dt.datetime.now(dt.UTC)
    cutoff = now - max_age
    removed, compacted, dropped, kept = [], [], 0, 0
    if not directory.is_dir():
        return Expired((), (), 0, 0)
    lock_fd = os.open(directory / EXPIRE_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        _finish_interrupted(directory)
        for path in closed_shards(directory):
            info = read_info(path)
            keep = np.array([when >= cutoff for when in received_times(info)], bool)
            dropped += int((~keep).sum())
            kept += int(keep.sum())
            if keep.all():
                continue
            if keep.any():
                _compact(info, keep)
                compacted.append(path.name)
            else:
                _remove_closed(path)
                removed.append(path.name)
    finally:
        os.close(lock_fd)
    return Expired(tuple(removed), tuple(compacted), dropped, kept)


def _finish_interrupted(directory: Path) -> None:
    """What a crashed `expire` left: unrenamed new shards go, replaced old ones go."""
    for path in directory.iterdir():
        if path.name.startswith((COMPACT_PREFIX, GONE_PREFIX)) and path.is_dir():
            shutil.rmtree(path)
    for path in closed_shards(directory):
        old = _compacted_from(path)
        if old is not None and (directory / old).is_dir():
            _remove_closed(directory / old)


def _compacted_from(path: Path) -> str | None:
    try:
        name = (path / COMPACTED_FROM_FILE).read_text(encoding="ascii").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    return name if name.startswith(CLOSED_PREFIX) and "/" not in name else None


def _kept_files(info: ShardInfo, indices: np.ndarray) -> dict[str, bytes]:
    """The files of a shard holding only the examples at `indices`, in its format."""
    count = len(indices)
    if info.format == IDX_FORMAT:
        shard = read_shard(info.path)
        return {
            IMAGES_FILE: _images_header(count) + shard.images[indices].tobytes(),
            LABELS_FILE: _labels_header(count) + shard.labels[indices].tobytes(),
        }
    data = _read(info.path / EXAMPLES_FILE)
    try:
        spans = tfrecord.record_spans(data)
    except tfrecord.RecordError as err:
        raise FeedbackFormatError(f"{info.path / EXAMPLES_FILE}: {err}") from err
    if len(spans) != len(info):
        raise FeedbackFormatError(
            f"{info.path / EXAMPLES_FILE}: {len(spans)} records, {COMMITTED_FILE} says {len(info)}"
        )
    # Each record as it is framed on disk: its length, CRCs and data.
    framed = b"".join(
        data[spans[i][0] - 12 : spans[i][0] + spans[i][1] + 4] for i in indices.tolist()
    )
    return {EXAMPLES_FILE: framed, COMMITTED_FILE: _committed(count)}


def _compact(info: ShardInfo, keep: np.ndarray) -> None:
    directory = info.path.parent
    name = info.path.name
    # The same closing time, so the shards keep their order; a new tail, so it is a new name.
    stamp = _CLOSED_AT.match(name)
    prefix = stamp[0] if stamp else CLOSED_PREFIX
    target = directory / f"{prefix}compacted-{secrets.token_hex(4)}"
    staging = directory / (COMPACT_PREFIX + target.name[len(CLOSED_PREFIX) :])
    indices = np.flatnonzero(keep)
    received = received_times(info)
    files = {
        **_kept_files(info, indices),
        VERSIONS_FILE: encode_versions([info.versions[i] for i in indices]),
        PROVENANCE_FILE: b"".join(provenance_line(info.senders[i], received[i]) for i in indices),
        COMPACTED_FROM_FILE: f"{name}\n".encode("ascii"),
    }
    staging.mkdir()
    for file_name, content in files.items():
        fd = os.open(staging / file_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _pwrite_all(fd, content, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
    _fsync_dir(staging)
    os.rename(staging, target)
    _fsync_dir(directory)
    _remove_closed(info.path)


def _remove_closed(path: Path) -> None:
    """A closed shard gone without ever being half there: renamed away, then deleted."""
    gone = path.with_name(GONE_PREFIX + path.name[len(CLOSED_PREFIX) :])
    os.rename(path, gone)
    _fsync_dir(path.parent)
    shutil.rmtree(gone)
