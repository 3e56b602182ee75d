"""The Estimator of every model kind.

`make_estimator` builds the Estimator for any kind in `MODEL_KINDS` (the CNN's model_fn from
training/model.py, or a baseline from training/baselines.py) around one wrapping model_fn
that gives every kind the same extras: registry hooks in all three modes, TensorBoard input
images and fine-tuning's Scaffold. Every kind exports the one contract (training/heads.py).
"""

from __future__ import annotations

import tensorflow as tf

from artifact.contract import IMAGE_SHAPE, INPUT_KEY
from training.baselines import baseline_model_fn
from training.finetune import fine_tune_scaffold
from training.hooks import DEFAULT_HOOKS, HookContext, build_hooks, check_hook_names
from training.model import model_fn

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
    session_config: tf.compat.v1.ConfigProto | None = None,
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
        session_config: the sessions' config (training/determinism.py's for a deterministic
            run); None: the Estimator's default.
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
        session_config=session_config,
    )
    if kind == "cnn":

        def inner(features, labels, mode, params, config):
            return model_fn(features, labels, mode, params)

    else:
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
        # Only the shapes are read; a seed keeps the initializers' random ops legal under op
        # determinism (--deterministic), which refuses an unseeded one.
        tf.compat.v1.set_random_seed(0)
        image = tf.compat.v1.placeholder(tf.float32, [None, *IMAGE_SHAPE], INPUT_KEY)
        estimator.model_fn(
            {INPUT_KEY: image}, None, tf.estimator.ModeKeys.PREDICT, estimator.config
        )
        return {v.op.name: v.shape.as_list() for v in tf.compat.v1.trainable_variables()}
