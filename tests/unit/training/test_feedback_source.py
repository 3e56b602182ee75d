"""The feedback a retrain reads, bounded per sender: N of each spread across the days it sent
them, senders excluded,
old examples left out, shards older than provenance read as the unknown sender, chosen from
the shards' bookkeeping; and `expire-feedback`. No TensorFlow (the fast tier)."""

from __future__ import annotations

import argparse
import datetime as dt

import numpy as np
import pytest
from support.feedback_stores import (
    closed_name,
    example_numbers,
    numbered,
    numbered_records,
    stored_numbers,
    write_idx_shard,
)

from artifact.feedback import PROVENANCE_FILE, FeedbackWriter, closed_shards, read_examples
from training.commands import expire_feedback
from training.errors import DataError
from training.feedback_source import (
    format_senders,
    select_feedback,
)

NOW = dt.datetime(2026, 6, 10, 12, 0, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)


def numbers(selection) -> list[int]:
    """The numbers of the examples a selection reads, in the store's order."""
    found = []
    for shard, keep in zip(selection.shards, selection.keep, strict=True):
        shard_numbers = example_numbers(read_examples(shard.path))
        found += [n for n, kept in zip(shard_numbers, keep, strict=True) if kept]
    return found


@pytest.fixture
def store(tmp_path):
    """alice sent 0-3 (day 1) and 10-11 (day 3); mallory 20-29 (day 3), in three shards."""
    writer = FeedbackWriter(tmp_path / "m", shard_examples=5, max_bytes=10**8)
    writer.open()
    writer.append(numbered_records(0, 4), [1] * 4, sender="alice", received_at=NOW - 3 * DAY)
    writer.append(numbered_records(20, 10), [None] * 10, sender="mallory", received_at=NOW - DAY)
    writer.append(numbered_records(10, 2), [2] * 2, sender="alice", received_at=NOW - DAY)
    writer.close()
    return tmp_path / "m"


def test_everything_is_read_in_the_order_it_came_without_bounds(store):
    source = select_feedback(store, max_per_sender=0, now=NOW)
    assert numbers(source) == [0, 1, 2, 3, *range(20, 30), 10, 11]
    assert source.read == 16
    assert source.detail["answered_by_version"] == {"1": 4, "unknown": 10, "2": 2}
    assert source.detail["senders"]["mallory"] == {
        "stored": 10, "read": 10, "excluded": 0, "expired": 0, "over_cap": 0
    }  # fmt: skip


def test_each_sender_gives_at_most_n_spread_across_its_days(store):
    source = select_feedback(store, max_per_sender=3, now=NOW)
    # alice: one of day 1's four (its middle) and both of day 3's (the newest day gets the
    # share left over); mallory: three of its ten, evenly spread.
    assert numbers(source) == [2, 21, 25, 28, 10, 11]
    assert source.detail["senders"]["mallory"]["over_cap"] == 7
    assert source.detail["senders"]["alice"] == {
        "stored": 6, "read": 3, "excluded": 0, "expired": 0, "over_cap": 3
    }  # fmt: skip
    table = format_senders(source.detail)
    assert table.splitlines()[0].split() == [
        "sender",
        "stored",
        "read",
        "excluded",
        "expired",
        "over",
        "cap",
    ]
    assert table.splitlines()[2].split() == ["mallory", "10", "3", "0", "0", "7"]


def test_a_flood_in_one_day_does_not_push_out_a_senders_history(tmp_path):
    """One name for several senders (the review: `make tokens` issued one), or one sender
    turned hostile: a month of an example a day, then 3,000 in an hour. The newest 60 were
    all the flood's; spread across the days, the month keeps its place."""
    writer = FeedbackWriter(tmp_path / "m", shard_examples=500, max_bytes=10**9)
    writer.open()
    for day in range(30):
        when = NOW - (31 - day) * DAY
        writer.append(numbered_records(day, 1), [1], sender="lab", received_at=when)
    flood = numbered_records(200, 1) * 500  # example 200, again and again
    for part in range(6):
        when = NOW - DAY + dt.timedelta(minutes=10 * part)
        writer.append(flood, [1] * 500, sender="lab", received_at=when)
    writer.close()
    source = select_feedback(tmp_path / "m", max_per_sender=60, now=NOW)
    kept = numbers(source)
    assert len(kept) == 60
    assert [n for n in kept if n < 200] == list(range(30)), "the month's examples"
    assert kept.count(200) == 30
    # The flood's share, spread over it (positions in the order the store holds them).
    positions = np.flatnonzero(np.concatenate(source.keep))
    flood_kept = positions[positions >= 30] - 30
    assert flood_kept.min() < 100 and flood_kept.max() > 2900
    assert source.detail["senders"]["lab"]["over_cap"] == 3000 - 30


def test_an_excluded_sender_gives_nothing_and_old_images_are_left_out(store):
    source = select_feedback(store, exclude=("mallory",), max_age=2 * DAY, now=NOW)
    assert numbers(source) == [10, 11]
    assert source.detail["senders"]["mallory"]["excluded"] == 10
    assert source.detail["senders"]["alice"]["expired"] == 4
    assert source.detail["excluded_senders"] == ["mallory"] and source.detail["max_age_days"] == 2


def test_shards_older_than_provenance_are_the_unknown_senders(tmp_path):
    """MNIST-format shards of the version before provenance, the newest first."""
    for number, start in enumerate((0, 5)):
        name = closed_name(NOW - dt.timedelta(hours=2 - number), "old", number)
        write_idx_shard(tmp_path, name, *numbered(start, 5), [None] * 5)
    source = select_feedback(tmp_path, max_per_sender=7, now=NOW)
    keep = [mask.tolist() for mask in source.keep]
    # Received at latest when its shard closed (one day): seven spread over the ten.
    assert keep == [[True, False, True, True, False], [True, True, True, False, True]]
    assert list(source.detail["senders"]) == ["unknown"]
    assert [shard.format for shard in source.shards] == ["idx", "idx"]
    assert select_feedback(tmp_path, exclude=("unknown",)).read == 0


def test_an_empty_or_missing_store_is_no_feedback(tmp_path):
    source = select_feedback(tmp_path / "none")
    assert source.read == 0 and source.shards == () and source.detail["senders"] == {}


def test_a_damaged_shard_is_a_data_error_naming_it(store):
    shard = closed_shards(store)[0]
    (shard / PROVENANCE_FILE).write_text("nonsense\n")
    with pytest.raises(DataError, match=str(shard / PROVENANCE_FILE)):
        select_feedback(store)


def expire_args(*argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    expire_feedback.add_arguments(parser)
    return parser.parse_args([str(a) for a in argv])


def test_expire_feedback_removes_what_is_older_from_the_store(store, capsys):
    # Two days and a half before NOW, counted from today: alice's first four go.
    days = (dt.datetime.now(dt.UTC) - NOW) / DAY + 2.5
    code = expire_feedback.run(
        expire_args("--feedback-dir", store.parent, "--model", "m", "--max-age-days", days)
    )
    assert code == 0
    assert stored_numbers(store) == [*range(20, 30), 10, 11]
    out = capsys.readouterr().out
    assert "4 examples older than" in out and "(0 shards removed, 1 compacted); 12 kept" in out
    with pytest.raises(DataError, match="folder not found"):
        expire_feedback.run(
            expire_args("--feedback-dir", store / "x", "--model", "m", "--max-age-days", 1)
        )
    with pytest.raises(SystemExit):
        expire_args("--feedback-dir", store.parent, "--model", "m", "--max-age-days", 0)
