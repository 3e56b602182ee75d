"""The retrain's data: duplicates counted once in priority order, a stable seeded held-out
split of the new data, a reference slice no feedback reaches, counts and hashes; decided per
example from its content's digest and keys alone. No TensorFlow (the fast tier)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from training.sources import (
    HELD_NEW,
    HELD_OUT,
    HELD_REFERENCE,
    HELD_TEST,
    NEW,
    SKIP,
    TRAIN,
    TRAINED,
    ScanBuilder,
    assemble,
    held_out_share,
)


def content(value: int) -> bytes:
    """An IDX image's content, every pixel `value`."""
    return np.full((28, 28), value, np.uint8).tobytes()


def source(name, values, labels, role, seed: int = 0, skipped=()):
    builder = ScanBuilder(seed)
    for i, (value, label) in enumerate(zip(values, labels, strict=True)):
        if i in skipped:
            builder.skip()
        else:
            builder.add(content(value), label)
    return builder.build(name, f"/data/{name}", role)


def chosen(assembled, index: int, values, *codes) -> list[int]:
    """The values of a source whose examples got one of the codes."""
    selection = assembled.selections[index]
    return [v for v, code in zip(values, selection.tolist(), strict=True) if code in codes]


def test_duplicates_are_counted_once_and_the_first_wins():
    feedback = [2, 4, 9, 9]  # 2 is a test image (never trained on), 4 a train image relabeled
    assembled = assemble(
        [
            source("test split", [1, 2], [1, 2], HELD_OUT),
            source("train split", [3, 4, 3], [3, 4, 3], TRAINED),
            source("feedback", feedback, [2, 5, 9, 9], NEW),
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
    assert assembled.selections[1].tolist() == [TRAIN, TRAIN, SKIP]
    assert chosen(assembled, 2, feedback, TRAIN) == [9]
    assert set(assembled.selections[0].tolist()) <= {HELD_TEST, HELD_REFERENCE}
    assert (assembled.train_count, assembled.held_out_count) == (3, 2)
    assert assembled.slice_counts()["test split"] == 2


def test_an_example_not_offered_keeps_its_place_and_is_skipped():
    """Feedback past a sender's cap: not read, not counted, and not a duplicate's first."""
    assembled = assemble(
        [
            source("extra data", [5, 6], [5, 6], NEW, skipped={0}),
            source("feedback", [5], [5], NEW),
        ],
        holdout_fraction=0.0,
        holdout_seed=0,
    )
    assert assembled.selections[0].tolist() == [SKIP, TRAIN]
    assert assembled.selections[1].tolist() == [TRAIN]  # its first offered occurrence
    assert assembled.sources[0]["read"] == 1 and assembled.sources[0]["duplicates"] == 0


def test_new_data_is_held_out_by_a_seeded_hash_of_each_example():
    values = list(range(10, 210))
    labels = [v % 10 for v in values]
    first = assemble([source("extra data", values, labels, NEW, seed=7)], 0.25, 7)
    held = set(chosen(first, 0, values, HELD_NEW))
    assert 25 <= len(held) <= 75, len(held)  # about a quarter of 200
    assert set(chosen(first, 0, values, TRAIN)) == set(values) - held
    # Stable whatever else is in the set: half the examples, in another order, same sides.
    fewer = values[::-2]
    second = assemble([source("extra data", fewer, labels[::-2], NEW, seed=7)], 0.25, 7)
    assert set(chosen(second, 0, fewer, HELD_NEW)) == held & set(fewer)
    # Another seed, another split.
    other = assemble([source("extra data", values, labels, NEW, seed=8)], 0.25, 8)
    assert set(chosen(other, 0, values, HELD_NEW)) != held
    assert first.holdout["fraction"] == 0.25 and first.holdout["seed"] == 7


def test_the_held_out_share_is_the_documented_hash():
    image = content(5)
    key = hashlib.blake2b((3).to_bytes(8, "big") + image, digest_size=8).digest()
    assert held_out_share(image, 3) == int.from_bytes(key, "big") / 2**64


@pytest.mark.parametrize(
    "labels_b, same",
    [
        pytest.param([1, 2], True, id="same-data"),
        pytest.param([1, 3], False, id="one-label-differs"),
    ],
)
def test_hashes_cover_contents_and_labels(labels_b, same):
    a = assemble([source("train split", [1, 2], [1, 2], TRAINED)], 0.2, 0)
    b = assemble([source("train split", [1, 2], labels_b, TRAINED)], 0.2, 0)
    assert (a.hashes["train"] == b.hashes["train"]) is same
    assert (a.sources[0]["sha256"] == b.sources[0]["sha256"]) is same
    assert a.hashes["held_out"] == b.hashes["held_out"]  # nothing held out in either


def test_the_reference_slice_is_a_fixed_half_of_the_test_split_no_feedback_reaches():
    values = list(range(0, 200))
    # Feedback repeats every test image with another label, and adds new ones.
    flood_values = values + [250, 251]
    flood_labels = [(v + 1) % 10 for v in values] + [0, 1]
    expected = [
        v
        for v in values
        if int.from_bytes(
            hashlib.blake2b((0x5EED).to_bytes(8, "big") + content(v), digest_size=8).digest(),
            "big",
        ) / 2**64 < 0.5
    ]  # fmt: skip
    for fraction, seed in ((0.0, 0), (0.5, 3), (0.9, 11)):
        test = source("test split", values, [v % 10 for v in values], HELD_OUT, seed=seed)
        flood = source("feedback", flood_values, flood_labels, NEW, seed=seed)
        assembled = assemble([test, flood], fraction, seed)
        # REFERENCE_RULE, whatever the held-out fraction and seed; test split examples only.
        assert chosen(assembled, 0, values, HELD_REFERENCE) == expected
        assert 70 <= len(expected) <= 130
        assert HELD_REFERENCE not in assembled.selections[1].tolist()
        assert chosen(assembled, 1, flood_values, TRAIN, HELD_NEW) == [250, 251]
        assert assembled.slice_counts()["reference"] == len(expected)
