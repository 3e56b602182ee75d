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
        .open-<writer>/                         a writer's current shard (the same files)

A closed shard is an MNIST-format folder (its `train` split), so any MNIST reader reads it
too. Each writer (one per service process; several replicas may share the folder) appends to
its own open shard and renames it to a closed shard every `shard_images` images; the rename is
atomic, so a reader never sees half a shard.

An append is durable before it is acknowledged: the images, labels and versions are written
past the committed end and fsynced, then the two IDX headers' counts are raised and fsynced.
The counts in both headers are the commit: after a crash, a writer truncates the shard back
to the smaller of them, so a crash loses at most the request being written. A writer holds
an exclusive flock on its open shard's images file while it lives; a writer that finds another
writer's open shard unlocked (its process died) recovers it and closes it. The folder must
be on a filesystem with working locks (local disks, NFSv4, CephFS, EFS).
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
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from artifact.contract import IMAGE_HEIGHT, IMAGE_WIDTH, NUM_CLASSES

IMAGES_FILE = "train-images-idx3-ubyte"
LABELS_FILE = "train-labels-idx1-ubyte"
VERSIONS_FILE = "versions.txt"
CLOSED_PREFIX = "shard-"
OPEN_PREFIX = ".open-"
NEW_PREFIX = ".new-"  # an open shard being created
# A `.new-` folder this old belongs to a writer that died while creating it.
STALE_NEW_SECONDS = 3600
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

    def __len__(self) -> int:
        return len(self.labels)


def closed_shards(directory: str | Path) -> list[Path]:
    """A model's closed shards, oldest first (their names start with the closing time)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.startswith(CLOSED_PREFIX) and p.is_dir())


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
    return Shard(path, images.reshape(count, IMAGE_HEIGHT, IMAGE_WIDTH), labels, versions)


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
    """A writer's open shard: three files at their committed ends, the images file locked."""

    def __init__(self, path: Path, fds: dict[str, int], count: int, versions_end: int):
        self.path = path
        self.fds = fds
        self.count = count
        self.versions_end = versions_end

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
        complete = text.count(b"\n")
        count = min(*counts, complete, *([] if limit is None else [limit]))
        versions_end = 0
        for _ in range(count):
            versions_end = text.index(b"\n", versions_end) + 1
        os.ftruncate(images, IMAGES_HEADER + count * IMAGE_BYTES)
        os.ftruncate(labels, LABELS_HEADER + count)
        os.ftruncate(versions, versions_end)
        os.pwrite(images, _images_header(count), 0)
        os.pwrite(labels, _labels_header(count), 0)
        for fd in (images, labels, versions):
            os.fsync(fd)
        self.count, self.versions_end = count, versions_end

    def append(self, images: bytes, labels: bytes, versions: bytes, added: int) -> None:
        """Write past the committed end, fsync, then commit by raising both header counts."""
        image_fd, label_fd, version_fd = (
            self.fds[IMAGES_FILE],
            self.fds[LABELS_FILE],
            self.fds[VERSIONS_FILE],
        )
        _pwrite_all(image_fd, images, IMAGES_HEADER + self.count * IMAGE_BYTES)
        _pwrite_all(label_fd, labels, LABELS_HEADER + self.count)
        _pwrite_all(version_fd, versions, self.versions_end)
        for fd in (image_fd, label_fd, version_fd):
            os.fsync(fd)
        count = self.count + added
        _pwrite_all(image_fd, _images_header(count), 0)
        os.fsync(image_fd)
        _pwrite_all(label_fd, _labels_header(count), 0)
        os.fsync(label_fd)
        self.count, self.versions_end = count, self.versions_end + len(versions)

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
    """

    def __init__(
        self, directory: str | Path, shard_images: int, max_bytes: int, writer: str | None = None
    ):
        if shard_images < 1 or max_bytes < 1:
            raise ValueError("shard_images and max_bytes must be positive")
        self.directory = Path(directory)
        self.shard_images = shard_images
        self.max_bytes = max_bytes
        self.writer = writer or writer_id()
        self._lock = threading.Lock()
        self._shard: _OpenShard | None = None
        self._sequence = 0
        self._used: int | None = None
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
            self._used = store_bytes(self.directory)

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
        self, images: np.ndarray, labels: np.ndarray, versions: Sequence[int | None]
    ) -> Appended:
        """Store images with their labels; returns once they are on disk (fsynced).

        Args:
            images: uint8 [k, 28, 28].
            labels: class ids [k] in 0-9.
            versions: the version that answered each image, or None.
        Raises:
            FeedbackStoreFull: the request would take the store past max_bytes, or the disk
                (or a quota) is full; nothing of it was stored.
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
        with self._lock:
            if self._used is None:
                raise RuntimeError("FeedbackWriter.open() was not called")
            need = len(image_bytes) + len(label_bytes) + len(version_bytes)
            if self._shard is None:
                need += IMAGES_HEADER + LABELS_HEADER
            if self._used + need > self.max_bytes:
                raise FeedbackStoreFull(
                    f"the feedback store {self.directory} holds {self._used:,} bytes; "
                    f"{added} more images would take it past FEEDBACK_MAX_BYTES="
                    f"{self.max_bytes:,}: nothing was stored (the retrain job reads the closed "
                    "shards; delete those it no longer needs to make room)"
                )
            before = self._shard.count if self._shard is not None else 0
            try:
                if self._shard is None:
                    self._shard = _OpenShard.create(self.directory / (OPEN_PREFIX + self.writer))
                    self._used += IMAGES_HEADER + LABELS_HEADER
                self._shard.append(image_bytes, label_bytes, version_bytes, added)
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
            self._used += len(image_bytes) + len(label_bytes) + len(version_bytes)
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
        self._used = store_bytes(self.directory)
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
