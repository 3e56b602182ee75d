"""TensorBoard: loss, accuracy, learning rate, examples/sec and input images in --model-dir."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import tensorflow as tf
from PIL import Image

from training.estimator import MODEL_KINDS, SUMMARY_IMAGES
from training.hooks import EXAMPLES_PER_SEC_TAG, STEP_TIME_TAG

TRAIN_TAGS = {"loss", "accuracy", "learning_rate", EXAMPLES_PER_SEC_TAG, STEP_TIME_TAG}


def summaries(directory: Path) -> dict[str, list]:
    """tag -> [(step, value)] of every event file directly in directory."""
    found: dict[str, list] = {}
    for path in sorted(directory.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, value))
    return found


def assert_training_summaries(model_dir: Path, last_step: int) -> None:
    written = summaries(model_dir)
    assert set(written) >= TRAIN_TAGS, sorted(written)
    images = sorted(tag for tag in written if tag.startswith("inputs/image/"))
    assert images == [f"inputs/image/{i}" for i in range(SUMMARY_IMAGES)]
    _, value = written[images[0]][0]
    picture = Image.open(io.BytesIO(value.image.encoded_image_string))
    assert picture.size == (28, 28) and value.image.colorspace == 1  # grayscale
    # examples/sec is written at the end of training at least, at the last step.
    step, value = written[EXAMPLES_PER_SEC_TAG][-1]
    assert step == last_step and value.simple_value > 0
    for _, value in written["learning_rate"]:
        assert 0 <= value.simple_value <= 1e-3 * (1 + 1e-6)  # float32
    for _, value in written["accuracy"]:
        assert 0 <= value.simple_value <= 1


def test_train_writes_training_and_evaluation_summaries(trained_model):
    assert_training_summaries(trained_model.model_dir, trained_model.max_steps)
    evaluated = summaries(trained_model.model_dir / "eval")
    assert {"accuracy", "loss", "recall/0", "precision/9"} <= set(evaluated)
    step, value = evaluated["accuracy"][-1]
    assert step == trained_model.max_steps and 0 < value.simple_value <= 1


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_every_kind_writes_the_same_training_summaries(comparison, kind):
    from support.training_harness import COMPARE_STEPS

    assert_training_summaries(comparison.work_dir / kind, COMPARE_STEPS)
