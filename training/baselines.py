"""Baselines on the same data and the same export contract as the custom CNN Estimator.

- `linear`: `tf.estimator.LinearClassifier` and `dnn`: `tf.estimator.DNNClassifier`, both fed
  through `tf.feature_column.numeric_column('image', shape=(28, 28), normalizer_fn=...)` that
  standardizes the pixels with the training set's mean and deviation (inside the graph, so
  serving gets it too).
- `keras`: the same CNN compiled as a functional Keras model and turned into an Estimator by
  `tf.keras.estimator.model_to_estimator`.

Pre-made heads and Keras Estimators name and type their outputs their own way (string
`classes` [n, 1], `class_ids`, `logits`, a `predict` signature and no `serving_default` for a
float input). Each baseline's model_fn is therefore wrapped: the pre-made (or Keras) model_fn
builds the model, loss and train op, and the wrapper returns the contract's PREDICT outputs
(`classes` int64 [n], `probabilities` float32 [n, 10]) and export signature, plus the CNN's
evaluation metrics, training summaries and numerics checks.
"""

from __future__ import annotations

import shutil
import tempfile

import tensorflow as tf

from artifact.contract import IMAGE_SHAPE, INPUT_KEY, NUM_CLASSES
from training import heads
from training.model import keras_cnn

BASELINE_KINDS = ("linear", "dnn", "keras")
# The logits' prediction key: the pre-made heads' own, and the Keras model's output layer
# (training.model.keras_cnn names it so).
LOGITS_KEY = "logits"
MODES = tf.estimator.ModeKeys


def image_feature_column(pixel_mean: float, pixel_std: float):
    """numeric_column('image', shape=(28, 28)) standardizing pixels in [0, 1] to mean 0, sd 1."""
    mean, std = float(pixel_mean), float(pixel_std)
    return tf.feature_column.numeric_column(
        INPUT_KEY, shape=IMAGE_SHAPE, normalizer_fn=lambda x: (x - mean) / std
    )


def keras_optimizer(params: dict):
    """Adam with the run's learning rate (cosine-decayed when decay_steps is set).

    A legacy Keras optimizer: the pre-made Estimators and model_to_estimator drive it with
    the global step as its `iterations`, which the Keras 2.11+ optimizers do not allow.
    """
    learning_rate = params["learning_rate"]
    if params.get("decay_steps"):
        learning_rate = tf.keras.optimizers.schedules.CosineDecay(
            learning_rate, params["decay_steps"]
        )
    return tf.keras.optimizers.legacy.Adam(learning_rate=learning_rate)


def premade_estimator(kind: str, params: dict, config: tf.estimator.RunConfig):
    """The pre-made LinearClassifier or DNNClassifier for the run's params."""
    column = image_feature_column(params["pixel_mean"], params["pixel_std"])

    def optimizer():
        # Called in each graph the Estimator builds: an optimizer belongs to one graph.
        return keras_optimizer(params)

    if kind == "linear":
        return tf.estimator.LinearClassifier(
            feature_columns=[column], n_classes=NUM_CLASSES, optimizer=optimizer, config=config
        )
    if kind == "dnn":
        return tf.estimator.DNNClassifier(
            hidden_units=list(params["hidden_units"]),
            feature_columns=[column],
            n_classes=NUM_CLASSES,
            optimizer=optimizer,
            config=config,
        )
    raise ValueError(f"not a pre-made kind: {kind!r}")


def keras_estimator(
    params: dict,
    model: tf.keras.Model | None = None,
    config: tf.estimator.RunConfig | None = None,
):
    """The Keras CNN (or another compiled Keras model) through
    tf.keras.estimator.model_to_estimator.

    model_to_estimator saves the Keras model's initial weights into its model dir and warm-
    starts from them; only its model_fn is used here (the weights start from the run's seed
    like every other kind's), so it gets a scratch dir, removed at once, rather than writing
    into the shared model dir (which every task of a distributed run would race to do).
    `saver` checkpoints keep the variables' names (keras/conv1/kernel, ...) for warm starts
    and fine-tuning scopes. config: the run's, whose seed and session config the scratch
    model's graph and sessions take (a deterministic run refuses an unseeded graph).
    """
    if model is None:
        model = keras_cnn(
            params["data_format"], optimizer=keras_optimizer(params), seed=params.get("seed")
        )
    scratch = tempfile.mkdtemp(prefix="model-to-estimator-")
    scratch_config = tf.estimator.RunConfig(
        model_dir=scratch,
        tf_random_seed=config.tf_random_seed if config else None,
        session_config=config.session_config if config else None,
    )
    try:
        return tf.keras.estimator.model_to_estimator(
            keras_model=model, config=scratch_config, checkpoint_format="saver"
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def baseline_model_fn(kind: str, params: dict, config: tf.estimator.RunConfig):
    """A model_fn(features, labels, mode, params, config) for a baseline, in contract form."""
    if kind == "keras":
        wrapped = keras_estimator(params, config=config)
    else:
        wrapped = premade_estimator(kind, params, config)
    inner = wrapped.model_fn

    def contract_model_fn(features, labels, mode, params, config):
        if kind == "keras":
            # Keras names its loss ops "loss", which pushed the Estimator's loss summary to
            # "loss_1"; its own scope keeps "loss" free and names the variables keras/conv1/...
            # like the CNN's cnn/conv1/... (the pre-made ones have linear/ and dnn/).
            with tf.name_scope("keras"):
                spec = inner(features, labels, mode, config)
        else:
            spec = inner(features, labels, mode, config)
        logits = spec.predictions[LOGITS_KEY]
        if kind == "keras":
            probabilities = tf.nn.softmax(logits, name="softmax_tensor")
        else:
            probabilities = spec.predictions["probabilities"]
        return to_contract(spec, labels, mode, params, logits, probabilities)

    return contract_model_fn


def to_contract(spec, labels, mode, params, logits, probabilities, num_classes=NUM_CLASSES):
    """Rebuild a baseline's EstimatorSpec with the contract's outputs and the CNN's extras.

    PREDICT: the contract's outputs and signature (heads.predict_spec), as the CNN's model_fn.
    EVAL: the CNN's metrics (accuracy, per-class precision and recall).
    TRAIN: batch accuracy and learning rate summaries, the `train_accuracy` tensor.
    check_numerics: the checks on logits and loss run with every step and fail it, naming the
    tensor; unlike the CNN's they cannot sit before the pre-made update, but a failed step is
    never checkpointed, so the last checkpoint stays good.
    """
    classes = tf.argmax(probabilities, axis=1)
    if mode == MODES.PREDICT:
        return heads.predict_spec(
            classes, probabilities, prediction_hooks=spec.prediction_hooks, scaffold=spec.scaffold
        )
    loss, checks = spec.loss, []
    if params.get("check_numerics"):
        checks = list(heads.check_numerics(logits, spec.loss))
        loss = checks[1]
    classes = tf.cast(classes, tf.int32)
    if mode == MODES.EVAL:
        return tf.estimator.EstimatorSpec(
            mode,
            loss=loss,
            eval_metric_ops=heads.eval_metric_ops(labels, classes, num_classes),
            evaluation_hooks=spec.evaluation_hooks,
            scaffold=spec.scaffold,
        )
    global_step = tf.compat.v1.train.get_or_create_global_step()
    heads.training_summaries(labels, classes, heads.learning_rate_at(params, global_step))
    return tf.estimator.EstimatorSpec(
        mode,
        loss=loss,
        train_op=tf.group(spec.train_op, *checks) if checks else spec.train_op,
        training_hooks=spec.training_hooks,
        training_chief_hooks=spec.training_chief_hooks,
        scaffold=spec.scaffold,
    )
