"""The custom model_fn (TRAIN / EVAL / PREDICT) and the Estimator built around it."""

from __future__ import annotations

import tensorflow as tf

from training.contract import (
    CLASSES_KEY,
    INPUT_KEY,
    NUM_CLASSES,
    PREDICT_OUTPUT_KEY,
    PROBABILITIES_KEY,
)
from training.hooks import TRAIN_ACCURACY_TENSOR
from training.model import CNN


def model_fn(features, labels, mode, params):
    """Estimator model_fn for the reference CNN.

    params:
        data_format: 'channels_last' or 'channels_first'.
        learning_rate: Adam's initial learning rate.
        decay_steps: when set, the learning rate follows a cosine decay to 0 over this many
            steps (a full run reaches a better optimum than a constant rate).
        training_hooks: extra SessionRunHooks for TRAIN (e.g. the progress display).
    """
    model = CNN(params.get("data_format", "channels_last"))
    image = features[INPUT_KEY] if isinstance(features, dict) else features
    if mode == tf.estimator.ModeKeys.PREDICT:
        logits = model(image, training=False)
        predictions = {
            CLASSES_KEY: tf.argmax(logits, axis=1),
            PROBABILITIES_KEY: tf.nn.softmax(logits, name="softmax_tensor"),
        }
        return tf.estimator.EstimatorSpec(
            mode,
            predictions=predictions,
            export_outputs={PREDICT_OUTPUT_KEY: tf.estimator.export.PredictOutput(predictions)},
        )

    training = mode == tf.estimator.ModeKeys.TRAIN
    logits = model(image, training=training)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    classes = tf.argmax(logits, axis=1, output_type=tf.int32)

    if training:
        global_step = tf.compat.v1.train.get_or_create_global_step()
        learning_rate = tf.constant(params["learning_rate"], tf.float32)
        if params.get("decay_steps"):
            learning_rate = tf.compat.v1.train.cosine_decay(
                params["learning_rate"], global_step, params["decay_steps"]
            )
        optimizer = tf.compat.v1.train.AdamOptimizer(learning_rate)
        # This batch's accuracy (with dropout on), named so LoggingTensorHook can find it. A
        # streaming metric would average over the whole run and trail the model by epochs.
        accuracy = tf.reduce_mean(tf.cast(tf.equal(labels, classes), tf.float32))
        tf.identity(accuracy, name=TRAIN_ACCURACY_TENSOR)
        tf.compat.v1.summary.scalar("train_accuracy", accuracy)
        tf.compat.v1.summary.scalar("learning_rate", learning_rate)
        train_op = optimizer.minimize(loss, global_step=global_step)
        return tf.estimator.EstimatorSpec(
            mode,
            loss=loss,
            train_op=train_op,
            training_hooks=list(params.get("training_hooks", ())),
        )

    return tf.estimator.EstimatorSpec(
        mode, loss=loss, eval_metric_ops=eval_metric_ops(labels, classes)
    )


def eval_metric_ops(labels, classes):
    """Accuracy plus per-class precision and recall ('precision/3', 'recall/3', ...)."""
    ops = {"accuracy": tf.compat.v1.metrics.accuracy(labels=labels, predictions=classes)}
    for k in range(NUM_CLASSES):
        is_true = tf.equal(labels, k)
        is_pred = tf.equal(classes, k)
        ops[f"precision/{k}"] = tf.compat.v1.metrics.precision(is_true, is_pred)
        ops[f"recall/{k}"] = tf.compat.v1.metrics.recall(is_true, is_pred)
    return ops


def make_estimator(
    model_dir: str,
    *,
    data_format: str = "channels_last",
    learning_rate: float = 1e-3,
    decay_steps: int | None = None,
    seed: int | None = None,
    save_checkpoints_steps: int = 1000,
    training_hooks=(),
) -> tf.estimator.Estimator:
    """The CNN Estimator writing checkpoints and TensorBoard summaries under model_dir."""
    config = tf.estimator.RunConfig(
        model_dir=model_dir,
        tf_random_seed=seed,
        save_checkpoints_steps=save_checkpoints_steps,
        save_summary_steps=100,
        keep_checkpoint_max=3,
        log_step_count_steps=100,
    )
    return tf.estimator.Estimator(
        model_fn=model_fn,
        config=config,
        params={
            "data_format": data_format,
            "learning_rate": learning_rate,
            "decay_steps": decay_steps,
            "training_hooks": tuple(training_hooks),
        },
    )
