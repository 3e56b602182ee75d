"""Models as users export them, beyond the kinds `python -m training` makes: for the tests of
the friendly `/predict` and the page on them.

- `resnet_bytes`: TF Serving's usual image model, as the official ResNet export makes it: an
  Estimator whose serving input receiver takes `image_bytes` (string [-1]) and decodes each
  file in its graph (`tf.io.decode_image`, 3 channels, resized to 16x16 by `tf.map_fn`);
  a custom model_fn's `PredictOutput` of `classes` int64 [-1] and `probabilities` float
  [-1, 3] (signatures `serving_default` and `predict`), with an `assets.extra/labels.txt`.
- `two_targets`: a pre-made `DNNRegressor(label_dimension=2)` on two float features,
  exported through the raw receiver: only `predict`, whose one output `predictions` is
  float [-1, 2].
- `png_module`: a `tf.Module` saved by the service's TensorFlow: `image_bytes` string
  [None] decoded by `tf.io.decode_png` in grayscale, resized to 24x24, a dense layer and a
  softmax to the one output `output_0` float [-1, 2] (what `tf.saved_model.save` names an
  unnamed output).

The Estimators are trained a few steps (seconds) by the training side's TensorFlow (2.15,
the last with `tf.estimator`), in its interpreter (support/sides.py); the module is saved here.
"""

from __future__ import annotations

from pathlib import Path

from support.sides import on_the_training_side

RESNET_SIZE, MODULE_SIZE = 16, 24
RESNET_LABELS = ("red", "green", "blue")
# Instances of the regressor's features.
TWO_TARGET_ROWS = [{"x1": 0.5, "x2": -1.0}, {"x1": 2.0, "x2": 3.5}, {"x1": -1.5, "x2": 0.0}]

# Run by the training side's interpreter: the two Estimators, each exported as version 1
# under the folder named in its stdin.
_ESTIMATORS = """
import json, os, sys
import numpy as np
from artifact.quiet import import_tensorflow
tf = import_tensorflow()
base, SIZE = json.load(sys.stdin)
config = tf.estimator.RunConfig(tf_random_seed=0)
rng = np.random.default_rng(0)

def export(estimator, receiver_fn, folder):
    os.makedirs(folder)
    exported = estimator.export_saved_model(folder + "/.export", receiver_fn).decode()
    os.rename(exported, folder + "/1")
    os.rmdir(folder + "/.export")

def model_fn(features, labels, mode):
    flat = tf.compat.v1.layers.flatten(features)
    logits = tf.compat.v1.layers.dense(flat, 3)
    predictions = {"classes": tf.argmax(logits, 1), "probabilities": tf.nn.softmax(logits)}
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions=predictions, export_outputs={
            "predict": tf.estimator.export.PredictOutput(predictions)})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    step = tf.compat.v1.train.get_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(loss, step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

# Images whose brightest channel is their class: red, green or blue.
classes = rng.integers(0, 3, 60).astype(np.int32)
images = (rng.random((60, SIZE, SIZE, 3)) * 0.4).astype(np.float32)
images[np.arange(60), :, :, classes] += 0.6
resnet = tf.estimator.Estimator(model_fn, base + "/work/resnet_bytes", config=config)
resnet.train(lambda: tf.data.Dataset.from_tensor_slices((images, classes)).repeat().batch(20),
             max_steps=30)

def preprocess(data):
    image = tf.io.decode_image(data, channels=3, expand_animations=False)
    return tf.image.resize(tf.image.convert_image_dtype(image, tf.float32), [SIZE, SIZE])

def image_bytes_receiver():
    image_bytes = tf.compat.v1.placeholder(tf.string, [None], name="input_tensor")
    decoded = tf.map_fn(preprocess, image_bytes, back_prop=False, dtype=tf.float32)
    return tf.estimator.export.TensorServingInputReceiver(decoded, {"image_bytes": image_bytes})

export(resnet, image_bytes_receiver, base + "/models/resnet_bytes")

x = rng.normal(size=(64, 2)).astype(np.float32)
y = np.stack([x[:, 0] + x[:, 1], 2 * x[:, 0] - x[:, 1]], axis=1).astype(np.float32)
columns = [tf.feature_column.numeric_column("x1"), tf.feature_column.numeric_column("x2")]
regressor = tf.estimator.DNNRegressor(
    hidden_units=[4], feature_columns=columns, label_dimension=2,
    model_dir=base + "/work/two_targets", config=config)
regressor.train(lambda: tf.data.Dataset.from_tensor_slices(
    ({"x1": x[:, 0], "x2": x[:, 1]}, y)).repeat().batch(16), max_steps=10)
with tf.Graph().as_default():
    placeholders = {name: tf.compat.v1.placeholder(tf.float32, [None], name)
                    for name in ("x1", "x2")}
export(regressor, tf.estimator.export.build_raw_serving_input_receiver_fn(placeholders),
       base + "/models/two_targets")
"""


def save_png_module(version_dir: Path) -> None:
    """`png_module` (the module's docstring), saved by this process's TensorFlow."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    weights = tf.constant(rng.normal(size=(MODULE_SIZE * MODULE_SIZE, 2)).astype(np.float32))

    def preprocess(data):
        image = tf.io.decode_png(data, channels=1)
        image = tf.image.resize(tf.image.convert_image_dtype(image, tf.float32), [MODULE_SIZE] * 2)
        return tf.reshape(image, [MODULE_SIZE * MODULE_SIZE])

    class PngModule(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
        def serve(self, image_bytes):
            pixels = tf.map_fn(preprocess, image_bytes, fn_output_signature=tf.float32)
            return tf.nn.softmax(tf.matmul(pixels - 0.5, weights))

    module = PngModule()
    tf.saved_model.save(
        module,
        str(version_dir),
        signatures={"serving_default": module.serve.get_concrete_function()},
    )


def make_user_exports(root: Path) -> None:
    """Every model above as version 1 under root/models/<name> (root/work: the Estimators'
    checkpoints)."""
    done = on_the_training_side(_ESTIMATORS, [str(root), RESNET_SIZE])
    assert done.returncode == 0, done.stderr[-4000:]
    labels = root / "models" / "resnet_bytes" / "1" / "assets.extra" / "labels.txt"
    labels.parent.mkdir()
    labels.write_text("".join(f"{label}\n" for label in RESNET_LABELS))
    save_png_module(root / "models" / "png_module" / "1")
