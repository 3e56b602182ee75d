"""The service's feedback as a retrain source, bounded per sender; and expiring old feedback.

The retrain (`--feedback-dir`) reads the closed shards of a model's store
(artifact/feedback/) and keeps, of each sender's examples (provenance.txt: a token's name;
`unknown` for shards older than provenance), only:

- those received within `--feedback-max-age-days` (a shard older than provenance counts as
  received when it was closed);
- none at all for an `--exclude-sender`;
- at most `--max-feedback-per-sender`, spread across the days (UTC) the sender sent them:
  the cap is shared out equally among its days (a day with fewer examples than its share
  gives the rest to the others; what cannot be shared equally goes to the newest days), and
  a day's share is taken evenly spread over that day's examples in the order they came.

So one token, however much it posts, adds at most that many examples to the candidate's
training and held-out data, and a burst at one moment (a token shared by several senders,
or one turned hostile) takes at most its day's share: it cannot push out what the sender
sent on other days, as keeping only the newest N let it. The choice is made from the
shards' bookkeeping alone (their provenance and versions, not their examples): what it keeps
is a mask per shard, which the retrain applies as it streams the examples from the shards
(training/kinds/model_data.py). What was read, kept and dropped, per sender, goes into the
sources table and blessing.json.

`python -m training expire-feedback` removes old images from the store itself (removed or
compacted shards, crash-safe: artifact.feedback.expire); it needs write access to the store,
which the retrain does not.

Pure numpy (the fast tier tests it).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
from pathlib import Path

import numpy as np

from artifact import feedback
from training.configs import ExpireFeedbackConfig
from training.errors import DataError

DEFAULT_MAX_PER_SENDER = 5000


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def positive_days(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of days, got {text}")
    return value


def sender_name(text: str) -> str:
    if not feedback.SENDER_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"a sender's name is 1-64 letters, digits and _.@- (a token's name), got {text!r}"
        )
    return text


non_negative_int.__name__ = "non-negative integer"
positive_days.__name__ = "positive number of days"
sender_name.__name__ = "sender name"


def add_retrain_arguments(group) -> None:
    """The retrain's options on how feedback is read (an argparse group)."""
    group.add_argument(
        "--max-feedback-per-sender",
        type=non_negative_int,
        default=DEFAULT_MAX_PER_SENDER,
        metavar="N",
        help="read at most N feedback examples of each sender (a token's name), spread "
        "across the days it sent them; 0 = no limit (default: %(default)s)",
    )
    group.add_argument(
        "--exclude-sender",
        action="append",
        default=[],
        type=sender_name,
        metavar="NAME",
        help="read no feedback of this sender (a token's name; `unknown` for feedback stored "
        "before senders were recorded); repeat for several",
    )
    group.add_argument(
        "--feedback-max-age-days",
        type=positive_days,
        default=None,
        metavar="DAYS",
        help="read only feedback received within DAYS (default: all)",
    )


@dataclasses.dataclass(frozen=True)
class FeedbackSelection:
    """The closed shards of a store (oldest first) and, per shard, which examples are read."""

    store: Path
    shards: tuple[feedback.ShardInfo, ...]
    keep: tuple[np.ndarray, ...]  # bool per example of each shard
    detail: dict  # shards, answered_by_version, senders, max_per_sender, excluded, max age

    @property
    def read(self) -> int:
        return int(sum(mask.sum() for mask in self.keep))


def select_feedback(
    store: Path,
    max_per_sender: int = DEFAULT_MAX_PER_SENDER,
    exclude: tuple[str, ...] = (),
    max_age: dt.timedelta | None = None,
    now: dt.datetime | None = None,
) -> FeedbackSelection:
    """The store's closed shards and the examples of each that are read, bounded per sender
    (above), from their bookkeeping only.

    Raises:
        DataError: a closed shard is damaged (the message names the file).
    """
    paths = feedback.closed_shards(store)
    now = now or dt.datetime.now(dt.UTC)
    cutoff = None if max_age is None else now - max_age
    excluded = set(exclude)
    try:
        shards = [feedback.read_info(path) for path in paths]
    except feedback.FeedbackFormatError as err:
        raise DataError(str(err)) from err
    keeps = [np.zeros(len(shard), bool) for shard in shards]
    per_sender: dict[str, dict[str, int]] = {}
    answered: dict[str, int] = {}
    # Per sender, what may be read: (received at, shard, example), in the order they came.
    candidates: dict[str, list[tuple[dt.datetime, int, int]]] = {}
    for number, shard in enumerate(shards):
        senders = shard.senders or (feedback.UNKNOWN_SENDER,) * len(shard)
        times = feedback.received_times(shard)
        for i, sender in enumerate(senders):
            counts = per_sender.setdefault(
                sender, {"stored": 0, "read": 0, "excluded": 0, "expired": 0, "over_cap": 0}
            )
            counts["stored"] += 1
            if sender in excluded:
                counts["excluded"] += 1
            elif cutoff is not None and times[i] < cutoff:
                counts["expired"] += 1
            else:
                candidates.setdefault(sender, []).append((times[i], number, i))
    for sender, found in candidates.items():
        found.sort()
        chosen = spread_across_days(found, max_per_sender) if max_per_sender else found
        per_sender[sender]["read"] = len(chosen)
        per_sender[sender]["over_cap"] = len(found) - len(chosen)
        for _, number, i in chosen:
            keeps[number][i] = True
            version = shards[number].versions[i]
            key = "unknown" if version is None else str(version)
            answered[key] = answered.get(key, 0) + 1
    return FeedbackSelection(
        Path(store),
        tuple(shards),
        tuple(keeps),
        {
            "shards": len(paths),
            "answered_by_version": answered,
            "senders": dict(sorted(per_sender.items())),
            "max_per_sender": max_per_sender or None,
            "excluded_senders": sorted(excluded),
            "max_age_days": None if max_age is None else max_age / dt.timedelta(days=1),
        },
    )


def spread_across_days(
    examples: list[tuple[dt.datetime, int, int]], cap: int
) -> list[tuple[dt.datetime, int, int]]:
    """At most `cap` of one sender's examples ((received at, ...) in the order they came),
    spread across the UTC days they came on: each day gets an equal share of the cap (a day
    with fewer gives the rest to the others, the newest days take what cannot be shared
    equally), and a day's share is taken evenly spread over its examples."""
    if len(examples) <= cap:
        return list(examples)
    days: dict[dt.date, list] = {}
    for example in examples:
        days.setdefault(example[0].astimezone(dt.UTC).date(), []).append(example)
    quotas = {}
    left, open_days = cap, sorted(days, key=lambda day: (len(days[day]), day))
    # Water-filling: the smallest days first, each taking all it has while that is within
    # an equal share of what is left.
    while open_days and len(days[open_days[0]]) * len(open_days) <= left:
        day = open_days.pop(0)
        quotas[day] = len(days[day])
        left -= quotas[day]
    if open_days:
        share, extra = divmod(left, len(open_days))
        for rank, day in enumerate(sorted(open_days, reverse=True)):  # the newest first
            quotas[day] = share + (1 if rank < extra else 0)
    chosen = []
    for day in sorted(days):
        found, quota = days[day], quotas[day]
        chosen += [found[int((j + 0.5) * len(found) / quota)] for j in range(quota)]
    return sorted(chosen)


def format_senders(detail: dict) -> str:
    """Per sender: stored, read, and why the rest was not."""
    header = ("sender", "stored", "read", "excluded", "expired", "over cap")
    keys = ("stored", "read", "excluded", "expired", "over_cap")
    rows = [header] + [
        (name, *(f"{counts[k]:,}" for k in keys)) for name, counts in detail["senders"].items()
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row))
        for row in rows
    )


def expire_feedback(config: ExpireFeedbackConfig) -> int:
    """Remove or compact the shards of examples older than --max-age-days."""
    root = Path(config.feedback_dir)
    if not root.is_dir():
        raise DataError(f"--feedback-dir {root}: folder not found")
    if not config.model or "/" in config.model or config.model in (".", ".."):
        raise DataError(f"--model {config.model!r}: not a model's folder name")
    store = feedback.store_dir(root, config.model)
    try:
        result = feedback.expire(store, dt.timedelta(days=config.max_age_days))
    except feedback.FeedbackFormatError as err:
        raise DataError(str(err)) from err
    print(
        f"{store}: {result.examples_dropped:,} examples older than {config.max_age_days:g} "
        f"days removed ({len(result.removed)} shards removed, {len(result.compacted)} "
        f"compacted); {result.examples_kept:,} kept"
    )
    return 0
