"""Expiry and compaction (the retrain job's side): old examples removed, crash-safe."""

from __future__ import annotations

import dataclasses
import datetime as dt
import fcntl
import os
import re
import secrets
import shutil
from pathlib import Path

import numpy as np

from artifact import tfrecord
from artifact.feedback.layout import (
    CLOSED_PREFIX,
    COMMITTED_FILE,
    COMPACT_PREFIX,
    COMPACTED_FROM_FILE,
    EXAMPLES_FILE,
    EXPIRE_LOCK_FILE,
    GONE_PREFIX,
    IDX_FORMAT,
    IMAGES_FILE,
    LABELS_FILE,
    PROVENANCE_FILE,
    VERSIONS_FILE,
    FeedbackFormatError,
    _committed,
    _compacted_from,
    _fsync_dir,
    _images_header,
    _labels_header,
    _pwrite_all,
    _read,
    encode_versions,
)
from artifact.feedback.read import (
    Shard,
    ShardInfo,
    closed_shards,
    provenance_line,
    read_info,
    read_shard,
)

# --- expiry and compaction (the retrain job's side) -------------------------------------------


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
