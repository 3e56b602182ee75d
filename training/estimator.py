"""The custom model_fn (TRAIN / EVAL / PREDICT) and the Estimator of every model kind.

`model_fn` is the reference CNN's. `make_estimator` builds the Estimator for any kind in
`MODEL_KINDS` (the CNN, or a baseline from training/baselines.py) around one wrapping model_fn
that gives every kind the same extras: registry hooks in all three modes, TensorBoard input
images, fine-tuning's Scaffold, and the one export contract.
"""

from __future__ import annotations

import tensorflow as tf

from training.contract import (
    CLASSES_KEY,
    INPUT_KEY,
    NUM_CLASSES,
    PREDICT_OUTPUT_KEY,
    PROBABILITIES_KEY,
)
from training.hooks import (
    DEFAULT_HOOKS,
    TRAIN_ACCURACY_TENSOR,
    HookContext,
    build_hooks,
    check_hook_names,
)
from training.model import CNN

MODEL_KINDS = ("cnn", "linear", "dnn", "keras")
DEFAULT_HIDDEN_UNITS = (256, 128)
# Fashion-MNIST's training pixels in [0, 1]; `train` measures the data it is given instead.
FASHION_MNIST_PIXEL_MEAN = 0.2860
FASHION_MNIST_PIXEL_STD = 0.3530
# How many training inputs the TensorBoard image summary shows.
SUMMARY_IMAGES = 4

DEFAULT_PARAMS = {
    "model": "cnn",
    "data_format": "channels_last",
    "learning_rate": 1e-3,
    "decay_steps": None,
    "hidden_units": list(DEFAULT_HIDDEN_UNITS),
    "pixel_mean": FASHION_MNIST_PIXEL_MEAN,
    "pixel_std": FASHION_MNIST_PIXEL_STD,
    "hooks": list(DEFAULT_HOOKS),
    "check_numerics": False,
    "fine_tune_from": None,
    "fine_tune_scopes": [],
}


def learning_rate_at(params, global_step):
    """The learning rate at a step: constant, or cosine-decayed to 0 over decay_steps."""
    if params.get("decay_steps"):
        return tf.compat.v1.train.cosine_decay(
            params["learning_rate"], global_step, params["decay_steps"]
        )
    return tf.constant(params["learning_rate"], tf.float32)


def model_fn(features, labels, mode, params):
    """Estimator model_fn for the reference CNN.

    params:
        data_format: 'channels_last' or 'channels_first'.
        learning_rate: Adam's initial learning rate.
        decay_steps: when set, the learning rate follows a cosine decay to 0 over this many
            steps (a full run reaches a better optimum than a constant rate).
        check_numerics: fail the step with the tensor's name when the logits or the loss hold
            a NaN or Inf; the checks sit on the path to the update, so a bad step changes
            nothing.
        training_hooks: extra SessionRunHooks for TRAIN (e.g. the progress display).
    """
    model = CNN(params.get("data_format", "channels_last"))
    image = features[INPUT_KEY] if isinstance(features, dict) else features
    check_numerics = params.get("check_numerics", False)
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
    if check_numerics:
        logits = tf.debugging.check_numerics(logits, "logits")
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    if check_numerics:
        loss = tf.debugging.check_numerics(loss, "loss")
    classes = tf.argmax(logits, axis=1, output_type=tf.int32)

    if training:
        global_step = tf.compat.v1.train.get_or_create_global_step()
        learning_rate = learning_rate_at(params, global_step)
        optimizer = tf.compat.v1.train.AdamOptimizer(learning_rate)
        # This batch's accuracy (with dropout on), named so LoggingTensorHook can find it. A
        # streaming metric would average over the whole run and trail the model by epochs.
        accuracy = tf.reduce_mean(tf.cast(tf.equal(labels, classes), tf.float32))
        tf.identity(accuracy, name=TRAIN_ACCURACY_TENSOR)
        # Tagged like the eval metric: TensorBoard draws training and test accuracy on one chart.
        tf.compat.v1.summary.scalar("accuracy", accuracy)
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


def _finish_spec(spec, features, mode, params, config):
    """Add what every kind shares: registry hooks, input images, fine-tuning's Scaffold."""
    context = HookContext(mode, features, config.model_dir if config else None)
    hooks = build_hooks(params.get("hooks", ()), context)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return spec._replace(prediction_hooks=[*spec.prediction_hooks, *hooks])
    if mode == tf.estimator.ModeKeys.EVAL:
        return spec._replace(evaluation_hooks=[*spec.evaluation_hooks, *hooks])
    image = features[INPUT_KEY] if isinstance(features, dict) else features
    tf.compat.v1.summary.image(
        "inputs", tf.expand_dims(image[:SUMMARY_IMAGES], -1), max_outputs=SUMMARY_IMAGES
    )
    scaffold = spec.scaffold
    if params.get("fine_tune_from"):
        from training.finetune import fine_tune_scaffold

        scaffold = fine_tune_scaffold(
            params["fine_tune_from"], params["fine_tune_scopes"], scaffold
        )
    return spec._replace(training_hooks=[*spec.training_hooks, *hooks], scaffold=scaffold)


def make_estimator(
    model_dir: str,
    params: dict | None = None,
    *,
    seed: int | None = None,
    save_checkpoints_steps: int = 1000,
    warm_start_from: tf.estimator.WarmStartSettings | str | None = None,
    train_distribute: tf.distribute.Strategy | None = None,
    max_worker_delay_secs: int | None = None,
    **param_overrides,
) -> tf.estimator.Estimator:
    """The Estimator of one model kind, writing checkpoints and summaries under model_dir.

    Args:
        model_dir: checkpoints, TensorBoard events.
        params: what the run is (DEFAULT_PARAMS lists the keys; params.json records them):
            model (a MODEL_KINDS name), data_format, learning_rate, decay_steps, hidden_units
            (dnn), pixel_mean and pixel_std (the linear and dnn feature column's normalizer),
            hooks (names from training.hooks.HOOKS), check_numerics, fine_tune_from and
            fine_tune_scopes (restore only those scopes from a checkpoint at the first step).
        seed: graph-level random seed.
        save_checkpoints_steps: checkpoint interval.
        warm_start_from: tf.estimator.WarmStartSettings (or a checkpoint) to initialise from.
        train_distribute: a tf.distribute strategy for training (MirroredStrategy).
        max_worker_delay_secs: in a TF_CONFIG cluster, the longest a worker waits before it
            starts training (TensorFlow waits (index + 1) x 5 s by default).
        param_overrides: single params, e.g. data_format="channels_first".
    Raises:
        ValueError: an unknown model kind or hook name.
    """
    params = {**DEFAULT_PARAMS, **(params or {}), **param_overrides}
    kind = params["model"]
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown model kind {kind!r}; known kinds: {', '.join(MODEL_KINDS)}")
    check_hook_names(params["hooks"])  # fail here, not in the middle of a graph build
    config = tf.estimator.RunConfig(
        model_dir=model_dir,
        tf_random_seed=seed,
        save_checkpoints_steps=save_checkpoints_steps,
        save_summary_steps=100,
        keep_checkpoint_max=3,
        log_step_count_steps=100,
        train_distribute=train_distribute,
        experimental_max_worker_delay_secs=max_worker_delay_secs,
    )
    if kind == "cnn":

        def inner(features, labels, mode, params, config):
            return model_fn(features, labels, mode, params)

    else:
        from training.baselines import baseline_model_fn

        inner = baseline_model_fn(kind, params, config)

    def estimator_model_fn(features, labels, mode, params, config):
        spec = inner(features, labels, mode, params, config)
        return _finish_spec(spec, features, mode, params, config)

    return tf.estimator.Estimator(
        model_fn=estimator_model_fn,
        config=config,
        params=params,
        warm_start_from=warm_start_from,
    )


def trainable_variable_shapes(estimator: tf.estimator.Estimator) -> dict[str, list[int]]:
    """Name -> shape of the trainable variables the estimator's model builds.

    Built in a throwaway graph, so options naming variables (fine-tuning scopes, warm-start
    patterns) are checked before a run writes anything.
    """
    with tf.Graph().as_default():
        image = tf.compat.v1.placeholder(tf.float32, [None, 28, 28], INPUT_KEY)
        estimator.model_fn(
            {INPUT_KEY: image}, None, tf.estimator.ModeKeys.PREDICT, estimator.config
        )
        return {v.op.name: v.shape.as_list() for v in tf.compat.v1.trainable_variables()}
