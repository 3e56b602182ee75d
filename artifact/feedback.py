"""Labeled feedback from production, stored as MNIST-format shards.

The format is the contract between the service, which writes it (`POST
/v1/models/{name}/feedback`, FEEDBACK_DIR), and the retrain job, which reads it
(`python -m training retrain --feedback-dir`). No TensorFlow here: both sides import it.

    <FEEDBACK_DIR>/<model name>/
        shard-<closed at, UTC>-<writer>-<n>/    a closed shard: complete, never written again
            train-images-idx3-ubyte             IDX3, uint8 [count, 28, 28]: the images
            train-labels-idx1-ubyte             IDX1, uint8 [count]: their true class ids
            versions.txt                        one line per image: the model version that
                                                answered it, empty when the client did not say
            provenance.txt                      one line per image: `<received at> <sender>`,
                                                the time in UTC (ISO 8601, seconds) and the
                                                sender's name (a token's name, never the
                                                token; `anonymous` without tokens)
            compacted-from.txt                  in a compacted shard: the shard it replaces
        .open-<writer>/                         a writer's current shard (the same files)
        .compact-<name>/, .gone-<name>/         a compacted shard being written, a removed one
                                                being deleted

A closed shard is an MNIST-format folder (its `train` split), so any MNIST reader reads it
too. Shards written before provenance was recorded have no provenance.txt: their images read
with the sender `unknown` and no time. Each writer (one per service process; several
replicas may share the folder) appends to its own open shard and renames it to a closed
shard every `shard_images` images; the rename is atomic, so a reader never sees half a shard.

An append is durable before it is acknowledged: the images, labels, versions and provenance
are written past the committed end and fsynced, then the two IDX headers' counts are raised
and fsynced. The counts in both headers are the commit: after a crash, a writer truncates the
shard back to the smaller of them, so a crash loses at most the request being written. A
writer holds an exclusive flock on its open shard's images file while it lives; a writer that
finds another writer's open shard unlocked (its process died) recovers it and closes it. The
folder must be on a filesystem with working locks (local disks, NFSv4, CephFS, EFS).

Old images are expired (`expire`, below; `python -m training expire-feedback`): a shard
whose images are all too old is renamed away (`.gone-`) and deleted; a shard with some is
compacted: a new shard is written under a `.compact-` name, its files and folder fsynced,
renamed into place (its compacted-from.txt names the shard it replaces, which readers then
skip), and only then is the old one removed. A crash at any point loses no kept image and
leaves no half shard under a `shard-` name; the next expiry finishes or undoes the rest.
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
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from artifact.contract import IMAGE_HEIGHT, IMAGE_WIDTH, NUM_CLASSES

IMAGES_FILE = "train-images-idx3-ubyte"
LABELS_FILE = "train-labels-idx1-ubyte"
VERSIONS_FILE = "versions.txt"
PROVENANCE_FILE = "provenance.txt"
CLOSED_PREFIX = "shard-"
OPEN_PREFIX = ".open-"
NEW_PREFIX = ".new-"  # an open shard being created
COMPACT_PREFIX = ".compact-"  # a compacted shard being written
# The sender of an image when no tokens are configured, and of images stored before senders
# were recorded.
ANONYMOUS = "anonymous"
UNKNOWN_SENDER = "unknown"
# A sender's name as stored: a token's name (service/security.py checks the same pattern).
SENDER_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
# What one image takes of a sender's share of the store: its pixels and its label.
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


# --- reading (the retrain job) ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Shard:
    """One closed shard's content."""

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
    # A shard a compaction replaced, still there after a crash: its images are in the new one.
    replaced = {_compacted_from(p) for p in found}
    return [p for p in found if p.name not in replaced]


def read_shard(path: str | Path) -> Shard:
    """Read and check one closed shard.

    Raises:
        FeedbackFormatError: a file is missing, unreadable, truncated or not what this module
            writes (the message names it).
    """
    path = Path(path)
    images_data = _read(path / IMAGES_FILE)
    labels_data = _read(path / LABELS_FILE)
    if len(images_data) < IMAGES_HEADER or len(labels_data) < LABELS_HEADER:
        raise FeedbackFormatError(f"{path}: an IDX header is truncated")
    magic, count, rows, cols = struct.unpack(">IIII", images_data[:IMAGES_HEADER])
    if magic != IMAGES_MAGIC or (rows, cols) != (IMAGE_HEIGHT, IMAGE_WIDTH):
        raise FeedbackFormatError(f"{path / IMAGES_FILE}: not an IDX file of 28x28 images")
    if len(images_data) != IMAGES_HEADER + count * IMAGE_BYTES:
        raise FeedbackFormatError(
            f"{path / IMAGES_FILE}: header says {count} images, the file has "
            f"{len(images_data)} bytes"
        )
    magic, label_count = struct.unpack(">II", labels_data[:LABELS_HEADER])
    if magic != LABELS_MAGIC or len(labels_data) != LABELS_HEADER + label_count:
        raise FeedbackFormatError(f"{path / LABELS_FILE}: not an IDX labels file of its length")
    if label_count != count:
        raise FeedbackFormatError(f"{path}: {count} images but {label_count} labels")
    labels = np.frombuffer(labels_data, np.uint8, offset=LABELS_HEADER)
    if count and labels.max() >= NUM_CLASSES:
        raise FeedbackFormatError(f"{path / LABELS_FILE}: a label is outside 0-{NUM_CLASSES - 1}")
    images = np.frombuffer(images_data, np.uint8, offset=IMAGES_HEADER)
    versions = _parse_versions(path / VERSIONS_FILE, count)
    senders, received = _parse_provenance(path / PROVENANCE_FILE, count)
    return Shard(
        path, images.reshape(count, IMAGE_HEIGHT, IMAGE_WIDTH), labels, versions, senders, received
    )


def read_closed_shards(directory: str | Path) -> list[Shard]:
    """Every closed shard of a model's store, oldest first (open shards are not read)."""
    return [read_shard(path) for path in closed_shards(directory)]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
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


def sender_images(directory: str | Path, cache: dict[str, Counter] | None = None) -> Counter:
    """Images per sender in a model's store: every closed shard and every writer's open one
    (read as it is now: an open shard's lines past its commit may count, a bound, not a
    record). `cache` (shard name -> counts) spares reading a closed shard twice: closed
    shards never change; entries of shards gone are dropped."""
    directory = Path(directory)
    total: Counter = Counter()
    if not directory.is_dir():
        return total
    seen = set()
    for path in directory.iterdir():
        closed = path.name.startswith(CLOSED_PREFIX)
        if not (closed or path.name.startswith(OPEN_PREFIX)):
            continue
        if closed and cache is not None and path.name in cache:
            counts = cache[path.name]
        else:
            counts = _count_senders(path)
            if counts is None:
                continue  # renamed or removed under us
            if closed and cache is not None:
                cache[path.name] = counts
        seen.add(path.name)
        total.update(counts)
    if cache is not None:
        for name in set(cache) - seen:
            del cache[name]
    return total


def _count_senders(shard: Path) -> Counter | None:
    try:
        text = (shard / PROVENANCE_FILE).read_bytes()
    except FileNotFoundError:
        try:  # a shard older than provenance: its images are the unknown sender's
            size = os.stat(shard / LABELS_FILE).st_size
        except FileNotFoundError:
            return None
        return Counter({UNKNOWN_SENDER: max(size - LABELS_HEADER, 0)})
    except OSError:
        return None
    # Complete lines only: an open shard's last line may be half written.
    return Counter(
        line.partition(b" ")[2].decode("ascii", "replace") for line in text.split(b"\n")[:-1]
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
    """What one append did: how many images the open shard holds now, and the shard it closed."""

    count: int
    closed: Path | None


class _OpenShard:
    """A writer's open shard: four files at their committed ends, the images file locked (an
    open shard a writer older than provenance left has three; it is only recovered and
    closed, never appended to)."""

    def __init__(self, path: Path, fds: dict[str, int], count: int, versions_end: int):
        self.path = path
        self.fds = fds
        self.count = count
        self.versions_end = versions_end
        self.provenance_end = 0

    @classmethod
    def create(cls, path: Path) -> _OpenShard:
        """A new empty shard at path, locked; built under a `.new-` name and renamed, so other
        writers only ever see complete, locked open shards."""
        staging = path.with_name(NEW_PREFIX + path.name[len(OPEN_PREFIX) :])
        staging.mkdir()
        fds = {}
        try:
            for name, header in (
                (IMAGES_FILE, _images_header(0)),
                (LABELS_FILE, _labels_header(0)),
                (VERSIONS_FILE, b""),
                (PROVENANCE_FILE, b""),
            ):
                fds[name] = os.open(staging / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                if name == IMAGES_FILE:
                    fcntl.flock(fds[name], fcntl.LOCK_EX | fcntl.LOCK_NB)
                _pwrite_all(fds[name], header, 0)
                os.fsync(fds[name])
            _fsync_dir(staging)
            os.rename(staging, path)
            _fsync_dir(path.parent)
        except BaseException:
            for fd in fds.values():
                os.close(fd)
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return cls(path, fds, 0, 0)

    @classmethod
    def adopt(cls, path: Path) -> _OpenShard | None:
        """Lock another writer's open shard and bring it back to its last commit.

        Returns None when its writer still holds it (it is alive), or when it is not a shard
        this module wrote (left alone: nothing is deleted that is not understood).
        """
        fds = {}
        try:
            for name in (IMAGES_FILE, LABELS_FILE, VERSIONS_FILE):
                fds[name] = os.open(path / name, os.O_RDWR)
            with contextlib.suppress(FileNotFoundError):  # absent: an older writer's
                fds[PROVENANCE_FILE] = os.open(path / PROVENANCE_FILE, os.O_RDWR)
            fcntl.flock(fds[IMAGES_FILE], fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, FileNotFoundError):
            for fd in fds.values():
                os.close(fd)
            return None
        shard = cls(path, fds, 0, 0)
        try:
            shard.recover()
        except BaseException:
            shard.release()
            raise
        return shard

    def recover(self, limit: int | None = None) -> None:
        """Truncate every file to the last commit (the smaller header count, and at most
        `limit` images) and fsync."""
        images, labels, versions = (
            self.fds[IMAGES_FILE],
            self.fds[LABELS_FILE],
            self.fds[VERSIONS_FILE],
        )
        images_size, labels_size = os.fstat(images).st_size, os.fstat(labels).st_size
        counts = [
            max(images_size - IMAGES_HEADER, 0) // IMAGE_BYTES,
            max(labels_size - LABELS_HEADER, 0),
        ]
        if images_size >= IMAGES_HEADER:
            counts.append(struct.unpack(">I", os.pread(images, 4, 4))[0])
        else:
            counts.append(0)
        if labels_size >= LABELS_HEADER:
            counts.append(struct.unpack(">I", os.pread(labels, 4, 4))[0])
        else:
            counts.append(0)
        text = os.pread(versions, os.fstat(versions).st_size, 0)
        counts.append(text.count(b"\n"))
        provenance = self.fds.get(PROVENANCE_FILE)
        lines = b""
        if provenance is not None:
            lines = os.pread(provenance, os.fstat(provenance).st_size, 0)
            counts.append(lines.count(b"\n"))
        count = min(*counts, *([] if limit is None else [limit]))
        versions_end = _line_end(text, count)
        provenance_end = _line_end(lines, count) if provenance is not None else 0
        os.ftruncate(images, IMAGES_HEADER + count * IMAGE_BYTES)
        os.ftruncate(labels, LABELS_HEADER + count)
        os.ftruncate(versions, versions_end)
        if provenance is not None:
            os.ftruncate(provenance, provenance_end)
        os.pwrite(images, _images_header(count), 0)
        os.pwrite(labels, _labels_header(count), 0)
        for fd in self.fds.values():
            os.fsync(fd)
        self.count, self.versions_end = count, versions_end
        self.provenance_end = provenance_end

    def append(
        self, images: bytes, labels: bytes, versions: bytes, provenance: bytes, added: int
    ) -> None:
        """Write past the committed end, fsync, then commit by raising both header counts."""
        image_fd, label_fd, version_fd, provenance_fd = (
            self.fds[IMAGES_FILE],
            self.fds[LABELS_FILE],
            self.fds[VERSIONS_FILE],
            self.fds[PROVENANCE_FILE],
        )
        _pwrite_all(image_fd, images, IMAGES_HEADER + self.count * IMAGE_BYTES)
        _pwrite_all(label_fd, labels, LABELS_HEADER + self.count)
        _pwrite_all(version_fd, versions, self.versions_end)
        _pwrite_all(provenance_fd, provenance, self.provenance_end)
        for fd in (image_fd, label_fd, version_fd, provenance_fd):
            os.fsync(fd)
        count = self.count + added
        _pwrite_all(image_fd, _images_header(count), 0)
        os.fsync(image_fd)
        _pwrite_all(label_fd, _labels_header(count), 0)
        os.fsync(label_fd)
        self.count, self.versions_end = count, self.versions_end + len(versions)
        self.provenance_end += len(provenance)

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
    """versions.txt lines for a request's images."""
    return "".join(f"{v}\n" if v is not None else "\n" for v in versions).encode("ascii")


class FeedbackWriter:
    """Appends labeled images to one model's store: durable, rotated, bounded; thread-safe.

    Args:
        directory: the model's store (store_dir(FEEDBACK_DIR, model)).
        shard_images: close the open shard once it holds this many images.
        max_bytes: refuse a request that would take the store (every writer's files) past
            this size.
        writer: this writer's name (default: host, pid and a random part).
        max_sender_bytes: refuse a request that would take its sender's images in the store
            (every writer's, SENDER_IMAGE_BYTES each) past this; None: no share.
        clock: seconds, for how old a measure of the store is (time.monotonic).
    """

    def __init__(
        self,
        directory: str | Path,
        shard_images: int,
        max_bytes: int,
        writer: str | None = None,
        max_sender_bytes: int | None = None,
        clock=time.monotonic,
    ):
        if shard_images < 1 or max_bytes < 1:
            raise ValueError("shard_images and max_bytes must be positive")
        if max_sender_bytes is not None and max_sender_bytes < 1:
            raise ValueError("max_sender_bytes must be positive")
        self.directory = Path(directory)
        self.shard_images = shard_images
        self.max_bytes = max_bytes
        self.max_sender_bytes = max_sender_bytes
        self.writer = writer or writer_id()
        self._clock = clock
        self._lock = threading.Lock()
        self._shard: _OpenShard | None = None
        self._sequence = 0
        self._used: int | None = None
        self._senders: Counter = Counter()
        self._sender_cache: dict[str, Counter] = {}
        self._measured = 0.0
        self.recovered: list[Path] = []

    @property
    def used_bytes(self) -> int:
        """The store's size as this writer last measured it, plus its own writes since."""
        return self._used or 0

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

    def sender_images(self, sender: str) -> int:
        """A sender's images in the store, as this writer last measured it plus its own
        writes since."""
        return self._senders[sender]

    def _measure(self) -> None:
        """The store's bytes and images per sender, afresh (other writers add to it, the
        retrain job expires and compacts it)."""
        self._used = store_bytes(self.directory)
        self._senders = sender_images(self.directory, self._sender_cache)
        self._measured = self._clock()

    def _refusal(self, sender: str, added: int, need: int) -> FeedbackStoreFull | None:
        if self._used + need > self.max_bytes:
            return FeedbackStoreFull(
                f"the feedback store {self.directory} holds {self._used:,} bytes; "
                f"{added} more images would take it past FEEDBACK_MAX_BYTES="
                f"{self.max_bytes:,}: nothing was stored (the retrain job expires old shards, "
                "--feedback-max-age-days; or delete those it no longer needs to make room)"
            )
        held = self._senders[sender] * SENDER_IMAGE_BYTES
        if self.max_sender_bytes is not None and held + added * SENDER_IMAGE_BYTES > (
            self.max_sender_bytes
        ):
            return SenderShareFull(
                f"the sender {sender} has {self._senders[sender]:,} images "
                f"({held:,} bytes) in the feedback store {self.directory}; {added} more would "
                f"take it past its share, {self.max_sender_bytes:,} bytes "
                "(FEEDBACK_SENDER_SHARE of FEEDBACK_MAX_BYTES): nothing was stored"
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
        images: np.ndarray,
        labels: np.ndarray,
        versions: Sequence[int | None],
        sender: str = ANONYMOUS,
        received_at: dt.datetime | None = None,
    ) -> Appended:
        """Store images with their labels; returns once they are on disk (fsynced).

        Args:
            images: uint8 [k, 28, 28].
            labels: class ids [k] in 0-9.
            versions: the version that answered each image, or None.
            sender: who sent them (a token's name; ANONYMOUS without tokens).
            received_at: when (default: now).
        Raises:
            FeedbackStoreFull: the request would take the store past max_bytes, or the disk
                (or a quota) is full; nothing of it was stored.
            SenderShareFull: it would take its sender past max_sender_bytes; nothing stored.
            FeedbackWriteError: any other write failure; nothing of it was stored.
        """
        images = np.ascontiguousarray(images, np.uint8)
        labels = np.asarray(labels)
        if images.shape[1:] != (IMAGE_HEIGHT, IMAGE_WIDTH) or len(images) != len(labels):
            raise ValueError(
                f"expected k 28x28 images and k labels, got {images.shape}, {labels.shape}"
            )
        if len(versions) != len(labels):
            raise ValueError("one version (or None) per image")
        if len(labels) and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
            raise ValueError(f"labels must be class ids 0-{NUM_CLASSES - 1}")
        added = len(labels)
        image_bytes = images.tobytes()
        label_bytes = labels.astype(np.uint8).tobytes()
        version_bytes = encode_versions(versions)
        provenance_bytes = provenance_line(sender, received_at or dt.datetime.now(dt.UTC)) * added
        written = len(image_bytes) + len(label_bytes) + len(version_bytes) + len(provenance_bytes)
        with self._lock:
            if self._used is None:
                raise RuntimeError("FeedbackWriter.open() was not called")
            need = written + (IMAGES_HEADER + LABELS_HEADER if self._shard is None else 0)
            refusal = self._refusal(sender, added, need)
            if refusal is not None and self._clock() - self._measured >= REMEASURE_SECONDS:
                # Room may have been made since (expiry, compaction, an operator).
                self._measure()
                refusal = self._refusal(sender, added, need)
            if refusal is not None:
                raise refusal
            before = self._shard.count if self._shard is not None else 0
            try:
                if self._shard is None:
                    self._shard = _OpenShard.create(self.directory / (OPEN_PREFIX + self.writer))
                    self._used += IMAGES_HEADER + LABELS_HEADER
                self._shard.append(image_bytes, label_bytes, version_bytes, provenance_bytes, added)
            except OSError as err:
                self._roll_back(before)
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
            self._senders[sender] += added
            count, closed = self._shard.count, None
            if count >= self.shard_images:
                closed = self._rotate()
            return Appended(count, closed)

    def _roll_back(self, count: int) -> None:
        """After a failed append: back to `count` images; a shard that cannot is let go."""
        shard = self._shard
        if shard is None:
            return
        try:
            shard.recover(limit=count)
        except OSError:
            # Released: the next writer to open the store (or this one, on its next append,
            # through a new shard) recovers it from the headers.
            shard.release()
            self._shard = None

    def _rotate(self) -> Path | None:
        shard = self._shard
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
    """What `expire` did: shards removed whole, shards compacted, and images dropped."""

    removed: tuple[str, ...]
    compacted: tuple[str, ...]
    images_dropped: int
    images_kept: int


def closed_at(path: str | Path) -> dt.datetime | None:
    """When a closed shard was closed, from its name (None for a name this module did not
    make)."""
    found = _CLOSED_AT.match(Path(path).name)
    if found is None:
        return None
    return dt.datetime.strptime(found[1], "%Y%m%dT%H%M%S%fZ").replace(tzinfo=dt.UTC)


def received_times(shard: Shard) -> list[dt.datetime]:
    """When each image of a shard was received: its provenance time, or, in a shard older
    than provenance, the shard's closing time (the latest it can have been received)."""
    fallback = closed_at(shard.path) or dt.datetime.now(dt.UTC)
    times = []
    for when in shard.received_at or (None,) * len(shard):
        times.append(fallback if when is None else dt.datetime.fromisoformat(when))
    return times


def expire(directory: str | Path, max_age: dt.timedelta, now: dt.datetime | None = None) -> Expired:
    """Drop the closed shards' images received more than `max_age` before `now`.

    A shard all of whose images are older is removed (renamed to a `.gone-` name first, so a
    reader never sees half of it); a shard with some is compacted: its kept images are
    written to a new shard under a `.compact-` name, every file and the folder fsynced, the
    new shard renamed in (it names the one it replaces in compacted-from.txt), and only then
    the old one removed. A crash at any point loses nothing and leaves no half shard: the
    next call finishes or undoes what was left (an unrenamed `.compact-` folder is removed,
    a replaced shard still present is removed). Open shards are not touched. One call at a
    time per store (an flock).

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
            shard = read_shard(path)
            keep = np.array([when >= cutoff for when in received_times(shard)], bool)
            dropped += int((~keep).sum())
            kept += int(keep.sum())
            if keep.all():
                continue
            if keep.any():
                _compact(shard, keep)
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


def _compact(shard: Shard, keep: np.ndarray) -> None:
    directory = shard.path.parent
    name = shard.path.name
    # The same closing time, so the shards keep their order; a new tail, so it is a new name.
    stamp = _CLOSED_AT.match(name)
    prefix = stamp[0] if stamp else CLOSED_PREFIX
    target = directory / f"{prefix}compacted-{secrets.token_hex(4)}"
    staging = directory / (COMPACT_PREFIX + target.name[len(CLOSED_PREFIX) :])
    staging.mkdir()
    indices = np.flatnonzero(keep)
    count = len(indices)
    versions = [shard.versions[i] for i in indices]
    senders = shard.senders or (UNKNOWN_SENDER,) * len(shard)
    received = received_times(shard)
    files = {
        IMAGES_FILE: _images_header(count) + shard.images[indices].tobytes(),
        LABELS_FILE: _labels_header(count) + shard.labels[indices].tobytes(),
        VERSIONS_FILE: encode_versions(versions),
        PROVENANCE_FILE: b"".join(provenance_line(senders[i], received[i]) for i in indices),
        COMPACTED_FROM_FILE: f"{name}\n".encode("ascii"),
    }
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
    _remove_closed(shard.path)


def _remove_closed(path: Path) -> None:
    """A closed shard gone without ever being half there: renamed away, then deleted."""
    gone = path.with_name(GONE_PREFIX + path.name[len(CLOSED_PREFIX) :])
    os.rename(path, gone)
    _fsync_dir(path.parent)
    shutil.rmtree(gone)
