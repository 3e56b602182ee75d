"""The retrain's data: every source, duplicates counted once, split into trained and held out.

Sources come in a fixed order: the base test split (all held out), the base train split (all
trained on), then the new data (`--extra-data` folders, then the service's feedback). An image
already seen (the same bytes) is dropped where it comes again, so an image of the test split
is never trained on whatever label it comes back with. New data is split by a seeded hash of
each image's bytes: an image is held out or trained on whatever else is in the set, so it
stays on its side from one nightly run to the next (a run that warm-starts from yesterday's
checkpoint was never trained on what it is judged by).

The reference slice (REFERENCE_RULE) is a fixed half of the base test split, chosen by a hash
of each image with a fixed seed: the same images on every run, whatever --holdout-seed says,
and none of them can come from feedback (the test split comes first, so feedback that repeats
one of its images is dropped, label and all). The gate checks the candidate on it too
(training/blessing.py), so feedback, however much of it, cannot move that check.

Pure numpy (the fast tier tests it).
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from training.blessing import NEW_SLICE, TEST_SLICE

HELD_OUT, TRAINED, NEW = "held out", "trained", "new"
HOLDOUT_RULE = (
    "an image is held out when blake2b(seed as 8 bytes big-endian + its 784 bytes), read as "
    "a big-endian 64-bit fraction, is below the fraction"
)
REFERENCE_SEED = 0x5EED
REFERENCE_FRACTION = 0.5
REFERENCE_RULE = (
    "an image of the base test split is in the reference slice when blake2b(0x5EED as 8 "
    "bytes big-endian + its 784 bytes), read as a big-endian 64-bit fraction, is below 0.5"
)


@dataclasses.dataclass(frozen=True)
class Source:
    """One source of labeled images and what the retrain does with it."""

    name: str  # e.g. "train split", "extra data", "feedback"
    path: str
    images: np.ndarray  # uint8 [n, 28, 28]
    labels: np.ndarray  # uint8 [n]
    role: str  # HELD_OUT (the test split), TRAINED (the base train split) or NEW
    detail: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Assembled:
    """The training set, the held-out set (with each example's slice) and the bookkeeping."""

    train_images: np.ndarray
    train_labels: np.ndarray
    held_out_images: np.ndarray
    held_out_labels: np.ndarray
    held_out_slices: np.ndarray  # TEST_SLICE or NEW_SLICE per held-out example
    sources: list[dict]
    hashes: dict[str, str]
    holdout: dict
    # Per held-out example: in the reference slice (REFERENCE_RULE; test split images only).
    reference: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, bool))


def data_hash(images: np.ndarray, labels: np.ndarray) -> str:
    """sha256 of the images' and labels' bytes (uint8), so a gzip or a new file name does
    not change it."""
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(images, np.uint8).tobytes())
    digest.update(np.ascontiguousarray(labels, np.uint8).tobytes())
    return digest.hexdigest()


def held_out_share(image: bytes, seed: int) -> float:
    """Where an image falls in [0, 1) for the held-out split (HOLDOUT_RULE)."""
    key = hashlib.blake2b(seed.to_bytes(8, "big", signed=True) + image, digest_size=8).digest()
    return int.from_bytes(key, "big") / 2**64


def assemble(sources: list[Source], holdout_fraction: float, holdout_seed: int) -> Assembled:
    """Drop duplicates, split the new data, and count what came from where.

    Args:
        sources: in priority order; the first occurrence of an image wins.
        holdout_fraction: the share of new images held out, in [0, 1).
        holdout_seed: the hash's seed.
    """
    seen: dict[bytes, int] = {}  # image digest -> its label
    train_parts, held_parts, slices, stats, reference = [], [], [], [], []
    for source in sources:
        images = np.ascontiguousarray(source.images, np.uint8)
        labels = np.asarray(source.labels, np.uint8)
        keep = np.zeros(len(images), bool)
        held = np.zeros(len(images), bool)
        in_reference = np.zeros(len(images), bool)
        duplicates = conflicts = 0
        for i in range(len(images)):
            raw = images[i].tobytes()
            digest = hashlib.blake2b(raw, digest_size=16).digest()
            first = seen.get(digest)
            if first is not None:
                duplicates += 1
                conflicts += int(first != labels[i])
                continue
            seen[digest] = int(labels[i])
            keep[i] = True
            if source.role == HELD_OUT:
                held[i] = True
                in_reference[i] = held_out_share(raw, REFERENCE_SEED) < REFERENCE_FRACTION
            elif source.role == NEW:
                held[i] = held_out_share(raw, holdout_seed) < holdout_fraction
        trained = keep & ~held
        train_parts.append((images[trained], labels[trained]))
        held_parts.append((images[held], labels[held]))
        reference.append(in_reference[held])
        slices.append(
            np.full(int(held.sum()), TEST_SLICE if source.role == HELD_OUT else NEW_SLICE)
        )
        stats.append(
            {
                "source": source.name,
                "path": source.path,
                "role": source.role,
                "sha256": data_hash(images, labels),
                "read": len(images),
                "duplicates": duplicates,
                "label_conflicts": conflicts,
                "held_out": int(held.sum()),
                "trained": int(trained.sum()),
                **source.detail,
            }
        )
    train_images = _concat([p[0] for p in train_parts], (0, 28, 28))
    train_labels = _concat([p[1] for p in train_parts], (0,))
    held_images = _concat([p[0] for p in held_parts], (0, 28, 28))
    held_labels = _concat([p[1] for p in held_parts], (0,))
    return Assembled(
        train_images,
        train_labels,
        held_images,
        held_labels,
        np.concatenate(slices) if slices else np.zeros(0, str),
        stats,
        {
            "train": data_hash(train_images, train_labels),
            "held_out": data_hash(held_images, held_labels),
        },
        {"fraction": holdout_fraction, "seed": holdout_seed, "rule": HOLDOUT_RULE},
        np.concatenate(reference) if reference else np.zeros(0, bool),
    )


def _concat(parts: list[np.ndarray], empty_shape: tuple[int, ...]) -> np.ndarray:
    parts = [p for p in parts if len(p)]
    return np.concatenate(parts) if parts else np.zeros(empty_shape, np.uint8)
