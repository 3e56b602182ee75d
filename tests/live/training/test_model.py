"""model_fn and the CNN, in the style of TensorFlow's official r1 mnist_test.py.

Each mode is built in its own tf.Graph on a tiny random batch and run for a step or two.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from artifact.contract import (
    CLASSES_KEY,
    INPUT_KEY,
    NUM_CLASSES,
    PREDICT_OUTPUT_KEY,
    PROBABILITIES_KEY,
    SIGNATURE_NAME,
)
from training.estimator import make_estimator
from training.heads import eval_metric_ops
from training.hooks import TRAIN_ACCURACY_TENSOR
from training.model import CNN, DATA_FORMATS, model_fn

BATCH_SIZE = 8
MODES = tf.estimator.ModeKeys


def dummy_input_fn(batch_size: int = BATCH_SIZE, seed: int = 0):
    """Graph tensors: ({'image': float32 [n, 28, 28]}, int32 labels [n])."""
    image = tf.random.uniform([batch_size, 28, 28], seed=seed)
    labels = tf.random.uniform([batch_size], maxval=NUM_CLASSES, dtype=tf.int32, seed=seed)
    return {INPUT_KEY: image}, labels


def params(**overrides):
    return {"data_format": "channels_last", "learning_rate": 1e-3, **overrides}


def build(mode, **param_overrides):
    """model_fn's EstimatorSpec for one mode on a fixed (constant) tiny batch."""
    tf.compat.v1.set_random_seed(0)
    rng = np.random.default_rng(0)
    features = {INPUT_KEY: tf.constant(rng.random((BATCH_SIZE, 28, 28), np.float32))}
    labels = tf.constant(rng.integers(0, NUM_CLASSES, BATCH_SIZE), tf.int32)
    if mode == MODES.PREDICT:
        labels = None
    return model_fn(features, labels, mode, params(**param_overrides)), labels


def initialized_session():
    session = tf.compat.v1.Session()
    session.run(
        [tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()]
    )
    return session


def test_model_fn_train_mode():
    with tf.Graph().as_default() as graph:
        spec, _ = build(MODES.TRAIN)
        assert spec.mode == MODES.TRAIN
        assert spec.train_op is not None
        assert spec.loss.shape == () and spec.loss.dtype == tf.float32
        assert spec.predictions == {} and spec.eval_metric_ops == {}
        accuracy = graph.get_tensor_by_name(TRAIN_ACCURACY_TENSOR + ":0")  # LoggingTensorHook's
        global_step = tf.compat.v1.train.get_global_step()
        assert global_step is not None
        with initialized_session() as session:
            first = session.run(spec.loss)
            losses = [session.run([spec.train_op, spec.loss])[1] for _ in range(10)]
            assert session.run(global_step) == 10
            assert 0.0 <= session.run(accuracy) <= 1.0
    assert np.isfinite(first) and np.all(np.isfinite(losses))
    # Ten Adam steps on one fixed batch of 8 must fit it better.
    assert losses[-1] < first


def test_model_fn_train_mode_decays_learning_rate_to_zero():
    with tf.Graph().as_default():
        spec, _ = build(MODES.TRAIN, decay_steps=2)
        weights = [v for v in tf.compat.v1.trainable_variables() if "logits" in v.name]
        assert weights
        with initialized_session() as session:
            session.run(spec.train_op)
            before = session.run(weights)
            session.run(spec.train_op)
            after_step_2 = session.run(weights)
            session.run(spec.train_op)  # global step 2: the cosine decay is at 0
            after_step_3 = session.run(weights)
    assert any(not np.array_equal(a, b) for a, b in zip(before, after_step_2, strict=True))
    for a, b in zip(after_step_2, after_step_3, strict=True):
        np.testing.assert_array_equal(a, b)


def test_model_fn_eval_mode():
    with tf.Graph().as_default():
        spec, labels = build(MODES.EVAL)
        assert spec.mode == MODES.EVAL
        assert spec.train_op is None
        assert spec.loss.shape == () and spec.loss.dtype == tf.float32
        metrics = spec.eval_metric_ops
        expected = {"accuracy"} | {f"{m}/{k}" for m in ("precision", "recall") for k in range(10)}
        assert set(metrics) == expected
        for name, (value, update) in metrics.items():
            assert value.shape == () and value.dtype == tf.float32, name
            assert update is not None, name
        with initialized_session() as session:
            session.run([update for _, update in metrics.values()])
            values, loss, y = session.run(
                ({k: v for k, (v, _) in metrics.items()}, spec.loss, labels)
            )
    assert np.isfinite(loss) and loss > 0
    assert 0.0 <= values["accuracy"] <= 1.0
    # The per-class recalls are consistent with the accuracy: sum of hits / examples.
    support = np.bincount(y, minlength=NUM_CLASSES)
    hits = sum(values[f"recall/{k}"] * support[k] for k in range(NUM_CLASSES))
    assert hits / len(y) == pytest.approx(values["accuracy"], abs=1e-6)
    for k in range(NUM_CLASSES):
        assert 0.0 <= values[f"precision/{k}"] <= 1.0
        assert 0.0 <= values[f"recall/{k}"] <= 1.0


def test_eval_metric_ops_match_numpy():
    y = np.array([0, 0, 1, 1, 1, 2, 3, 3, 9, 9, 9, 9], np.int32)
    c = np.array([0, 1, 1, 1, 2, 2, 3, 0, 9, 9, 4, 9], np.int32)
    with tf.Graph().as_default():
        ops = eval_metric_ops(tf.constant(y), tf.constant(c))
        with initialized_session() as session:
            session.run([update for _, update in ops.values()])
            values = session.run({k: v for k, (v, _) in ops.items()})
    assert values["accuracy"] == pytest.approx(np.mean(y == c))
    for k in range(NUM_CLASSES):
        hits = np.sum((y == k) & (c == k))
        predicted, actual = np.sum(c == k), np.sum(y == k)
        assert values[f"precision/{k}"] == pytest.approx(hits / predicted if predicted else 0.0)
        assert values[f"recall/{k}"] == pytest.approx(hits / actual if actual else 0.0)
    # Spot-check the fixture is not degenerate: precision and recall differ for some class.
    assert (values["precision/9"], values["recall/9"]) == (1.0, 0.75)


def test_model_fn_predict_mode():
    with tf.Graph().as_default():
        spec, _ = build(MODES.PREDICT)
        assert spec.mode == MODES.PREDICT
        assert spec.loss is None and spec.train_op is None
        predictions = spec.predictions
        assert set(predictions) == {CLASSES_KEY, PROBABILITIES_KEY}
        classes, probabilities = predictions[CLASSES_KEY], predictions[PROBABILITIES_KEY]
        assert classes.dtype == tf.int64 and classes.shape.as_list() == [BATCH_SIZE]
        assert probabilities.dtype == tf.float32
        assert probabilities.shape.as_list() == [BATCH_SIZE, NUM_CLASSES]

        # EstimatorSpec aliases the single export output as the default serving signature.
        assert set(spec.export_outputs) == {PREDICT_OUTPUT_KEY, SIGNATURE_NAME}
        for output in spec.export_outputs.values():
            assert isinstance(output, tf.estimator.export.PredictOutput)
            assert output.outputs == {CLASSES_KEY: classes, PROBABILITIES_KEY: probabilities}
        with initialized_session() as session:
            c, p = session.run([classes, probabilities])
    assert c.shape == (BATCH_SIZE,) and p.shape == (BATCH_SIZE, NUM_CLASSES)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-5)
    assert (p >= 0).all()
    np.testing.assert_array_equal(np.argmax(p, axis=1), c)


def test_model_fn_accepts_bare_tensor_features():
    with tf.Graph().as_default():
        image = tf.zeros([3, 28, 28])
        spec = model_fn(image, None, MODES.PREDICT, params())
        assert spec.predictions[PROBABILITIES_KEY].shape.as_list() == [3, NUM_CLASSES]


def test_model_fn_rejects_invalid_data_format():
    with tf.Graph().as_default(), pytest.raises(ValueError, match="data_format"):
        build(MODES.TRAIN, data_format="NHWC")


@pytest.mark.parametrize("data_format", DATA_FORMATS)
def test_cnn_honours_data_format(data_format):
    with tf.Graph().as_default():
        model = CNN(data_format)
        logits = model(tf.random.uniform([5, 28, 28], seed=1), training=False)
        assert logits.shape.as_list() == [5, NUM_CLASSES]
        assert model.data_format == data_format
        for layer in (model.conv1, model.pool1, model.conv2, model.pool2):
            assert layer.data_format == data_format, layer.name
        # The first conv's output layout shows where the channels went.
        conv1_out = model.conv1(tf.zeros([2, 28, 28, 1] if data_format == "channels_last"
                                         else [2, 1, 28, 28]))  # fmt: skip
        expected = [2, 28, 28, 32] if data_format == "channels_last" else [2, 32, 28, 28]
        assert conv1_out.shape.as_list() == expected
        with initialized_session() as session:
            values = session.run(logits)
    assert values.shape == (5, NUM_CLASSES) and np.isfinite(values).all()


def test_cnn_dropout_only_in_training():
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(0)
        model = CNN()
        images = tf.constant(np.random.default_rng(2).random((4, 28, 28), np.float32))
        inference = model(images, training=False)
        training = model(images, training=True)
        with initialized_session() as session:
            a, b = session.run(inference), session.run(inference)
            c = session.run(training)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


@pytest.mark.parametrize("data_format", ["NHWC", "channels_middle", ""])
def test_cnn_rejects_invalid_data_format(data_format):
    with pytest.raises(ValueError, match="data_format must be one of"):
        CNN(data_format)


def test_estimator_train_evaluate_predict(tmp_path):
    """Like mnist_test.test_mnist: a couple of steps through the real Estimator."""
    estimator = make_estimator(str(tmp_path / "model"), seed=0, save_checkpoints_steps=100)
    estimator.train(input_fn=dummy_input_fn, steps=2)
    assert estimator.get_variable_value("global_step") == 2

    results = estimator.evaluate(input_fn=dummy_input_fn, steps=1)
    assert results["global_step"] == 2
    assert 0.0 <= results["accuracy"] <= 1.0
    assert np.isfinite(results["loss"])
    assert {f"precision/{k}" for k in range(10)} <= set(results)

    # A one-element dataset ends the prediction loop (bare tensors would never run out).
    predictions = list(
        estimator.predict(
            input_fn=lambda: tf.data.Dataset.from_tensors(dummy_input_fn()[0]),
            yield_single_examples=False,
        )
    )
    assert len(predictions) == 1
    (batch,) = predictions
    assert batch[CLASSES_KEY].shape == (BATCH_SIZE,) and batch[CLASSES_KEY].dtype == np.int64
    assert batch[PROBABILITIES_KEY].shape == (BATCH_SIZE, NUM_CLASSES)
    np.testing.assert_allclose(batch[PROBABILITIES_KEY].sum(axis=1), 1.0, atol=1e-5)
