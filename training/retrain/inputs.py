"""The retrain's inputs: the byte per example that the assembly decided for each source
(training/sources.py), and the tf.data input and held-out set built from them over the
sources' readers (training/kinds/model_data.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import tensorflow as tf

from training import (
    sources,
)
from training.kinds.model_data import HeldOut, ModelData, Reader
from training.runs import EVAL_BATCH_SIZE

# --- the selections, the training input and the held-out set ----------------------------------


def write_selections(run_dir: Path, readers: list[Reader], selections) -> list[Path]:
    """Each source's byte per example (sources.assemble's), where the input reads them."""
    folder = run_dir / "data"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for number, (reader, selection) in enumerate(zip(readers, selections, strict=True)):
        if len(selection) != reader.count:
            raise AssertionError(
                f"{reader.name}: {len(selection)} decisions, {reader.count} examples"
            )
        path = folder / f"select-{number}.bin"
        path.write_bytes(np.asarray(selection, np.uint8).tobytes())
        paths.append(path)
    return paths


def _decision(byte):
    return tf.io.decode_raw(byte, tf.uint8)[0]


def _without_code(features, target, code):
    return features, target


def _selected(reader: Reader, path: Path, codes: tuple[int, ...]) -> tf.data.Dataset:
    """(features, target, code) of a source's examples whose byte is one of `codes`."""
    decisions = tf.data.FixedLengthRecordDataset(str(path), 1).map(_decision)
    wanted = tf.constant(codes, tf.uint8)

    def chosen(example, code):
        return tf.reduce_any(tf.equal(code, wanted))

    def flat(example, code):
        features, target = example
        return features, target, code

    return tf.data.Dataset.zip((reader.dataset(), decisions)).filter(chosen).map(flat)


def training_input(
    model: ModelData, readers, paths, trained: list[int], batch_size: int, seed: int | None
) -> tf.data.Dataset:
    """Every source's trained examples, each shuffled within its buffer and repeated, the
    sources sampled in proportion to what they give; batched."""
    # In a scope of its own: sample_from_datasets makes a top-level op named "logits", and a
    # pre-made DNN's Keras layer of that name would then take "logits_1" for its variables,
    # which no checkpoint of the model has.
    with tf.name_scope("retrain_input"):
        parts, weights = [], []
        for reader, path, count in zip(readers, paths, trained, strict=True):
            if count:
                part = _selected(reader, path, (sources.TRAIN,)).map(_without_code)
                parts.append(part.shuffle(model.shuffle_buffer(count), seed=seed).repeat())
                weights.append(count / sum(trained))
        mixed = (
            parts[0]
            if len(parts) == 1
            else tf.data.Dataset.sample_from_datasets(parts, weights=weights, seed=seed)
        )

        def labeled(features, target):
            return features, model.to_label(target)

        return (
            mixed.map(labeled, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(batch_size)
            .prefetch(tf.data.AUTOTUNE)
        )


def trained_examples(readers, paths) -> tf.data.Dataset:
    """(features, target) of every trained example, source after source, once."""
    found = None
    for reader, path in zip(readers, paths, strict=True):
        part = _selected(reader, path, (sources.TRAIN,)).map(_without_code)
        found = part if found is None else found.concatenate(part)
    return found


def held_out_input(readers, paths) -> tf.data.Dataset:
    """(features, target, code) of every held-out example, source after source."""
    found = None
    for reader, path in zip(readers, paths, strict=True):
        part = _selected(reader, path, sources.HELD_CODES)
        found = part if found is None else found.concatenate(part)
    return found


def evaluation_input(model: ModelData, readers, paths) -> tf.data.Dataset:
    """The held-out set as the Estimator's evaluation takes it: (features, label), batched."""

    def labeled(features, target, code):
        return features, model.to_label(target)

    return held_out_input(readers, paths).map(labeled).batch(EVAL_BATCH_SIZE)


def held_out_set(model: ModelData, readers, paths) -> HeldOut:
    """The held-out set: read once here for its truth and slices (a few numbers an
    example); its features are streamed again for each model that predicts it."""

    def batches():
        return held_out_input(readers, paths).batch(EVAL_BATCH_SIZE).as_numpy_iterator()

    truths, codes = [], []
    groups: dict[str, list[np.ndarray]] = {}
    for features, targets, batch_codes in batches():
        truths.append(targets)
        codes.append(batch_codes)
        for column, values in model.groups(features).items():
            groups.setdefault(column, []).append(values)
    truth = np.concatenate(truths) if truths else np.zeros(0)
    code = np.concatenate(codes) if codes else np.zeros(0, np.uint8)
    slices = {
        sources.TEST_SLICE: np.isin(code, (sources.HELD_TEST, sources.HELD_REFERENCE)),
        sources.NEW_SLICE: code == sources.HELD_NEW,
        sources.REFERENCE_SLICE: code == sources.HELD_REFERENCE,
    }
    return HeldOut(
        model,
        batches,
        truth,
        slices,
        {column: np.concatenate(parts) for column, parts in groups.items()},
    )


def steps_per_epoch(trained: int, batch_size: int) -> int:
    return max(1, math.ceil(trained / batch_size))
