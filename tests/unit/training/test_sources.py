"""The retrain's data: duplicates counted once in priority order, a stable seeded held-out
split of the new data, counts and hashes. No TensorFlow (the fast tier)."""

from __future__ import annotations

import numpy as np
import pytest

from training.blessing import NEW_SLICE, TEST_SLICE
from training.sources import HELD_OUT, NEW, TRAINED, Source, assemble, data_hash, held_out_share


def images(*values: int) -> np.ndarray:
    """One image per value, every pixel that value."""
    return np.stack([np.full((28, 28), v, np.uint8) for v in values])


def source(name, values, labels, role) -> Source:
    return Source(name, f"/data/{name}", images(*values), np.asarray(labels, np.uint8), role)


def test_duplicates_are_counted_once_and_the_first_wins():
    assembled = assemble(
        [
            source("test split", [1, 2], [1, 2], HELD_OUT),
            source("train split", [3, 4, 3], [3, 4, 3], TRAINED),
            # 2 is a test image (never trained on), 4 a train image relabeled, 9 new twice.
            source("feedback", [2, 4, 9, 9], [2, 5, 9, 9], NEW),
        ],
        holdout_fraction=0.0,
        holdout_seed=0,
    )
    rows = {row["source"]: row for row in assembled.sources}
    assert {k: rows["train split"][k] for k in ("read", "duplicates", "trained", "held_out")} == {
        "read": 3, "duplicates": 1, "trained": 2, "held_out": 0
    }  # fmt: skip
    assert rows["feedback"]["duplicates"] == 3 and rows["feedback"]["label_conflicts"] == 1
    assert rows["feedback"]["trained"] == 1
    assert sorted(assembled.train_images[:, 0, 0].tolist()) == [3, 4, 9]
    assert assembled.held_out_images[:, 0, 0].tolist() == [1, 2]
    assert assembled.held_out_slices.tolist() == [TEST_SLICE, TEST_SLICE]


def test_new_data_is_held_out_by_a_seeded_hash_of_each_image():
    values = list(range(10, 210))
    new = source("extra data", values, [v % 10 for v in values], NEW)
    first = assemble([new], holdout_fraction=0.25, holdout_seed=7)
    held = set(first.held_out_images[:, 0, 0].tolist())
    assert 25 <= len(held) <= 75, len(held)  # about a quarter of 200
    assert first.held_out_slices.tolist() == [NEW_SLICE] * len(held)
    # Stable whatever else is in the set: half the images, in another order, same sides.
    fewer = source("extra data", values[::-2], [v % 10 for v in values[::-2]], NEW)
    second = assemble([fewer], holdout_fraction=0.25, holdout_seed=7)
    assert set(second.held_out_images[:, 0, 0].tolist()) == held & set(values[::-2])
    # Another seed, another split.
    other = assemble([new], holdout_fraction=0.25, holdout_seed=8)
    assert set(other.held_out_images[:, 0, 0].tolist()) != held
    assert first.holdout["fraction"] == 0.25 and first.holdout["seed"] == 7


def test_the_held_out_share_is_the_documented_hash():
    import hashlib

    image = images(5)[0].tobytes()
    key = hashlib.blake2b((3).to_bytes(8, "big") + image, digest_size=8).digest()
    assert held_out_share(image, 3) == int.from_bytes(key, "big") / 2**64


@pytest.mark.parametrize(
    "labels_b, same",
    [
        pytest.param([1, 2], True, id="same-data"),
        pytest.param([1, 3], False, id="one-label-differs"),
    ],
)
def test_hashes_cover_images_and_labels(labels_b, same):
    a = data_hash(images(1, 2), np.asarray([1, 2], np.uint8))
    b = data_hash(images(1, 2), np.asarray(labels_b, np.uint8))
    assert (a == b) is same


def test_hashes_of_the_sets_trained_on_and_held_out():
    assembled = assemble([source("train split", [1, 2], [1, 2], TRAINED)], 0.2, 0)
    assert assembled.hashes["train"] == data_hash(images(1, 2), np.asarray([1, 2], np.uint8))
    assert assembled.hashes["held_out"] == data_hash(
        np.zeros((0, 28, 28), np.uint8), np.zeros(0, np.uint8)
    )


def test_the_reference_slice_is_a_fixed_half_of_the_test_split_no_feedback_reaches():
    import hashlib

    values = list(range(0, 200))
    test = source("test split", values, [v % 10 for v in values], HELD_OUT)
    # Feedback repeats every test image with another label, and adds new ones.
    flood = source("feedback", values + [250, 251], [(v + 1) % 10 for v in values] + [0, 1], NEW)
    for fraction, seed in ((0.0, 0), (0.5, 3), (0.9, 11)):
        assembled = assemble([test, flood], fraction, seed)
        reference = assembled.held_out_images[assembled.reference][:, 0, 0].tolist()
        expected = [
            v
            for v in values
            if int.from_bytes(
                hashlib.blake2b((0x5EED).to_bytes(8, "big") + images(v)[0].tobytes(), digest_size=8)
                .digest(), "big"
            ) / 2**64 < 0.5
        ]  # fmt: skip
        # REFERENCE_RULE, whatever the held-out fraction and seed; test split images only,
        # with their own labels.
        assert reference == expected and 70 <= len(expected) <= 130
        labels = assembled.held_out_labels[assembled.reference].tolist()
        assert labels == [v % 10 for v in expected]
        assert set(assembled.held_out_slices[assembled.reference]) == {TEST_SLICE}
