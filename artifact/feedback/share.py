"""A sender's share of the store: examples and bytes per sender, and the store's size."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections import Counter
from pathlib import Path

from artifact.feedback.layout import (
    CLOSED_PREFIX,
    EXAMPLES_FILE,
    IMAGES_FILE,
    LABELS_FILE,
    LABELS_HEADER,
    OPEN_PREFIX,
    PROVENANCE_FILE,
    SENDER_IMAGE_BYTES,
    UNKNOWN_SENDER,
)

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
