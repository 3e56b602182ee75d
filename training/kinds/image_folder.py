"""Image folders (`--image-folder`): a small CNN on images of any size
(training/image_folder.py), and what a retrain reads of them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import tensorflow as tf

from artifact.contract import (
    INPUT_KEY,
    SIGNATURE_NAME,
)
from artifact.saved_model import SavedModelPredictor
from training import (
    exported_model,
    image_folder,
    sources,
)
from training.cli import DEFAULT_EPOCHS
from training.configs import (
    CompareConfig,
    DataOptions,
    EvaluateConfig,
    ModelOptions,
    RunOptions,
    TrainConfig,
)
from training.errors import DataError, UsageError
from training.evaluation_report import build_report
from training.kinds.base import DataKind, base_path, given_path
from training.kinds.model_data import (
    CLASSIFICATION,
    ModelData,
    Reader,
    _quantized,
    estimator_config,
)
from training.kinds.prepared_comparison import compare_prepared
from training.kinds.prepared_training import Prepared, run_params, train_and_report
from training.runs import EVAL_BATCH_SIZE


class FolderData(ModelData):
    """Folders of one subfolder of images per class (training/image_folder.py): the base
    folder's images (every HOLDOUT_EVERY-th of a class held out, the test split), and
    `--extra-data` folders of the same classes (a class may be missing)."""

    kind = "image_folder"

    def __init__(self, folder: image_folder.ImageFolder, size: int, channels: int):
        self.folder = folder
        self.size = size
        self.channels = channels
        self.base = folder.root
        self.labels = folder.classes

    def _reader(self, name: str, path: str, role: str, files) -> Reader:
        size, channels = self.size, self.channels
        files = tuple(files)

        def dataset() -> tf.data.Dataset:
            return image_folder.dataset(files, size, channels).map(
                lambda features, label: (features, tf.cast(label, tf.int64))
            )

        def scan(builder: sources.ScanBuilder) -> None:
            for features, labels in dataset().batch(64).as_numpy_iterator():
                for image, label in zip(features[INPUT_KEY], labels, strict=True):
                    builder.add(_quantized(image), int(label))

        return Reader(name, path, role, len(files), scan, dataset)

    def base_readers(self) -> list[Reader]:
        return [
            self._reader("test split", self.base, sources.HELD_OUT, self.folder.holdout),
            self._reader("train split", self.base, sources.TRAINED, self.folder.train),
        ]

    def extra_reader(self, path: str) -> Reader:
        root = Path(path)
        if not root.is_dir():
            raise DataError(f"--extra-data {path}: folder not found")
        folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        unknown = [p.name for p in folders if p.name not in self.labels]
        if unknown or not folders:
            raise DataError(
                f"--extra-data {path}: "
                + (f"class folders {', '.join(unknown)} are not" if unknown else "no class folder;")
                + f" this model's classes are {', '.join(self.labels)}"
            )
        files = []
        for class_folder in folders:
            for image in sorted(class_folder.iterdir()):
                if image.is_file() and image.suffix.lower() in image_folder.IMAGE_SUFFIXES:
                    image_folder.check_image(image)
                    files.append((str(image), self.labels.index(class_folder.name)))
        if not files:
            raise DataError(f"--extra-data {path}: no PNG or JPEG image in its class folders")
        return self._reader("extra data", path, sources.NEW, files)

    def feature_spec(self) -> dict:
        shape = [self.size, self.size, self.channels]
        return {INPUT_KEY: tf.io.FixedLenFeature(shape, tf.float32)}

    def feedback_content(self, features) -> bytes:
        return _quantized(features[INPUT_KEY])

    def feedback_features(self, parsed) -> dict:
        return {INPUT_KEY: parsed[INPUT_KEY]}

    def example_bytes(self) -> int:
        return self.size * self.size * self.channels * 4

    def predictions(self, predictor, features) -> np.ndarray:
        return predictor.run(features[INPUT_KEY], SIGNATURE_NAME)["classes"]

    def run_params(
        self, options: ModelOptions, model: str, max_steps: int, baseline_params: dict
    ) -> dict:
        data = {**self.folder.to_json(), "image_size": self.size, "channels": self.channels}
        params = run_params(options, model, max_steps, "raw", data)
        return {**params, "num_classes": len(self.labels)}

    def report(self, truth, predicted, groups, **context) -> dict:
        return build_report(truth, predicted, self.labels, task=CLASSIFICATION, **context)

    def estimator(self, run_dir, params, options: RunOptions | None, warm_start):
        return image_folder.make_estimator(params, estimator_config(options, run_dir), warm_start)

    def receiver_fn(self):
        return image_folder.serving_input_receiver_fn(self.size, self.channels)


def _folder_data(options: DataOptions, recorded: dict, has_baseline: bool, others) -> FolderData:
    for other in others:
        if other.given(options):
            raise UsageError(
                f"{other.option}: the serving version was trained on a folder of images"
            )
    path = given_path(options.image_folder, "--image-folder") if not has_baseline else base_path(
        options.image_folder, recorded.get("image_folder"), "--image-folder", Path.is_dir
    )  # fmt: skip
    folder = image_folder.scan_image_folder(path)
    size = recorded.get("image_size") or options.image_size or image_folder.DEFAULT_IMAGE_SIZE
    channels = recorded.get("channels") or options.channels or image_folder.DEFAULT_CHANNELS
    for option, given, kept in (("--image-size", options.image_size, size),
                                ("--channels", options.channels, channels)):  # fmt: skip
        if given is not None and given != kept:
            raise UsageError(f"{option} {given}: the serving version takes {kept}")
    if has_baseline and tuple(recorded.get("classes") or ()) != folder.classes:
        raise DataError(
            f"{path}: its classes are {', '.join(folder.classes)}; the serving version's are "
            f"{', '.join(recorded.get('classes') or ())}"
        )
    return FolderData(folder, size, channels)


class ImageFolderKind(DataKind):
    """A folder with one subfolder of PNG/JPEG images per class: a small CNN or a Keras
    model on images of any size (training/image_folder.py)."""

    name = "image_folder"
    option = "--image-folder"
    attribute = "image_folder"
    model_kinds = image_folder.IMAGE_KINDS
    default_model = "cnn"
    only_options = {"--image-size": "image_size", "--channels": "channels"}
    location_keys = ("image_folder",)
    noun = "folder of images"

    @property
    def models_text(self) -> str:
        return " or ".join(self.model_kinds)

    def default_folders(self, source) -> tuple[str, str]:
        name = Path(source).resolve().name
        return f"runs/{name}", f"models/{name}"

    def prepare(self, config: TrainConfig) -> Prepared:
        """The folder scanned and checked; --image-size and --channels defaulted (its classes
        are its subfolders, and its receiver is raw)."""
        folder = image_folder.scan_image_folder(given_path(config.image_folder, self.option))
        size = config.image_size or image_folder.DEFAULT_IMAGE_SIZE
        channels = config.channels or image_folder.DEFAULT_CHANNELS
        count = len(folder.train)
        return Prepared(
            count=count,
            data={**folder.to_json(), "image_size": size, "channels": channels},
            what=f"{count:,} images of {len(folder.classes)} classes from {config.image_folder} "
            f"({size}x{size}x{channels})",
            extra_params={"num_classes": len(folder.classes)},
            estimator=image_folder.make_estimator,
            train_input=lambda: image_folder.train_input_fn(
                folder, size, channels, config.batch_size, config.seed
            ),
            eval_input=lambda: image_folder.eval_input_fn(folder, size, channels, EVAL_BATCH_SIZE),
            export=lambda estimator, export_dir, context: image_folder.export_image_model(
                estimator, folder, size, channels, export_dir, context
            ),
        )

    def train(self, config: TrainConfig, others: Sequence[DataKind]) -> int:
        return train_and_report(config, self, others, DEFAULT_EPOCHS)

    def compare(self, config: CompareConfig, others: Sequence[DataKind]) -> int:
        return compare_prepared(config, self, others, DEFAULT_EPOCHS)

    def retrain_data(
        self,
        options: DataOptions,
        recorded: dict,
        params: dict,
        has_baseline: bool,
        labels_of_idx: Callable[[], tuple[str, ...]],
        others: Sequence[DataKind],
    ) -> ModelData:
        return _folder_data(options, recorded, has_baseline, others)

    def takes(self, version) -> bool:
        return isinstance(version, exported_model.ImageVersion)

    def evaluate_export(self, config: EvaluateConfig, version) -> dict:
        """Every image of --image-folder, its class by its subfolder."""
        if not config.image_folder:
            raise UsageError(
                f"{version.path} is a model of {version.shape_text()} images: evaluate it with "
                f"--image-folder DIR holding a subfolder per class ({', '.join(version.labels)})"
            )
        images, truth, _ = exported_model.read_labeled_folder(version, config.image_folder)
        predictor = SavedModelPredictor(version.path)
        inputs = {version.input_name: images}
        outputs = exported_model.run_batched(predictor, version.signature, inputs, EVAL_BATCH_SIZE)
        return build_report(
            truth, exported_model.image_classes(outputs), version.labels, task="classification",
            image_folder=str(config.image_folder), saved_model=str(version.path), split="all",
        )  # fmt: skip


IMAGE_FOLDER = ImageFolderKind()
