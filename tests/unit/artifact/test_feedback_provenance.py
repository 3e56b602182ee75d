"""The feedback store's provenance and bounds: who sent each image and when, a sender's share
of the store, shards older than provenance still read, and expiry that compacts or removes
shards without ever losing or half-writing one (a crash injected at every step).

Pure Python and numpy (the fast tier).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil

import numpy as np
import pytest

from artifact import feedback
from artifact.feedback import (
    ANONYMOUS,
    PROVENANCE_FILE,
    UNKNOWN_SENDER,
    FeedbackFormatError,
    FeedbackStoreFull,
    FeedbackWriter,
    SenderShareFull,
    closed_shards,
    expire,
    read_closed_shards,
    sender_images,
)

DAY = dt.timedelta(days=1)
NOW = dt.datetime(2026, 6, 10, 12, 0, tzinfo=dt.UTC)


def numbered(start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Images that say which they are: image i is filled with i % 251, its label is i % 10."""
    numbers = np.arange(start, start + count)
    images = np.broadcast_to((numbers % 251).astype(np.uint8)[:, None, None], (count, 28, 28))
    return np.ascontiguousarray(images), (numbers % 10).astype(np.uint8)


def numbers_of(shards) -> list[int]:
    found = []
    for shard in shards:
        for image, label in zip(shard.images, shard.labels, strict=True):
            assert (image == image[0, 0]).all(), f"{shard.path}: a torn image"
            found.append(int(image[0, 0]))
            assert int(label) == found[-1] % 10
    return found


def open_writer(directory, shard_images=100, max_bytes=10**9, **options) -> FeedbackWriter:
    writer = FeedbackWriter(directory, shard_images, max_bytes, **options)
    writer.open()
    return writer


def test_each_image_records_its_sender_and_when_it_came(tmp_path):
    writer = open_writer(tmp_path)
    writer.append(*numbered(0, 2), [1, None], sender="alice", received_at=NOW)
    writer.append(*numbered(2, 1), [None], received_at=NOW + DAY)
    writer.close()
    (shard,) = read_closed_shards(tmp_path)
    assert shard.senders == ("alice", "alice", ANONYMOUS)
    assert shard.received_at == ("2026-06-10T12:00:00Z",) * 2 + ("2026-06-11T12:00:00Z",)
    assert (shard.path / PROVENANCE_FILE).read_text() == (
        "2026-06-10T12:00:00Z alice\n2026-06-10T12:00:00Z alice\n2026-06-11T12:00:00Z anonymous\n"
    )


@pytest.mark.parametrize("sender", ["", "has space", "new\nline", "x" * 65, "-leading-dash"])
def test_a_sender_name_that_could_not_be_read_back_is_refused(tmp_path, sender):
    writer = open_writer(tmp_path)
    with pytest.raises(ValueError, match="a sender's name must match"):
        writer.append(*numbered(0, 1), [None], sender=sender)


def test_a_shard_older_than_provenance_still_reads_as_the_unknown_sender(tmp_path):
    writer = open_writer(tmp_path)
    writer.append(*numbered(0, 2), [None, None], sender="alice")
    path = writer.close()
    (path / PROVENANCE_FILE).unlink()  # as the writer before provenance left it
    (shard,) = read_closed_shards(tmp_path)
    assert numbers_of([shard]) == [0, 1]
    assert shard.senders == (UNKNOWN_SENDER, UNKNOWN_SENDER)
    assert shard.received_at == (None, None)
    assert sender_images(tmp_path) == {UNKNOWN_SENDER: 2}


def test_an_older_writers_open_shard_is_recovered_without_provenance(tmp_path):
    """A dead writer of the version before provenance left an open shard of three files."""
    writer = open_writer(tmp_path, writer="old")
    writer.append(*numbered(0, 3), [None] * 3)
    open_path = writer._shard.path
    writer._shard.release()  # the process died holding it
    (open_path / PROVENANCE_FILE).unlink()
    newcomer = open_writer(tmp_path)
    (recovered,) = newcomer.recovered
    (shard,) = read_closed_shards(tmp_path)
    assert shard.path == recovered and numbers_of([shard]) == [0, 1, 2]
    assert shard.senders == (UNKNOWN_SENDER,) * 3


@pytest.mark.parametrize(
    "content, message",
    [
        pytest.param("2026-06-10T12:00:00Z alice\n", "expected 2 lines", id="too-few-lines"),
        pytest.param("2026-06-10T12:00:00Z alice\nyesterday bob\n", ":2: expected", id="bad-time"),
        pytest.param("2026-06-10T12:00:00Z alice\n2026-06-10T12:00:00Z\n", ":2:", id="no-sender"),
    ],
)
def test_a_damaged_provenance_file_is_named(tmp_path, content, message):
    writer = open_writer(tmp_path)
    writer.append(*numbered(0, 2), [None, None], sender="alice")
    path = writer.close()
    (path / PROVENANCE_FILE).write_text(content)
    with pytest.raises(FeedbackFormatError, match=message) as caught:
        read_closed_shards(tmp_path)
    assert PROVENANCE_FILE in str(caught.value)


def test_a_sender_past_its_share_is_refused_and_others_are_not(tmp_path):
    share = 5 * feedback.SENDER_IMAGE_BYTES
    writer = open_writer(tmp_path, shard_images=2, max_sender_bytes=share)
    writer.append(*numbered(0, 4), [None] * 4, sender="mallory")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(SenderShareFull, match="the sender mallory has 4 images") as caught:
        writer.append(*numbered(4, 2), [None] * 2, sender="mallory")
    assert isinstance(caught.value, FeedbackStoreFull)  # the same 507 as a full store
    assert "FEEDBACK_SENDER_SHARE" in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    writer.append(*numbered(4, 1), [None], sender="mallory")  # what fits its share
    writer.append(*numbered(5, 4), [None] * 4, sender="alice")
    assert writer.sender_images("mallory") == 5 and writer.sender_images("alice") == 4


def test_a_senders_share_counts_every_writer_of_the_folder(tmp_path):
    other = open_writer(tmp_path, shard_images=1)
    other.append(*numbered(0, 3), [None] * 3, sender="mallory")  # closed at once
    writer = open_writer(tmp_path, max_sender_bytes=3 * feedback.SENDER_IMAGE_BYTES)
    with pytest.raises(SenderShareFull):
        writer.append(*numbered(3, 1), [None], sender="mallory")
    writer.append(*numbered(3, 1), [None], sender="alice")


def test_a_refused_request_measures_again_once_room_may_have_been_made(tmp_path):
    clock = [0.0]
    writer = open_writer(tmp_path, shard_images=2, max_sender_bytes=2 * 785, clock=lambda: clock[0])
    writer.append(*numbered(0, 2), [None] * 2, sender="mallory")  # a closed shard
    with pytest.raises(SenderShareFull):
        writer.append(*numbered(2, 1), [None], sender="mallory")
    shutil.rmtree(closed_shards(tmp_path)[0])  # the retrain expired it
    with pytest.raises(SenderShareFull):  # measured a moment ago: not yet seen
        writer.append(*numbered(2, 1), [None], sender="mallory")
    clock[0] += feedback.REMEASURE_SECONDS
    writer.append(*numbered(2, 1), [None], sender="mallory")


def store_of_three_days(tmp_path):
    """Three closed shards: day 1 (numbers 0-2), days 1 and 3 mixed (3-6), day 3 (7-8)."""
    writer = open_writer(tmp_path, shard_images=3)
    writer.append(*numbered(0, 3), [None] * 3, sender="a", received_at=NOW - 3 * DAY)
    writer.append(*numbered(3, 2), [7] * 2, sender="b", received_at=NOW - 3 * DAY)
    writer.append(*numbered(5, 2), [None] * 2, sender="c", received_at=NOW - DAY)
    writer.append(*numbered(7, 2), [None] * 2, sender="c", received_at=NOW - DAY)
    writer.close()
    return [s.path.name for s in read_closed_shards(tmp_path)]


def test_expiry_removes_old_shards_and_compacts_mixed_ones(tmp_path):
    names = store_of_three_days(tmp_path)
    assert numbers_of(read_closed_shards(tmp_path)) == list(range(9))
    result = expire(tmp_path, 2 * DAY, now=NOW)
    assert result.removed == (names[0],) and result.compacted == (names[1],)
    assert (result.images_dropped, result.images_kept) == (5, 4)
    shards = read_closed_shards(tmp_path)
    assert numbers_of(shards) == [5, 6, 7, 8]  # the order kept
    assert shards[0].senders == ("c", "c") and shards[0].versions == (None, None)
    assert shards[0].received_at == ("2026-06-09T12:00:00Z",) * 2
    assert shards[1].path.name == names[2]  # untouched
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("shard-")) == [
        feedback.EXPIRE_LOCK_FILE
    ]
    assert expire(tmp_path, 2 * DAY, now=NOW) == feedback.Expired((), (), 0, 4)


def test_a_shard_older_than_provenance_expires_by_its_closing_time(tmp_path):
    writer = open_writer(tmp_path)
    writer.append(*numbered(0, 2), [None] * 2)
    path = writer.close()
    (path / PROVENANCE_FILE).unlink()
    closed = feedback.closed_at(path)
    assert expire(tmp_path, DAY, now=closed + DAY / 2).removed == ()
    assert expire(tmp_path, DAY, now=closed + 2 * DAY).removed == (path.name,)
    assert read_closed_shards(tmp_path) == []


class Crash(BaseException):
    """The process dying at this point: nothing after it runs, the disk stays as it is."""


def crash_at(monkeypatch, step: int) -> list[str]:
    """Make the `step`-th of expire's disk steps (file writes, fsyncs, renames, removals)
    the last: it crashes instead of running. Returns the steps seen."""
    seen: list[str] = []

    def wrap(name, real):
        def step_or_crash(*args, **kwargs):
            seen.append(name)
            if len(seen) == step:
                raise Crash(name)
            return real(*args, **kwargs)

        return step_or_crash

    monkeypatch.setattr(feedback, "_pwrite_all", wrap("write", feedback._pwrite_all))
    monkeypatch.setattr(feedback, "_fsync_dir", wrap("fsync dir", feedback._fsync_dir))
    monkeypatch.setattr(feedback.os, "rename", wrap("rename", os.rename))
    monkeypatch.setattr(feedback.os, "fsync", wrap("fsync", os.fsync))
    monkeypatch.setattr(feedback.shutil, "rmtree", wrap("rmtree", shutil.rmtree))
    return seen


def test_expiry_steps_are_counted_for_the_crash_test(tmp_path, monkeypatch):
    store_of_three_days(tmp_path)
    seen = crash_at(monkeypatch, 10**6)
    expire(tmp_path, 2 * DAY, now=NOW)
    # To remove: rename, fsync the folder (its fsync inside), rmtree. To compact: 5 files
    # written and fsynced, the new folder fsynced, renamed in, the store fsynced, then the
    # old one removed as above.
    assert len(seen) == 4 + 5 * 2 + 2 + 1 + 2 + 4 == EXPIRY_STEPS, seen


EXPIRY_STEPS = 23


@pytest.mark.parametrize("step", range(1, EXPIRY_STEPS + 1))
def test_a_crash_at_any_step_of_expiry_loses_nothing_and_leaves_no_half_shard(
    tmp_path, monkeypatch, step
):
    store_of_three_days(tmp_path)
    crash_at(monkeypatch, step)
    with pytest.raises(Crash):
        expire(tmp_path, 2 * DAY, now=NOW)
    monkeypatch.undo()
    # Right after the crash every closed shard reads whole, and the kept images are all
    # there, once each (a shard replaced but not yet removed is not read).
    numbers = numbers_of(read_closed_shards(tmp_path))
    assert set(numbers) >= {5, 6, 7, 8} and len(numbers) == len(set(numbers))
    result = expire(tmp_path, 2 * DAY, now=NOW)  # the next run finishes the work
    assert numbers_of(read_closed_shards(tmp_path)) == [5, 6, 7, 8]
    assert result.images_kept == 4
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("shard-")) == [
        feedback.EXPIRE_LOCK_FILE
    ]
