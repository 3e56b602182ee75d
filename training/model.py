"""The reference CNN (TensorFlow's layers tutorial / official r1 mnist) as a Keras Model."""

from __future__ import annotations

import tensorflow as tf

from training.contract import IMAGE_HEIGHT, IMAGE_WIDTH, NUM_CLASSES

DATA_FORMATS = ("channels_last", "channels_first")


class CNN(tf.keras.Model):
    """Conv(32,5x5) -> pool -> Conv(64,5x5) -> pool -> Dense(1024) -> Dropout(0.4) -> logits.

    Args:
        data_format: 'channels_last' (NHWC, what CPUs run) or 'channels_first' (NCHW, faster
            on GPUs). Inputs are always [batch, 28, 28] grayscale; the layout is internal.
    """

    def __init__(self, data_format: str = "channels_last", num_classes: int = NUM_CLASSES):
        super().__init__(name="cnn")
        if data_format not in DATA_FORMATS:
            raise ValueError(f"data_format must be one of {DATA_FORMATS}, got {data_format!r}")
        self.data_format = data_format
        layers = tf.keras.layers
        self.conv1 = layers.Conv2D(
            32, 5, padding="same", activation="relu", data_format=data_format, name="conv1"
        )
        self.pool1 = layers.MaxPooling2D(2, 2, padding="same", data_format=data_format)
        self.conv2 = layers.Conv2D(
            64, 5, padding="same", activation="relu", data_format=data_format, name="conv2"
        )
        self.pool2 = layers.MaxPooling2D(2, 2, padding="same", data_format=data_format)
        self.flatten = layers.Flatten()
        self.dense1 = layers.Dense(1024, activation="relu", name="dense1")
        self.dropout = layers.Dropout(0.4)
        self.logits = layers.Dense(num_classes, name="logits")

    def call(self, images, training=False):
        """images: float32 [batch, 28, 28] in [0, 1]. Returns logits [batch, num_classes]."""
        if self.data_format == "channels_first":
            x = tf.reshape(images, [-1, 1, IMAGE_HEIGHT, IMAGE_WIDTH])
        else:
            x = tf.reshape(images, [-1, IMAGE_HEIGHT, IMAGE_WIDTH, 1])
        x = self.pool1(self.conv1(x))
        x = self.pool2(self.conv2(x))
        x = self.dropout(self.dense1(self.flatten(x)), training=training)
        return self.logits(x)
