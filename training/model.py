"""The reference CNN (TensorFlow's layers tutorial / official r1 mnist) and its model_fn.

Two forms of one architecture, built from the same layer definitions: `CNN`, the subclassed
model the custom `model_fn` calls, and `keras_cnn`, a compiled functional model for
`tf.keras.estimator.model_to_estimator` (which clones models and needs a functional one).
As in TensorFlow's official r1 mnist, the model and its model_fn live together.
"""

from __future__ import annotations

import tensorflow as tf

from artifact.contract import IMAGE_HEIGHT, IMAGE_WIDTH, INPUT_KEY, NUM_CLASSES
from training import heads
from training.determinism import kernel_initializer

DATA_FORMATS = ("channels_last", "channels_first")
# The layers with weights, by name: the scopes fine-tuning can pick (--fine-tune-scopes).
WEIGHT_LAYERS = ("conv1", "conv2", "dense1", "logits")


def _check_data_format(data_format: str) -> None:
    if data_format not in DATA_FORMATS:
        raise ValueError(f"data_format must be one of {DATA_FORMATS}, got {data_format!r}")


def cnn_layers(
    data_format: str = "channels_last", num_classes: int = NUM_CLASSES, seed: int | None = None
) -> dict:
    """The CNN's layers in call order, keyed by attribute name (conv1, pool1, ..., logits).

    seed: the run's; each layer's initial weights follow from it (None: random).
    """
    _check_data_format(data_format)
    layers = tf.keras.layers
    return {
        "conv1": layers.Conv2D(
            32, 5, padding="same", activation="relu", data_format=data_format, name="conv1",
            kernel_initializer=kernel_initializer(seed, "conv1"),
        ),
        "pool1": layers.MaxPooling2D(2, 2, padding="same", data_format=data_format),
        "conv2": layers.Conv2D(
            64, 5, padding="same", activation="relu", data_format=data_format, name="conv2",
            kernel_initializer=kernel_initializer(seed, "conv2"),
        ),
        "pool2": layers.MaxPooling2D(2, 2, padding="same", data_format=data_format),
        "flatten": layers.Flatten(),
        "dense1": layers.Dense(
            1024, activation="relu", name="dense1",
            kernel_initializer=kernel_initializer(seed, "dense1"),
        ),
        # Its mask follows the graph's seed (RunConfig's tf_random_seed).
        "dropout": layers.Dropout(0.4),
        "logits": layers.Dense(
            num_classes, name="logits", kernel_initializer=kernel_initializer(seed, "logits")
        ),
    }  # fmt: skip


def _image_shape(data_format: str) -> tuple[int, int, int]:
    if data_format == "channels_first":
        return (1, IMAGE_HEIGHT, IMAGE_WIDTH)
    return (IMAGE_HEIGHT, IMAGE_WIDTH, 1)


class CNN(tf.keras.Model):
    """Conv(32,5x5) -> pool -> Conv(64,5x5) -> pool -> Dense(1024) -> Dropout(0.4) -> logits.

    Args:
        data_format: 'channels_last' (NHWC, what CPUs run) or 'channels_first' (NCHW, faster
            on GPUs). Inputs are always [batch, 28, 28] grayscale; the layout is internal.
        seed: the run's seed, which the initial weights follow (None: random).
    """

    def __init__(
        self,
        data_format: str = "channels_last",
        num_classes: int = NUM_CLASSES,
        seed: int | None = None,
    ):
        super().__init__(name="cnn")
        layers = cnn_layers(data_format, num_classes, seed)
        self.data_format = data_format
        self.conv1 = layers["conv1"]
        self.pool1 = layers["pool1"]
        self.conv2 = layers["conv2"]
        self.pool2 = layers["pool2"]
        self.flatten = layers["flatten"]
        self.dense1 = layers["dense1"]
        self.dropout = layers["dropout"]
        self.logits = layers["logits"]

    def call(self, images, training=False):
        """images: float32 [batch, 28, 28] in [0, 1]. Returns logits [batch, num_classes]."""
        x = tf.reshape(images, [-1, *_image_shape(self.data_format)])
        x = self.pool1(self.conv1(x))
        x = self.pool2(self.conv2(x))
        x = self.dropout(self.dense1(self.flatten(x)), training=training)
        return self.logits(x)


def keras_cnn(
    data_format: str = "channels_last",
    num_classes: int = NUM_CLASSES,
    optimizer=None,
    seed: int | None = None,
) -> tf.keras.Model:
    """The same CNN as a functional Keras model taking the contract's `image` input.

    Compiled with sparse categorical cross-entropy on logits and `optimizer` (a legacy Keras
    optimizer: model_to_estimator does not take the Keras 2.11+ ones), so it is ready for
    `tf.keras.estimator.model_to_estimator`. Its output layer is named `logits`. seed: the
    run's, which the initial weights follow (model_to_estimator's clone keeps the layers'
    seeded initializers).
    """
    layers = cnn_layers(data_format, num_classes, seed)
    image = tf.keras.Input(shape=(IMAGE_HEIGHT, IMAGE_WIDTH), name=INPUT_KEY)
    x = tf.keras.layers.Reshape(_image_shape(data_format))(image)
    for layer in layers.values():
        x = layer(x)
    model = tf.keras.Model(image, x, name="cnn")
    model.compile(
        optimizer=optimizer or tf.keras.optimizers.legacy.Adam(),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


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
        seed: the run's seed, which the initial weights follow (None: random).
    Hooks are not params: training/estimator.py attaches the registry's hooks to every kind's
    spec, and `train` passes its progress display through the TrainSpec.
    """
    model = CNN(params.get("data_format", "channels_last"), seed=params.get("seed"))
    image = features[INPUT_KEY] if isinstance(features, dict) else features
    if mode == tf.estimator.ModeKeys.PREDICT:
        logits = model(image, training=False)
        return heads.predict_spec(
            tf.argmax(logits, axis=1), tf.nn.softmax(logits, name="softmax_tensor")
        )

    training = mode == tf.estimator.ModeKeys.TRAIN
    logits = model(image, training=training)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    checks = []
    if params.get("check_numerics", False):
        logits, loss = heads.check_numerics(logits, loss)
        checks = [loss]
    classes = tf.argmax(logits, axis=1, output_type=tf.int32)
    if not training:
        return tf.estimator.EstimatorSpec(
            mode, loss=loss, eval_metric_ops=heads.eval_metric_ops(labels, classes)
        )
    global_step = tf.compat.v1.train.get_or_create_global_step()
    learning_rate = heads.learning_rate_at(params, global_step)
    heads.training_summaries(labels, classes, learning_rate)
    # The checks gate the whole update (gradients, weights, global step): a step whose
    # logits or loss go bad fails before it changes anything.
    with tf.control_dependencies(checks):
        train_op = tf.compat.v1.train.AdamOptimizer(learning_rate).minimize(
            loss, global_step=global_step
        )
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
