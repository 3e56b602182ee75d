"""Hooks: the model-statistics hook in training, evaluation and prediction; the registry."""

from __future__ import annotations

import copy
import io
import json
import re

import numpy as np
import pytest
import tensorflow as tf
from support.helpers import assert_one_error_line
from support.training_harness import call_main

from artifact.contract import INPUT_KEY
from training import hooks
from training.estimator import make_estimator
from training.hooks import HOOKS, HookContext, ModelStatsHook, build_hooks, check_hook_names

MODES = tf.estimator.ModeKeys
CNN_PARAMETERS = 3_274_634
STATS_LINE = re.compile(
    r"\[(?P<mode>train|eval|predict)\] model stats: (?P<parameters>[\d,]+) parameters, "
    r"(?P<steps>\d+) steps, (?P<examples>[\d,]+) examples, [\d,]+ examples/s, "
    r"step time median [\d.]+ ms, p90 [\d.]+ ms"
)


def stats_lines(text: str) -> dict[str, dict]:
    found = {}
    for match in STATS_LINE.finditer(text):
        found[match["mode"]] = {
            "parameters": int(match["parameters"].replace(",", "")),
            "steps": int(match["steps"]),
            "examples": int(match["examples"].replace(",", "")),
        }
    return found


def numpy_input(n: int, batch_size: int, labels=True):
    rng = np.random.default_rng(0)
    images = rng.random((n, 28, 28), np.float32)
    targets = rng.integers(0, 10, n).astype(np.int32)

    def input_fn():
        ds = tf.data.Dataset.from_tensor_slices(
            ({INPUT_KEY: images}, targets) if labels else {INPUT_KEY: images}
        )
        return ds.batch(batch_size)

    return input_fn


def test_model_stats_reports_in_training_evaluation_and_prediction(tmp_path, capsys):
    estimator = make_estimator(str(tmp_path / "run"), seed=0, hooks=["model_stats"])
    estimator.train(numpy_input(24, 8), max_steps=3)
    estimator.evaluate(numpy_input(20, 8))
    predictions = list(estimator.predict(numpy_input(20, 8, labels=False)))
    assert len(predictions) == 20
    _, err = capsys.readouterr()
    stats = stats_lines(err)
    # Three batches each; evaluation and prediction end with a short batch (8 + 8 + 4).
    assert stats == {
        "train": {"parameters": CNN_PARAMETERS, "steps": 3, "examples": 24},
        "eval": {"parameters": CNN_PARAMETERS, "steps": 3, "examples": 20},
        "predict": {"parameters": CNN_PARAMETERS, "steps": 3, "examples": 20},
    }, err


def test_hooks_come_from_the_registry_in_each_mode_of_the_spec(tmp_path):
    estimator = make_estimator(str(tmp_path / "run"), hooks=["model_stats", "train_accuracy"])
    fields = {
        MODES.TRAIN: "training_hooks",
        MODES.EVAL: "evaluation_hooks",
        MODES.PREDICT: "prediction_hooks",
    }
    for mode, field in fields.items():
        with tf.Graph().as_default():
            tf.compat.v1.train.get_or_create_global_step()
            features = {INPUT_KEY: tf.zeros([2, 28, 28])}
            labels = None if mode == MODES.PREDICT else tf.constant([0, 1])
            spec = estimator.model_fn(features, labels, mode, estimator.config)
            attached = getattr(spec, field)
            kinds = [type(h) for h in attached]
            assert ModelStatsHook in kinds, (mode, attached)
            # train_accuracy reads a TRAIN-only tensor: attached in training alone.
            assert (tf.estimator.LoggingTensorHook in kinds) == (mode == MODES.TRAIN)
            (stats,) = [h for h in attached if isinstance(h, ModelStatsHook)]
            assert stats.mode == mode


def test_params_hold_hook_names_not_hooks(tmp_path):
    """The Estimator deep-copies params: they must be plain data (JSON, as params.json)."""
    estimator = make_estimator(str(tmp_path / "run"), hooks=["model_stats"])
    assert estimator.params["hooks"] == ["model_stats"]
    json.dumps(estimator.params)
    assert copy.deepcopy(estimator.params) == estimator.params


def test_unknown_hook_names_are_rejected_with_the_known_ones(tmp_path):
    with pytest.raises(ValueError) as excinfo:
        check_hook_names(["model_stats", "profiler"])
    assert str(excinfo.value) == ("unknown hook 'profiler'; known hooks: " + ", ".join(HOOKS))
    with pytest.raises(ValueError, match="unknown hook 'nope'"):
        make_estimator(str(tmp_path / "run"), hooks=["nope"])
    with pytest.raises(ValueError, match="unknown hook 'nope'"):
        build_hooks(["nope"], HookContext(MODES.TRAIN, {}))


def test_train_with_an_unknown_hook_exits_2_writing_nothing(tmp_path, small_data_dir, capsys):
    model_dir = tmp_path / "run"
    code = call_main("train", "--data-dir", small_data_dir, "--model-dir", model_dir,
                     "--hooks", "model_stats,profiler", "--max-steps", 2)  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 2
    assert_one_error_line(
        err, "--hooks: unknown hook 'profiler'; known hooks: model_stats, train_accuracy"
    )
    assert not model_dir.exists()


def test_model_stats_hook_summarizes_for_tensorboard(tmp_path):
    """In training it writes examples/sec and step time for TensorBoard every N steps."""
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        tf.compat.v1.get_variable("w", [3, 4])  # 12 parameters
        batch = tf.constant(5)
        train_op = tf.compat.v1.assign_add(step, 1)
        hook = ModelStatsHook(
            MODES.TRAIN, batch, every_n_steps=2, summary_dir=str(tmp_path), stream=io.StringIO()
        )
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            for _ in range(5):
                session.run(train_op)
    tf.compat.v1.summary.FileWriterCache.clear()
    written = {}
    for path in tmp_path.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                written.setdefault(value.tag, []).append(event.step)
    # Every 2 steps, and the rest at the end.
    assert written == {
        hooks.EXAMPLES_PER_SEC_TAG: [2, 4, 5],
        hooks.STEP_TIME_TAG: [2, 4, 5],
    }
    assert hook.parameter_count == 12
    assert (hook.steps, hook.examples) == (5, 25)
    assert hook.examples_per_sec > 0
    assert hook.stream.getvalue().startswith("[train] model stats: 12 parameters, 5 steps,")
