"""An image folder with one subfolder per class: validation, input, a small CNN, export.

    DIR/<class name>/<any name>.png|.jpg|.jpeg    (any size, any colour mode)

Every image is opened and decoded with Pillow first (an unreadable one is a DataError naming
it); TensorFlow then reads the files in the graph, decodes them to `channels` (1 or 3),
resizes them to size x size and scales the pixels to [0, 1]. Within each class (files in name
order), every HOLDOUT_EVERY-th image is held out for evaluation.

The model is a small CNN (two conv+pool blocks, a dense layer, logits), either in the custom
model_fn pattern of training/model.py (`cnn`) or as a functional Keras model through
`tf.keras.estimator.model_to_estimator` (`keras`, wrapped as training/baselines.py wraps the
Keras baseline). Both export the image contract's outputs and signatures (`classes` int64
[n], `probabilities` float32 [n, K], as `serving_default` and `classify`) for the input
`image` float32 [-1, size, size, channels] in [0, 1]: a client resizes and scales as the
training pipeline does.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import tensorflow as tf
from PIL import Image, UnidentifiedImageError

from artifact.contract import (
    ASSETS_EXTRA,
    CLASSES_KEY,
    INPUT_KEY,
    LABELS_FILE,
    PIXEL_MAX,
    REPORT_FILE,
    SIGNATURE_NAME,
)
from training import heads
from training.baselines import LOGITS_KEY, keras_estimator, keras_optimizer, to_contract
from training.determinism import kernel_initializer
from training.errors import DataError
from training.evaluation_report import build_report
from training.plots import write_export_plots
from training.publish import export_version
from training.tabular_schema import HOLDOUT_EVERY

IMAGE_KINDS = ("cnn", "keras")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
IMAGE_FORMATS = ("PNG", "JPEG")
CHANNELS = (1, 3)
DEFAULT_IMAGE_SIZE = 32
DEFAULT_CHANNELS = 3
MODES = tf.estimator.ModeKeys


@dataclasses.dataclass(frozen=True)
class ImageFolder:
    """A validated image folder: class names (sorted) and (path, class id) per split."""

    root: str
    classes: tuple[str, ...]
    train: tuple[tuple[str, int], ...]
    holdout: tuple[tuple[str, int], ...]

    def to_json(self) -> dict:
        return {"image_folder": self.root, "classes": list(self.classes)}


def check_image(path: Path) -> None:
    """DataError unless Pillow decodes the file as a PNG or JPEG (what TensorFlow reads)."""
    try:
        with Image.open(path) as image:
            image.load()
            found = image.format
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise DataError(f"{path}: unreadable image: {err}") from err
    # TensorFlow decodes PNG and JPEG (and GIF, BMP), not everything Pillow reads.
    if found not in IMAGE_FORMATS:
        raise DataError(f"{path}: unreadable image: a {found} file, not PNG or JPEG")


def scan_image_folder(root: str | Path) -> ImageFolder:
    """Find, open and split the images of a class-per-subfolder folder.

    Raises:
        DataError: not a folder, fewer than 2 class subfolders, a class without images, an
            image Pillow cannot decode, no image held out.
    """
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: image folder not found")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise DataError(
            f"{root}: {len(classes)} class subfolder(s); an image folder needs one subfolder "
            "per class, at least 2"
        )
    train: list[tuple[str, int]] = []
    holdout: list[tuple[str, int]] = []
    for class_id, name in enumerate(classes):
        files = sorted(
            p
            for p in (root / name).iterdir()
            if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".")
        )
        if not files:
            raise DataError(f"{root / name}: no PNG or JPEG image in this class folder")
        for i, path in enumerate(files):
            check_image(path)
            held_out = i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
            (holdout if held_out else train).append((str(path), class_id))
    if not holdout:
        raise DataError(
            f"{root}: too few images to hold any out (every {HOLDOUT_EVERY}th image of a "
            f"class is held out for evaluation)"
        )
    return ImageFolder(str(root), tuple(classes), tuple(train), tuple(holdout))


def load_image(path, size: int | tuple[int, int], channels: int):
    """Graph ops: one image file to float32 [height, width, channels] in [0, 1].

    size: N for N x N, or (height, width).

    JPEGs are decoded with libjpeg's accurate DCT (decode_image's is the fast one), as Pillow
    decodes them: the service prepares an uploaded file with Pillow and numpy
    (artifact/images.py), and the two must read the same pixels from the same file.
    """
    data = tf.io.read_file(path)
    image = tf.cond(
        tf.io.is_jpeg(data),
        lambda: tf.io.decode_jpeg(data, channels=channels, dct_method="INTEGER_ACCURATE"),
        lambda: tf.io.decode_image(data, channels=channels, expand_animations=False),
    )
    image.set_shape([None, None, channels])
    resized = tf.image.resize(image, [size, size] if isinstance(size, int) else list(size))
    return tf.clip_by_value(resized / PIXEL_MAX, 0.0, 1.0)


def dataset(files, size: int, channels: int):
    """({'image': [size, size, channels]}, class id) per (path, class id)."""
    paths = [p for p, _ in files]
    labels = np.array([c for _, c in files], np.int32)
    ds = tf.data.Dataset.from_tensor_slices((paths, labels))
    return ds.map(
        lambda path, label: ({INPUT_KEY: load_image(path, size, channels)}, label),
        num_parallel_calls=tf.data.AUTOTUNE,
    )


def train_input_fn(folder: ImageFolder, size, channels, batch_size, seed=None):
    return (
        dataset(folder.train, size, channels)
        .cache()
        .shuffle(len(folder.train), seed=seed, reshuffle_each_iteration=True)
        .batch(batch_size)
        .repeat()
        .prefetch(tf.data.AUTOTUNE)
    )


def eval_input_fn(folder: ImageFolder, size, channels, batch_size):
    return dataset(folder.holdout, size, channels).batch(batch_size)


def holdout_images(folder: ImageFolder, size: int, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """The held-out images as float32 [n, size, size, channels] and their class ids."""
    images = np.stack([load_image(p, size, channels).numpy() for p, _ in folder.holdout])
    return images, np.array([c for _, c in folder.holdout], np.int64)


def small_cnn_layers(num_classes: int, seed: int | None = None) -> list:
    """Conv(16,3x3) -> pool -> Conv(32,3x3) -> pool -> Dense(64) -> logits; the initial
    weights follow the run's seed (None: random)."""
    layers = tf.keras.layers
    return [
        layers.Conv2D(16, 3, padding="same", activation="relu", name="conv1",
                      kernel_initializer=kernel_initializer(seed, "conv1")),
        layers.MaxPooling2D(2),
        layers.Conv2D(32, 3, padding="same", activation="relu", name="conv2",
                      kernel_initializer=kernel_initializer(seed, "conv2")),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(64, activation="relu", name="dense1",
                     kernel_initializer=kernel_initializer(seed, "dense1")),
        layers.Dense(num_classes, name=LOGITS_KEY,
                     kernel_initializer=kernel_initializer(seed, LOGITS_KEY)),
    ]  # fmt: skip


def small_cnn(num_classes: int, seed: int | None = None) -> tf.keras.Model:
    """The small CNN as one Keras model the custom model_fn calls."""
    return tf.keras.Sequential(small_cnn_layers(num_classes, seed), name="image_cnn")


def keras_small_cnn(
    size: int, channels: int, num_classes: int, optimizer, seed: int | None = None
) -> tf.keras.Model:
    """The same CNN as a compiled functional Keras model taking `image` [size, size,
    channels], for model_to_estimator (its output layer is `logits`)."""
    image = tf.keras.Input(shape=(size, size, channels), name=INPUT_KEY)
    x = image
    for layer in small_cnn_layers(num_classes, seed):
        x = layer(x)
    model = tf.keras.Model(image, x, name="image_cnn")
    model.compile(
        optimizer=optimizer,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def keras_model_fn(params: dict, config: tf.estimator.RunConfig | None = None):
    """A model_fn(features, labels, mode, params, config) around model_to_estimator's, with
    the contract's PREDICT outputs and signatures and the eval metrics of `cnn`."""
    data = params["data"]
    model = keras_small_cnn(
        data["image_size"], data["channels"], params["num_classes"], keras_optimizer(params),
        params.get("seed"),
    )  # fmt: skip
    inner = keras_estimator(params, model, config).model_fn

    def model_fn(features, labels, mode, params, config):
        # As the Keras baseline: its own scope keeps the Estimator's "loss" summary free.
        with tf.name_scope("keras"):
            spec = inner(features, labels, mode, config)
        logits = spec.predictions[LOGITS_KEY]
        probabilities = tf.nn.softmax(logits, name="softmax_tensor")
        return to_contract(spec, labels, mode, params, logits, probabilities, params["num_classes"])

    return model_fn


def model_fn(features, labels, mode, params):
    """Estimator model_fn of the image folder's CNN.

    params: num_classes, learning_rate, decay_steps (as the reference CNN's), seed.
    """
    model = small_cnn(params["num_classes"], params.get("seed"))
    image = features[INPUT_KEY] if isinstance(features, dict) else features
    logits = model(image, training=mode == MODES.TRAIN)
    if mode == MODES.PREDICT:
        return heads.predict_spec(
            tf.argmax(logits, axis=1), tf.nn.softmax(logits, name="softmax_tensor")
        )
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    classes = tf.argmax(logits, axis=1, output_type=tf.int32)
    if mode == MODES.EVAL:
        return tf.estimator.EstimatorSpec(
            mode,
            loss=loss,
            eval_metric_ops=heads.eval_metric_ops(labels, classes, params["num_classes"]),
        )
    global_step = tf.compat.v1.train.get_or_create_global_step()
    learning_rate = heads.learning_rate_at(params, global_step)
    heads.training_summaries(labels, classes, learning_rate)
    train_op = tf.compat.v1.train.AdamOptimizer(learning_rate).minimize(
        loss, global_step=global_step
    )
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def make_estimator(
    params: dict, config: tf.estimator.RunConfig, warm_start_from=None
) -> tf.estimator.Estimator:
    """The Estimator of params['model'] (an IMAGE_KINDS name; params as `train` records
    them: num_classes, data.image_size, data.channels, learning_rate, decay_steps), started
    from `warm_start_from` (tf.estimator.WarmStartSettings or a checkpoint) when given."""
    kind = params.get("model", "cnn")
    if kind not in IMAGE_KINDS:
        raise ValueError(f"not an image folder kind: {kind!r}; known: {', '.join(IMAGE_KINDS)}")
    function = keras_model_fn(params, config) if kind == "keras" else model_fn
    return tf.estimator.Estimator(
        model_fn=function, config=config, params=params, warm_start_from=warm_start_from
    )


def serving_input_receiver_fn(size: int, channels: int):
    """Raw receiver: `image` float32 [None, size, size, channels], pixels in [0, 1]."""
    # A bare placeholder fails in TF2's eager mode; only its dtype and shape are used.
    with tf.Graph().as_default():
        image = tf.compat.v1.placeholder(tf.float32, [None, size, size, channels], INPUT_KEY)
    return tf.estimator.export.build_raw_serving_input_receiver_fn({INPUT_KEY: image})


def export_image_model(
    estimator, folder: ImageFolder, size: int, channels: int, export_dir, context: dict
) -> tuple[Path | str, dict]:
    """Export a new version with labels.txt (the class folders, in class-id order), the
    evaluation report on the held-out images made by the staged SavedModel itself, and its
    plots (the confusion matrix and the learning curves).

    Returns:
        (the version directory, its report).
    """
    images, truth = holdout_images(folder, size, channels)
    reports = []

    def write_assets(staged: Path) -> None:
        signature = tf.saved_model.load(str(staged)).signatures[SIGNATURE_NAME]
        predicted = signature(**{INPUT_KEY: tf.constant(images)})[CLASSES_KEY].numpy()
        report = build_report(truth, predicted, folder.classes, task="classification", **context)
        extra = staged / ASSETS_EXTRA
        (extra / LABELS_FILE).write_text("\n".join(folder.classes) + "\n", encoding="utf-8")
        (extra / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        write_export_plots(extra, report, context.get("model_dir"))
        reports.append(report)

    version = export_version(
        estimator, export_dir, serving_input_receiver_fn(size, channels), write_assets
    )
    return version, reports[0]
