"""The retrain's data: every source, duplicates counted once, split into trained and held out.

Sources come in a fixed order: the base test split (all held out), the base train split (all
trained on), then the new data (`--extra-data`, then the service's feedback). Each example is
known here only by a digest of its content (the bytes the model reads: an IDX image's 784
pixels; a CSV row's typed feature values; an image's pixels at the model's size), its label,
and two keys of its content (training/kinds/model_data.py scans the sources once, one
example at a time, and streams them again from their files to train): so memory grows by a few dozen
bytes an example, not by the examples.

An example already seen (the same content) is dropped where it comes again, so an example of
the test split is never trained on whatever label it comes back with. New data is split by a
seeded hash of each example's content: an example is held out or trained on whatever else is
in the set, so it stays on its side from one nightly run to the next (a run that warm-starts
from yesterday's checkpoint was never trained on what it is judged by).

The reference slice (REFERENCE_RULE) is a fixed half of the base test split, chosen by a hash
of each example with a fixed seed: the same examples on every run, whatever --holdout-seed
says, and none of them can come from feedback (the test split comes first, so feedback that
repeats one of its examples is dropped, label and all). The gate checks the candidate on it
too (training/blessing.py), so feedback, however much of it, cannot move that check.

What the assembly decides is one byte an example of each source (SKIP, TRAIN or a held-out
code), which the training and evaluation input read beside the examples.

Pure numpy (the fast tier tests it).
"""

from __future__ import annotations

import array
import dataclasses
import hashlib

import numpy as np

from training.blessing import NEW_SLICE, REFERENCE_SLICE, TEST_SLICE

HELD_OUT, TRAINED, NEW = "held out", "trained", "new"
HOLDOUT_RULE = (
    "an example is held out when blake2b(seed as 8 bytes big-endian + its content: an IDX "
    "image's 784 bytes, a row's typed features, an image's pixels), read as a big-endian "
    "64-bit fraction, is below the fraction"
)
REFERENCE_SEED = 0x5EED
REFERENCE_FRACTION = 0.5
REFERENCE_RULE = (
    "an example of the base test split is in the reference slice when blake2b(0x5EED as 8 "
    "bytes big-endian + its content: an IDX image's 784 bytes, a row's typed features, an "
    "image's pixels), read as a big-endian 64-bit fraction, is below 0.5"
)
# What the retrain does with each example of a source: one byte each.
SKIP, TRAIN, HELD_NEW, HELD_TEST, HELD_REFERENCE = 0, 1, 2, 3, 4
HELD_CODES = (HELD_NEW, HELD_TEST, HELD_REFERENCE)
DIGEST_BYTES = 16


def _key(seed: int, content: bytes) -> int:
    digest = hashlib.blake2b(seed.to_bytes(8, "big", signed=True) + content, digest_size=8)
    return int.from_bytes(digest.digest(), "big")


def held_out_share(content: bytes, seed: int) -> float:
    """Where an example falls in [0, 1) for the held-out split (HOLDOUT_RULE)."""
    return _key(seed, content) / 2**64


def _below(keys: np.ndarray, fraction: float) -> np.ndarray:
    """keys / 2**64 < fraction, exactly (a float64 cannot hold every 64-bit key)."""
    bound = int(fraction * 2**64)  # a float in [0, 1) times 2**64: an integer below 2**64
    return keys < np.uint64(bound)


@dataclasses.dataclass(frozen=True)
class Scanned:
    """One source as the scan read it: per example a digest of its content, its label, its
    keys for the held-out split and the reference slice, and whether it is offered at all
    (False: left out before, such as feedback past a sender's cap)."""

    name: str  # e.g. "train split", "extra data", "feedback"
    path: str
    role: str  # HELD_OUT (the test split), TRAINED (the base train split) or NEW
    digests: np.ndarray  # uint8 [n, DIGEST_BYTES]: blake2b of each example's content
    labels: np.ndarray  # float64 [n]: class ids, or a regressor's values
    holdout_keys: np.ndarray  # uint64 [n]: HOLDOUT_RULE's 64-bit number for the seed
    reference_keys: np.ndarray  # uint64 [n]: REFERENCE_RULE's
    offered: np.ndarray  # bool [n]
    detail: dict = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.labels)


class ScanBuilder:
    """Collects one source's examples, one at a time, into a Scanned (in packed arrays: 49
    bytes an example)."""

    def __init__(self, holdout_seed: int):
        self.holdout_seed = holdout_seed
        self._digests = bytearray()
        self._labels = array.array("d")
        self._holdout = array.array("Q")
        self._reference = array.array("Q")
        self._offered = bytearray()

    def add(self, content: bytes, label: float) -> None:
        """One example offered: its content's bytes and its label."""
        self._digests += hashlib.blake2b(content, digest_size=DIGEST_BYTES).digest()
        self._labels.append(float(label))
        self._holdout.append(_key(self.holdout_seed, content))
        self._reference.append(_key(REFERENCE_SEED, content))
        self._offered.append(1)

    def skip(self) -> None:
        """One example not offered (it keeps its place in the source's order)."""
        self._digests += bytes(DIGEST_BYTES)
        self._labels.append(0.0)
        self._holdout.append(0)
        self._reference.append(0)
        self._offered.append(0)

    def build(self, name: str, path: str, role: str, detail: dict | None = None) -> Scanned:
        count = len(self._labels)
        return Scanned(
            name,
            path,
            role,
            np.frombuffer(self._digests, np.uint8).reshape(count, DIGEST_BYTES),
            np.frombuffer(self._labels, np.float64),
            np.frombuffer(self._holdout, np.uint64),
            np.frombuffer(self._reference, np.uint64),
            np.frombuffer(self._offered, np.uint8).astype(bool),
            dict(detail or {}),
        )


@dataclasses.dataclass(frozen=True)
class Assembled:
    """What to do with each example of each source, and the bookkeeping."""

    selections: list[np.ndarray]  # per source, uint8 [n]: SKIP, TRAIN or a held-out code
    sources: list[dict]  # per source: read, duplicates, conflicts, held out, trained, ...
    hashes: dict[str, str]  # sha256 of the training set and of the held-out set
    holdout: dict

    def count(self, *codes: int) -> int:
        return int(sum(np.isin(s, codes).sum() for s in self.selections))

    @property
    def train_count(self) -> int:
        return self.count(TRAIN)

    @property
    def held_out_count(self) -> int:
        return self.count(*HELD_CODES)

    def slice_counts(self) -> dict[str, int]:
        """Held-out examples per slice."""
        return {
            TEST_SLICE: self.count(HELD_TEST, HELD_REFERENCE),
            NEW_SLICE: self.count(HELD_NEW),
            REFERENCE_SLICE: self.count(HELD_REFERENCE),
        }


def _examples_hash(digests: np.ndarray, labels: np.ndarray) -> str:
    """sha256 of each example's digest and label (float64, big-endian), in order."""
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(digests, np.uint8).tobytes())
    digest.update(np.asarray(labels, ">f8").tobytes())
    return digest.hexdigest()


def assemble(sources: list[Scanned], holdout_fraction: float, holdout_seed: int) -> Assembled:
    """Drop duplicates, split the new data, and count what came from where.

    Args:
        sources: in priority order; the first occurrence of a content wins.
        holdout_fraction: the share of new examples held out, in [0, 1).
        holdout_seed: the seed the sources' holdout keys were made with.
    """
    offered = [np.flatnonzero(s.offered) for s in sources]
    digests = np.concatenate(
        [s.digests[o] for s, o in zip(sources, offered, strict=True)]
        or [np.zeros((0, DIGEST_BYTES), np.uint8)]
    )
    labels = np.concatenate(
        [s.labels[o] for s, o in zip(sources, offered, strict=True)] or [np.zeros(0)]
    )
    keys = np.ascontiguousarray(digests).view(f"V{DIGEST_BYTES}").ravel()
    _, first_index, inverse = np.unique(keys, return_index=True, return_inverse=True)
    first = np.zeros(len(keys), bool)
    first[first_index] = True
    conflict = ~first & (labels != labels[first_index][inverse.ravel()])
    selections, stats = [], []
    train_parts, held_parts = [], []
    start = 0
    for source, indices in zip(sources, offered, strict=True):
        end = start + len(indices)
        kept = first[start:end]
        selection = np.full(len(source), SKIP, np.uint8)
        kept_indices = indices[kept]
        if source.role == HELD_OUT:
            in_reference = _below(source.reference_keys[kept_indices], REFERENCE_FRACTION)
            selection[kept_indices] = np.where(in_reference, HELD_REFERENCE, HELD_TEST)
        elif source.role == NEW:
            held = _below(source.holdout_keys[kept_indices], holdout_fraction)
            selection[kept_indices] = np.where(held, HELD_NEW, TRAIN)
        else:
            selection[kept_indices] = TRAIN
        trained = selection == TRAIN
        held_mask = np.isin(selection, HELD_CODES)
        train_parts.append((source.digests[trained], source.labels[trained]))
        held_parts.append((source.digests[held_mask], source.labels[held_mask]))
        selections.append(selection)
        stats.append(
            {
                "source": source.name,
                "path": source.path,
                "role": source.role,
                "sha256": _examples_hash(source.digests[indices], source.labels[indices]),
                "read": len(indices),
                "duplicates": int((~kept).sum()),
                "label_conflicts": int(conflict[start:end].sum()),
                "held_out": int(held_mask.sum()),
                "trained": int(trained.sum()),
                **source.detail,
            }
        )
        start = end

    def joined(parts):
        if not parts:
            return np.zeros((0, DIGEST_BYTES), np.uint8), np.zeros(0)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    return Assembled(
        selections,
        stats,
        {
            "train": _examples_hash(*joined(train_parts)),
            "held_out": _examples_hash(*joined(held_parts)),
        },
        {"fraction": holdout_fraction, "seed": holdout_seed, "rule": HOLDOUT_RULE},
    )
