"""Writing (the service): one writer per process appending to its own open shard, closing it
every `shard_examples` examples, recovering the open shards of writers that died."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import errno
import fcntl
import os
import shutil
import struct
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from artifact import tfrecord
from artifact.feedback.layout import (
    ANONYMOUS,
    CLOSED_PREFIX,
    COMMITTED_DIGITS,
    COMMITTED_FILE,
    EXAMPLES_FILE,
    IMAGE_BYTES,
    IMAGES_FILE,
    IMAGES_HEADER,
    LABELS_FILE,
    LABELS_HEADER,
    NEW_PREFIX,
    NO_SPACE_ERRNOS,
    OPEN_PREFIX,
    PROVENANCE_FILE,
    REMEASURE_SECONDS,
    STALE_NEW_SECONDS,
    VERSIONS_FILE,
    FeedbackStoreFull,
    FeedbackWriteError,
    SenderShareFull,
    _committed,
    _fsync_dir,
    _images_header,
    _labels_header,
    _pwrite_all,
    encode_versions,
    writer_id,
)
from artifact.feedback.read import provenance_line
from artifact.feedback.share import SenderTally, sender_tally, store_bytes

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


def _closed_name(writer: str, sequence: int) -> str:
    closed_at = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return f"{CLOSED_PREFIX}{closed_at}-{writer}-{sequence}"


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
