"""--check-numerics: a NaN stops training naming the tensor; the last checkpoint stays good."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from support.helpers import assert_one_error_line
from support.training_harness import call_main, checkpoint_step

from artifact.contract import INPUT_KEY
from training import data
from training.estimator import model_fn
from training.model import CNN

# The first poisoned step: steps 1-5 train normally, step 6 meets a NaN.
FIRST_NAN_STEP = 5
CHECKPOINT_STEPS = 2


def poison_input(monkeypatch):
    """NaN pixels from batch FIRST_NAN_STEP on (the linear model's logits turn NaN).

    (The CNN's max-pooling drops a NaN pixel, and the NaN gradient then wrecks the weights
    with finite logits, so the CNN is poisoned at its logits instead.)
    """
    original = data.train_input_fn

    def input_fn(split, batch_size, seed=None):
        def poison(index, example):
            features, labels = example
            image = features[INPUT_KEY]
            bad = tf.fill(tf.shape(image), np.float32("nan"))
            return {INPUT_KEY: tf.where(index >= FIRST_NAN_STEP, bad, image)}, labels

        return original(split, batch_size, seed).enumerate().map(poison)

    monkeypatch.setattr(data, "train_input_fn", input_fn)


def poison_cnn_logits(monkeypatch):
    """The CNN's training logits turn NaN from global step FIRST_NAN_STEP on."""
    original = CNN.call

    def call(self, images, training=False):
        logits = original(self, images, training)
        if not training:
            return logits
        step = tf.compat.v1.train.get_global_step()
        return logits * tf.where(step >= FIRST_NAN_STEP, np.float32("nan"), np.float32(1))

    monkeypatch.setattr(CNN, "call", call)


@pytest.mark.parametrize(
    "kind, check, message",
    [
        ("cnn", True, "--check-numerics stopped training: logits : Tensor had NaN values"),
        ("linear", True, "--check-numerics stopped training: logits : Tensor had NaN values"),
        (
            "cnn",
            False,
            "the loss became NaN and training stopped; the latest checkpoint (step 6) in",
        ),
    ],
    ids=["cnn", "linear", "cnn-without-check"],
)
def test_nan_stops_training_and_the_last_checkpoint_loads(
    tmp_path, small_data_dir, capsys, monkeypatch, kind, check, message
):
    (poison_input if kind == "linear" else poison_cnn_logits)(monkeypatch)
    model_dir, export_dir = tmp_path / "run", tmp_path / "models" / "m"
    argv = ["train", "--model", kind, "--data-dir", small_data_dir, "--model-dir", model_dir,
            "--export-dir", export_dir, "--max-steps", 20, "--batch-size", 50, "--deterministic",
            "--checkpoint-steps", CHECKPOINT_STEPS, "--eval-every-secs", 1, "--hooks", "none",
            "--labels", "fashion"] + (["--check-numerics"] if check else [])  # fmt: skip
    code = call_main(*argv)
    _, err = capsys.readouterr()
    assert code == 1
    error = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "Traceback" not in err, err
    assert message in error[0]
    if not check:
        # The Estimator's NanTensorHook stops after the update, and the bad step was saved.
        assert "already holds NaN/Inf weights; the newest finite one is" in error[0]
        assert error[0].rstrip().endswith("stops the step before its update")
        assert checkpoint_step(model_dir) == FIRST_NAN_STEP + 1
        return
    # The last checkpoint before the bad step: 5 good steps, one every CHECKPOINT_STEPS.
    assert f"the last checkpoint (step 4) in {model_dir} is kept" in error[0]
    assert checkpoint_step(model_dir) == 4
    assert not export_dir.exists()
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    for name in reader.get_variable_to_shape_map():
        value = reader.get_tensor(name)
        if np.issubdtype(np.asarray(value).dtype, np.floating):
            assert np.isfinite(value).all(), name

    # It loads: evaluate the model dir and export it.
    monkeypatch.undo()
    output = tmp_path / "evaluation.json"
    assert call_main("evaluate", model_dir, "--data-dir", small_data_dir, "--output", output) == 0
    assert call_main("export", "--model-dir", model_dir, "--export-dir", export_dir,
                     "--data-dir", small_data_dir) == 0  # fmt: skip
    out, _ = capsys.readouterr()
    assert f"Exported step 4 of {model_dir}" in out


@pytest.mark.parametrize("value, problem", [(np.nan, "NaN"), (np.inf, "Inf")], ids=["nan", "inf"])
def test_cnn_checks_stop_the_step_before_the_update(value, problem):
    """In the CNN's model_fn the checks sit on the path to the update: a step whose logits go
    bad fails, naming them, and changes no weight and not the global step."""
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(0)
        images = tf.constant(np.random.default_rng(0).random((4, 28, 28), np.float32))
        labels = tf.constant([1, 2, 3, 4], tf.int32)
        spec = model_fn({INPUT_KEY: images}, labels, tf.estimator.ModeKeys.TRAIN,
                        {"learning_rate": 1e-3, "check_numerics": True})  # fmt: skip
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        bias = variables["cnn/logits/bias"]
        poison = bias.assign(tf.fill([10], np.float32(value)))
        watched = [variables["cnn/conv1/kernel"], variables["cnn/dense1/kernel"]]
        step = tf.compat.v1.train.get_global_step()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(spec.train_op)
            session.run(poison)
            before = session.run(watched)
            with pytest.raises(tf.errors.InvalidArgumentError) as excinfo:
                session.run(spec.train_op)
            after, global_step = session.run(watched), session.run(step)
    assert f"logits : Tensor had {problem} values" in excinfo.value.message
    assert global_step == 1
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)


def test_numerics_checks_are_off_by_default():
    with tf.Graph().as_default() as graph:
        image = tf.zeros([2, 28, 28])
        model_fn({INPUT_KEY: image}, tf.constant([0, 1]), tf.estimator.ModeKeys.TRAIN,
                 {"learning_rate": 1e-3})  # fmt: skip
        assert not [op for op in graph.get_operations() if op.type == "CheckNumerics"]


def test_usage_error_line_helper_is_strict():
    # The shared helper must reject output with more than one line (it guards every test here).
    with pytest.raises(AssertionError):
        assert_one_error_line("error: one\nerror: two", "one")
