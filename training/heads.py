"""What every model kind's model_fn shares: the contract's PREDICT outputs, the evaluation
metrics, the learning rate, the training summaries and the NaN/Inf checks.

The custom CNN's model_fn (training/model.py) and the baselines' wrapper
(training/baselines.py) both build their EstimatorSpecs from these, so every kind exports the
same signature and reports the same metrics.
"""

from __future__ import annotations

import tensorflow as tf

from artifact.contract import CLASSES_KEY, NUM_CLASSES, PREDICT_OUTPUT_KEY, PROBABILITIES_KEY

# The training batch's accuracy tensor, logged by the `train_accuracy` hook (training/hooks.py).
TRAIN_ACCURACY_TENSOR = "train_accuracy"
MODES = tf.estimator.ModeKeys


def learning_rate_at(params: dict, global_step):
    """The learning rate at a step: constant, or cosine-decayed to 0 over decay_steps."""
    if params.get("decay_steps"):
        return tf.compat.v1.train.cosine_decay(
            params["learning_rate"], global_step, params["decay_steps"]
        )
    return tf.constant(params["learning_rate"], tf.float32)


def predict_spec(classes, probabilities, **spec_fields) -> tf.estimator.EstimatorSpec:
    """The PREDICT spec of the contract: `classes` int64 [n] and `probabilities` float32
    [n, 10], exported as the `classify` PredictOutput (and so as `serving_default`)."""
    predictions = {CLASSES_KEY: tf.cast(classes, tf.int64), PROBABILITIES_KEY: probabilities}
    return tf.estimator.EstimatorSpec(
        MODES.PREDICT,
        predictions=predictions,
        export_outputs={PREDICT_OUTPUT_KEY: tf.estimator.export.PredictOutput(predictions)},
        **spec_fields,
    )


def eval_metric_ops(labels, classes, num_classes: int = NUM_CLASSES) -> dict:
    """Accuracy plus per-class precision and recall ('precision/3', 'recall/3', ...)."""
    ops = {"accuracy": tf.compat.v1.metrics.accuracy(labels=labels, predictions=classes)}
    for k in range(num_classes):
        is_true = tf.equal(labels, k)
        is_pred = tf.equal(classes, k)
        ops[f"precision/{k}"] = tf.compat.v1.metrics.precision(is_true, is_pred)
        ops[f"recall/{k}"] = tf.compat.v1.metrics.recall(is_true, is_pred)
    return ops


def training_summaries(labels, classes, learning_rate) -> None:
    """The training batch's accuracy (named for LoggingTensorHook) and the learning rate.

    The batch's own accuracy, with dropout on: a streaming metric would average over the whole
    run and trail the model by epochs. Tagged like the evaluation metric, so TensorBoard draws
    training and test accuracy on one chart.
    """
    accuracy = tf.reduce_mean(tf.cast(tf.equal(labels, classes), tf.float32))
    tf.identity(accuracy, name=TRAIN_ACCURACY_TENSOR)
    tf.compat.v1.summary.scalar("accuracy", accuracy)
    tf.compat.v1.summary.scalar("learning_rate", learning_rate)


def check_numerics(logits, loss):
    """The logits and the loss behind NaN/Inf checks that fail the step naming the tensor.

    The logits are checked first: a NaN there makes the loss NaN too, and the message should
    name the source every time (two independent checks race).

    Returns:
        (checked logits, checked loss); a train op must depend on the checked loss.
    """
    checked_logits = tf.debugging.check_numerics(logits, "logits")
    with tf.control_dependencies([checked_logits]):
        checked_loss = tf.debugging.check_numerics(loss, "loss")
    return checked_logits, checked_loss
