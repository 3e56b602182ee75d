"""`python -m training predict`: batch prediction over a file of images, as JSON lines.

The input is an IDX images file (gzipped or not), a `.npy` array [n, 28, 28] (or one [28, 28]
image; integers 0-255 or floats in [0, 1], the service's JSON convention), one image file, or
a folder of image files (PNG, JPEG, ...; turned into 28x28 exactly as the service turns
uploads, `artifact.images.image_to_pixels`).

It runs the exported SavedModel (`artifact.saved_model.SavedModelPredictor`), not
`estimator.predict` over the checkpoints: the SavedModel is what the service serves, with the
same preprocessing, labels and JSON encoder, so an image gets the service's answer; it needs
no model dir, params or code of the model kind that trained it (the checkpoints may be gone,
the kind's code may have moved on); and it is the faster path. Each line is what the
service's `/predict` answers for that image (`artifact.contract.prediction_rows`, encoded by
`artifact.contract.to_json`) plus where it came from:

    {"index": 0, "class_id": 9, "label": "Ankle boot", "probabilities": {"T-shirt/top": ..., ...}}
    {"file": "boot.png", "class_id": 9, ...}

Byte for byte when the model sees the same batch (a request with the same images in the
same order, within --batch-size); TensorFlow's CPU kernels round differently for other batch
sizes, so probabilities may then differ in the last float32 digits (about 1e-7), as the
service's own answers do when its dynamic batching groups requests differently.

An exported CSV model takes a CSV file instead (its feature columns; a label column is
allowed and ignored) and an exported image model of any size an image file or a folder of them
(its subfolders too), each read as its training read them (training/exported_model.py). A line per
row or image holds what the service's friendly answer would: a classifier's class id, label
and probabilities by label, a regressor's value:

    {"index": 0, "class_id": 2, "label": "mid", "probabilities": {"high": ..., "mid": ...}}
    {"index": 0, "value": 12.5}
    {"file": "circle/circle_004.png", "class_id": 0, "label": "circle", "probabilities": {...}}

The output appears complete or not at all (written beside it, then renamed).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from artifact.contract import (
    IMAGE_SHAPE,
    PixelError,
    normalize_pixels,
    pixels_to_input,
    prediction_rows,
)
from artifact.images import ImageError, image_to_pixels
from artifact.repository import resolve_version_path, version_labels
from artifact.saved_model import SavedModelPredictor
from training import data, exported_model
from training.configs import PredictConfig
from training.errors import UsageError
from training.progress import ProgressBar

# The formats the service decodes (artifact/images.py: IMAGE_FORMATS).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
DEFAULT_BATCH_SIZE = 256


def _pixels_from_array(array: np.ndarray, path: Path) -> np.ndarray:
    """A .npy array to float32 [n, 28, 28] in [0, 1] by the service's JSON rules."""
    if array.shape == IMAGE_SHAPE:
        array = array[None]
    if array.ndim != 3 or array.shape[1:] != IMAGE_SHAPE or len(array) == 0:
        raise UsageError(f"{path}: expected an array [n, 28, 28] or [28, 28], got {array.shape}")
    try:
        return pixels_to_input(array)
    except PixelError as err:
        raise UsageError(f"{path}: image {err.index}: {err.problem}") from err


def _image_file_pixels(path: Path, invert: str) -> np.ndarray:
    try:
        return image_to_pixels(path.read_bytes(), invert)
    except ImageError as err:
        raise UsageError(f"{path}: {err}") from err
    except OSError as err:
        raise UsageError(f"{path}: cannot read: {err.strerror}") from err


def read_inputs(path: Path, invert: str = "auto") -> tuple[np.ndarray, str, list]:
    """The images to classify and what names each.

    Returns:
        (float32 images [n, 28, 28] in [0, 1], "index" or "file", one key per image).
    Raises:
        UsageError / DataError: missing, unreadable, empty or malformed input.
    """
    if path.is_dir():
        files = sorted(
            p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
        )
        if not files:
            raise UsageError(
                f"{path}: no image files in this folder (looked for {', '.join(IMAGE_SUFFIXES)})"
            )
        pixels = np.stack([_image_file_pixels(f, invert) for f in files])
        return normalize_pixels(pixels), "file", [f.name for f in files]
    if not path.is_file():
        raise UsageError(f"{path}: not found")
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return normalize_pixels(_image_file_pixels(path, invert)[None]), "file", [path.name]
    if suffix == ".npy":
        try:
            array = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise UsageError(f"{path}: not a readable .npy array ({err})") from err
        images = _pixels_from_array(array, path)
    else:
        images = data.read_images(path)
        if len(images) == 0:
            raise UsageError(f"{path}: holds no images")
        images = normalize_pixels(images)
    return images, "index", list(range(len(images)))


def predict(config: PredictConfig) -> int:
    """Predict every image (or CSV row) of --input with an exported version; write --output."""
    try:
        version = resolve_version_path(Path(config.model))
    except FileNotFoundError as err:
        raise UsageError(f"--model {err}") from err
    output = Path(config.output)
    if not output.parent.is_dir():
        raise UsageError(f"--output {output}: folder {output.parent} does not exist")
    if output.is_dir():
        raise UsageError(f"--output {output}: is a folder")
    described = exported_model.describe_version(version)
    if isinstance(described, exported_model.TabularVersion):
        return _predict_rows(config, described, output)
    if isinstance(described, exported_model.ImageVersion):
        return _predict_images(config, described, output)
    images, key_name, keys = read_inputs(Path(config.input), config.invert)
    # The labels the service answers with for this version.
    labels = version_labels(version)
    predictor = SavedModelPredictor(version)
    print(f"Predicting {len(images):,} images from {config.input} with {version}", flush=True)

    def batches() -> Iterator[list[bytes]]:
        for start in range(0, len(images), config.batch_size):
            stop = start + config.batch_size
            classes, probabilities = predictor.predict(images[start:stop])
            rows = prediction_rows(classes, probabilities, labels)
            yield [
                exported_model.json_line(key_name, key, row)
                for key, row in zip(keys[start:stop], rows, strict=True)
            ]

    write_lines(output, batches(), len(images), "images")
    return 0


def _predict_rows(
    config: PredictConfig, version: exported_model.TabularVersion, output: Path
) -> int:
    """Every row of a CSV file through an exported CSV model."""
    source = Path(config.input)
    if source.is_dir():
        raise UsageError(
            f"{source}: a folder; {version.path} is a model of CSV rows: give a CSV file with "
            f"the columns it takes ({version.inputs_text()})"
        )
    rows = exported_model.read_csv_for(version, source, with_label=False)
    predictor = SavedModelPredictor(version.path)
    inputs = exported_model.model_inputs(version, rows)
    count = len(rows.rows)
    print(f"Predicting {count:,} rows from {source} with {version.path}", flush=True)

    def batches() -> Iterator[list[bytes]]:
        for start in range(0, count, config.batch_size):
            chunk = {
                name: values[start : start + config.batch_size] for name, values in inputs.items()
            }
            answers = exported_model.tabular_answers(
                version, predictor.run(chunk, version.signature)
            )
            yield [
                exported_model.json_line("index", start + i, answer)
                for i, answer in enumerate(answers)
            ]

    write_lines(output, batches(), count, "rows")
    return 0


def _predict_images(
    config: PredictConfig, version: exported_model.ImageVersion, output: Path
) -> int:
    """Every image of a file or a folder (its subfolders too) through an exported image model."""
    source = Path(config.input)
    files = exported_model.image_files(source)
    predictor = SavedModelPredictor(version.path)
    print(
        f"Predicting {len(files):,} images from {source} with {version.path} "
        f"({version.shape_text()})",
        flush=True,
    )

    def batches() -> Iterator[list[bytes]]:
        for start in range(0, len(files), config.batch_size):
            chunk = files[start : start + config.batch_size]
            images = np.stack([exported_model.read_image(version, path) for path in chunk])
            outputs = predictor.run({version.input_name: images}, version.signature)
            answers = exported_model.image_answers(version, outputs)
            yield [
                exported_model.json_line("file", _shown_name(path, source), answer)
                for path, answer in zip(chunk, answers, strict=True)
            ]

    write_lines(output, batches(), len(files), "images")
    return 0


def _shown_name(path: Path, source: Path) -> str:
    return path.name if source.is_file() else path.relative_to(source).as_posix()


def write_lines(output: Path, batches: Iterable[list[bytes]], total: int, unit: str) -> None:
    """Write the batches' JSON lines to output: complete or not at all (a file beside it,
    renamed in when every line is written), with a progress bar counting `unit`."""
    fd, temp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    progress = ProgressBar(total, "predict", unit)
    try:
        with os.fdopen(fd, "wb") as out:
            for lines in batches:
                out.writelines(lines)
                progress.update(len(lines))
        os.replace(temp, output)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    progress.close()
    print(f"Wrote {total:,} predictions to {output}")
