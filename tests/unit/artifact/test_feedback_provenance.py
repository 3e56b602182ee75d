"""The feedback store's provenance and bounds: who sent each example and when, a sender's
share of the store, shards older than provenance still read, and expiry that compacts or
removes shards (tf.Example shards and the MNIST-format ones of earlier versions) without ever
losing or half-writing one (a crash injected at every step).

Pure Python and numpy (the fast tier).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path

import pytest
from support.feedback_stores import (
    closed_name,
    numbered,
    numbered_records,
    stored_numbers,
    write_idx_shard,
)

from artifact import feedback, tfrecord
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
    read_info,
)
from artifact.feedback import expiry as feedback_expiry

DAY = dt.timedelta(days=1)
NOW = dt.datetime(2026, 6, 10, 12, 0, tzinfo=dt.UTC)


# What one numbered example takes of its sender's share: its framed record.
RECORD_BYTES = len(tfrecord.frame(numbered_records(0, 1)[0]))


def open_writer(directory, shard_examples=100, max_bytes=10**9, **options) -> FeedbackWriter:
    writer = FeedbackWriter(directory, shard_examples, max_bytes, **options)
    writer.open()
    return writer


def test_each_example_records_its_sender_and_when_it_came(tmp_path):
    writer = open_writer(tmp_path)
    writer.append(numbered_records(0, 2), [1, None], sender="alice", received_at=NOW)
    writer.append(numbered_records(2, 1), [None], received_at=NOW + DAY)
    writer.close()
    (path,) = closed_shards(tmp_path)
    shard = read_info(path)
    assert shard.senders == ("alice", "alice", ANONYMOUS)
    assert shard.received_at == ("2026-06-10T12:00:00Z",) * 2 + ("2026-06-11T12:00:00Z",)
    assert (shard.path / PROVENANCE_FILE).read_text() == (
        "2026-06-10T12:00:00Z alice\n2026-06-10T12:00:00Z alice\n2026-06-11T12:00:00Z anonymous\n"
    )


@pytest.mark.parametrize("sender", ["", "has space", "new\nline", "x" * 65, "-leading-dash"])
def test_a_sender_name_that_could_not_be_read_back_is_refused(tmp_path, sender):
    writer = open_writer(tmp_path)
    with pytest.raises(ValueError, match="a sender's name must match"):
        writer.append(numbered_records(0, 1), [None], sender=sender)


def test_a_shard_older_than_provenance_still_reads_as_the_unknown_sender(tmp_path):
    """An MNIST-format shard of the version before provenance: no provenance.txt."""
    write_idx_shard(tmp_path, closed_name(NOW, "old"), *numbered(0, 2), [None, None])
    (path,) = closed_shards(tmp_path)
    assert stored_numbers(tmp_path) == [0, 1]
    shard = read_info(path)
    assert shard.senders == (UNKNOWN_SENDER, UNKNOWN_SENDER)
    assert shard.received_at == (None, None)
    assert feedback.sender_tally(tmp_path).examples == {UNKNOWN_SENDER: 2}
    assert feedback.sender_tally(tmp_path).bytes == {UNKNOWN_SENDER: 2 * 785}


def test_an_older_writers_open_shard_is_recovered_without_provenance(tmp_path):
    """A dead writer of the version before provenance left an open shard of three files."""
    write_idx_shard(tmp_path, feedback.OPEN_PREFIX + "old", *numbered(0, 3), [None] * 3)
    newcomer = open_writer(tmp_path)
    (recovered,) = newcomer.recovered
    assert closed_shards(tmp_path) == [recovered] and stored_numbers(tmp_path) == [0, 1, 2]
    assert read_info(recovered).senders == (UNKNOWN_SENDER,) * 3


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
    writer.append(numbered_records(0, 2), [None, None], sender="alice")
    path = writer.close()
    (path / PROVENANCE_FILE).write_text(content)
    with pytest.raises(FeedbackFormatError, match=message) as caught:
        read_info(path)
    assert PROVENANCE_FILE in str(caught.value)


def test_a_sender_past_its_share_is_refused_and_others_are_not(tmp_path):
    share = 5 * RECORD_BYTES
    writer = open_writer(tmp_path, shard_examples=2, max_sender_bytes=share)
    writer.append(numbered_records(0, 4), [None] * 4, sender="mallory")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(SenderShareFull, match="the sender mallory has 4 examples") as caught:
        writer.append(numbered_records(4, 2), [None] * 2, sender="mallory")
    assert isinstance(caught.value, FeedbackStoreFull)  # the same 507 as a full store
    assert "FEEDBACK_SENDER_SHARE" in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    writer.append(numbered_records(4, 1), [None], sender="mallory")  # what fits its share
    writer.append(numbered_records(5, 4), [None] * 4, sender="alice")
    assert writer.sender_examples("mallory") == 5 and writer.sender_examples("alice") == 4
    assert writer.sender_bytes("mallory") == 5 * RECORD_BYTES


def test_a_senders_share_counts_every_writer_of_the_folder_and_older_shards(tmp_path):
    other = open_writer(tmp_path, shard_examples=1)
    other.append(numbered_records(0, 2), [None] * 2, sender="mallory")  # closed at once
    # And an MNIST-format shard of an earlier version: 785 bytes an image.
    write_idx_shard(tmp_path, closed_name(NOW, "old"), *numbered(2, 1), [None], ["mallory"])
    writer = open_writer(tmp_path, max_sender_bytes=2 * RECORD_BYTES + 785)
    assert writer.sender_bytes("mallory") == 2 * RECORD_BYTES + 785
    with pytest.raises(SenderShareFull):
        writer.append(numbered_records(3, 1), [None], sender="mallory")
    writer.append(numbered_records(3, 1), [None], sender="alice")


def test_a_refused_request_measures_again_once_room_may_have_been_made(tmp_path):
    clock = [0.0]
    writer = open_writer(
        tmp_path, shard_examples=2, max_sender_bytes=2 * RECORD_BYTES, clock=lambda: clock[0]
    )
    writer.append(numbered_records(0, 2), [None] * 2, sender="mallory")  # a closed shard
    with pytest.raises(SenderShareFull):
        writer.append(numbered_records(2, 1), [None], sender="mallory")
    shutil.rmtree(closed_shards(tmp_path)[0])  # the retrain expired it
    with pytest.raises(SenderShareFull):  # measured a moment ago: not yet seen
        writer.append(numbered_records(2, 1), [None], sender="mallory")
    clock[0] += feedback.REMEASURE_SECONDS
    writer.append(numbered_records(2, 1), [None], sender="mallory")


@pytest.fixture(scope="module")
def three_day_stores(tmp_path_factory) -> dict[str, Path]:
    """store_of_three_days' stores, made once per format (the writer's fsyncs take time)."""
    stores = {}
    for shard_format in (feedback.EXAMPLES_FORMAT, feedback.IDX_FORMAT):
        stores[shard_format] = tmp_path_factory.mktemp("three-days")
        make_store_of_three_days(stores[shard_format], shard_format)
    return stores


@pytest.fixture
def store_of_three_days(three_day_stores, tmp_path):
    """A fresh copy of a store of three days in tmp_path: its shards' names, oldest first."""

    def copy(shard_format: str) -> list[str]:
        shutil.copytree(three_day_stores[shard_format], tmp_path, dirs_exist_ok=True)
        return [p.name for p in closed_shards(tmp_path)]

    return copy


def make_store_of_three_days(tmp_path: Path, shard_format: str) -> None:
    """Three closed shards: day 1 (numbers 0-2), days 1 and 3 mixed (3-6), day 3 (7-8); as
    the writer makes them, or as MNIST-format shards of an earlier version."""
    if shard_format == feedback.IDX_FORMAT:
        days = [("a", 3)] * 3 + [("b", 3)] * 2 + [("c", 1)] * 4
        for number, (start, end) in enumerate(((0, 3), (3, 7), (7, 9))):
            images, labels = numbered(start, end - start)
            path = write_idx_shard(
                tmp_path, closed_name(NOW - dt.timedelta(hours=3 - number), "old", number),
                images, labels, [7 if 3 <= n < 5 else None for n in range(start, end)],
            )  # fmt: skip
            (path / PROVENANCE_FILE).write_bytes(
                b"".join(feedback.provenance_line(s, NOW - d * DAY) for s, d in days[start:end])
            )
    else:
        writer = open_writer(tmp_path, shard_examples=3)
        writer.append(numbered_records(0, 3), [None] * 3, sender="a", received_at=NOW - 3 * DAY)
        writer.append(numbered_records(3, 2), [7] * 2, sender="b", received_at=NOW - 3 * DAY)
        writer.append(numbered_records(5, 2), [None] * 2, sender="c", received_at=NOW - DAY)
        writer.append(numbered_records(7, 2), [None] * 2, sender="c", received_at=NOW - DAY)
        writer.close()


FORMATS = [
    pytest.param(feedback.EXAMPLES_FORMAT, id="tf.Example"),
    pytest.param(feedback.IDX_FORMAT, id="mnist-format"),
]


@pytest.mark.parametrize("shard_format", FORMATS)
def test_expiry_removes_old_shards_and_compacts_mixed_ones(
    tmp_path, store_of_three_days, shard_format
):
    names = store_of_three_days(shard_format)
    assert stored_numbers(tmp_path) == list(range(9))
    result = expire(tmp_path, 2 * DAY, now=NOW)
    assert result.removed == (names[0],) and result.compacted == (names[1],)
    assert (result.examples_dropped, result.examples_kept) == (5, 4)
    assert stored_numbers(tmp_path) == [5, 6, 7, 8]  # the order kept
    shards = [read_info(path) for path in closed_shards(tmp_path)]
    assert shards[0].format == shard_format
    assert shards[0].senders == ("c", "c") and shards[0].versions == (None, None)
    assert shards[0].received_at == ("2026-06-09T12:00:00Z",) * 2
    assert shards[1].path.name == names[2]  # untouched
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("shard-")) == [
        feedback.EXPIRE_LOCK_FILE
    ]
    assert expire(tmp_path, 2 * DAY, now=NOW) == feedback.Expired((), (), 0, 4)


def test_a_shard_older_than_provenance_expires_by_its_closing_time(tmp_path):
    path = write_idx_shard(tmp_path, closed_name(NOW, "old"), *numbered(0, 2), [None] * 2)
    closed = feedback.closed_at(path)
    assert expire(tmp_path, DAY, now=closed + DAY / 2).removed == ()
    assert expire(tmp_path, DAY, now=closed + 2 * DAY).removed == (path.name,)
    assert closed_shards(tmp_path) == []


def test_expiry_waits_for_a_retrain_reading_the_store(tmp_path, store_of_three_days):
    """A retrain streaming the shards holds `reading`: expiry's exclusive lock waits."""
    import fcntl

    store_of_three_days(feedback.EXAMPLES_FORMAT)
    expire(tmp_path, 100 * DAY, now=NOW)  # makes the lock file; removes nothing
    with feedback.reading(tmp_path):
        fd = os.open(tmp_path / feedback.EXPIRE_LOCK_FILE, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    assert expire(tmp_path, 2 * DAY, now=NOW).examples_dropped == 5


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

    write_all, fsync_dir = feedback_expiry._pwrite_all, feedback_expiry._fsync_dir
    monkeypatch.setattr(feedback_expiry, "_pwrite_all", wrap("write", write_all))
    monkeypatch.setattr(feedback_expiry, "_fsync_dir", wrap("fsync dir", fsync_dir))
    monkeypatch.setattr(os, "rename", wrap("rename", os.rename))
    monkeypatch.setattr(os, "fsync", wrap("fsync", os.fsync))
    monkeypatch.setattr(shutil, "rmtree", wrap("rmtree", shutil.rmtree))
    return seen


@pytest.mark.parametrize("shard_format", FORMATS)
def test_expiry_steps_are_counted_for_the_crash_test(
    tmp_path, monkeypatch, store_of_three_days, shard_format
):
    store_of_three_days(shard_format)
    seen = crash_at(monkeypatch, 10**6)
    expire(tmp_path, 2 * DAY, now=NOW)
    # To remove: rename, fsync the folder (its fsync inside), rmtree. To compact: 5 files
    # written and fsynced, the new folder fsynced, renamed in, the store fsynced, then the
    # old one removed as above.
    assert len(seen) == 4 + 5 * 2 + 2 + 1 + 2 + 4 == EXPIRY_STEPS, seen


EXPIRY_STEPS = 23


@pytest.mark.parametrize("shard_format", FORMATS)
@pytest.mark.parametrize("step", range(1, EXPIRY_STEPS + 1))
def test_a_crash_at_any_step_of_expiry_loses_nothing_and_leaves_no_half_shard(
    tmp_path, monkeypatch, store_of_three_days, step, shard_format
):
    store_of_three_days(shard_format)
    crash_at(monkeypatch, step)
    with pytest.raises(Crash):
        expire(tmp_path, 2 * DAY, now=NOW)
    monkeypatch.undo()
    # Right after the crash every closed shard reads whole, and the kept examples are all
    # there, once each (a shard replaced but not yet removed is not read).
    numbers = stored_numbers(tmp_path)
    assert set(numbers) >= {5, 6, 7, 8} and len(numbers) == len(set(numbers))
    result = expire(tmp_path, 2 * DAY, now=NOW)  # the next run finishes the work
    assert stored_numbers(tmp_path) == [5, 6, 7, 8]
    assert result.examples_kept == 4
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("shard-")) == [
        feedback.EXPIRE_LOCK_FILE
    ]
