"""What an exported tabular or image version takes, and a user's data read against it.

`evaluate` and `predict` run an exported version (the SavedModel the service serves) on a CSV
file or on images. What the version takes is read from the version itself:

- a **tabular** model (a pre-made Estimator on feature columns, `train --csv`): TF's `predict`
  signature. Behind a raw receiver its inputs are the features, one per column, and each
  input's dtype says how to read the column (float32, int64 or string); behind a tf.Example
  parsing receiver (one `examples` input) the features are the columns its evaluation report
  records. The outputs say the task (`predictions`: a regressor; `class_ids` and
  `probabilities`: a classifier), labels.txt the classes, the report the label column's name;
- an **image** model (`train --image-folder`, or any model taking one float32 input
  [-1, height, width, channels]): images are decoded, resized and scaled to [0, 1] as its
  training pipeline does (training/image_folder.py's `load_image`);
- the image contract's 28x28 models (IDX data) are not described here: `describe_version`
  answers None for them, and the commands keep their own path.

Data is checked against that before the model runs, each problem one DataError naming the
file (and line): a CSV whose columns differ from the model's inputs, a missing label column, a
value that is not of its column's type, a label that is not one of the model's classes, an
image folder with a class the model does not know, an unreadable image.

The gated retrain reads new CSV rows and image folders against the serving version the same
way.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2

from artifact.contract import (
    CLASSES_KEY,
    PROBABILITIES_KEY,
    SIGNATURE_NAME,
    prediction_rows,
    to_json,
)
from artifact.repository import read_labels, read_report
from artifact.saved_model import SavedModelPredictor, signature_def_map
from training.errors import DataError, UsageError
from training.image_folder import IMAGE_SUFFIXES, load_image
from training.tabular import EXAMPLES_KEY, PREDICT_SIGNATURE, feature_arrays, to_examples
from training.tabular_schema import Column, Schema, is_integer, is_number, read_rows

PREDICTIONS_KEY = "predictions"  # a pre-made regressor's output
CLASS_IDS_KEY = "class_ids"  # a pre-made classifier's
DEFAULT_LABEL = "label"
# Signature input dtypes -> the CSV column kinds of training/tabular_schema.py.
_KINDS = {types_pb2.DT_FLOAT: "float", types_pb2.DT_INT64: "int", types_pb2.DT_STRING: "string"}
_DTYPE_NAMES = {"float": "float32", "int": "int64", "string": "string"}
CHANNELS = (1, 3)


@dataclasses.dataclass(frozen=True)
class TabularVersion:
    """An exported model of CSV rows.

    features: the columns it takes, with their kinds (float, int, string);
    receiver: 'raw' (one input per feature) or 'parsing' (serialized tf.Examples);
    label: the label column of its training data (the report's, else 'label');
    label_kind: how its training labels were read ('string', 'int' class ids, 'float');
    classes: a classifier's class names in class-id order (empty for a regressor).
    """

    path: Path
    signature: str
    receiver: str
    features: tuple[Column, ...]
    label: str
    label_kind: str
    task: str
    classes: tuple[str, ...]

    def inputs_text(self) -> str:
        return ", ".join(f"{c.name} ({_DTYPE_NAMES[c.kind]})" for c in self.features)

    def schema(self, path: str | Path, header) -> Schema:
        """A Schema of a CSV file read for this model (training/tabular.py's helpers take it)."""
        return Schema(
            path=str(path),
            header=tuple(header),
            label=self.label,
            label_kind=self.label_kind,
            task=self.task,
            columns=self.features,
            classes=self.classes,
            train_rows=0,
            holdout_rows=0,
        )


@dataclasses.dataclass(frozen=True)
class ImageVersion:
    """An exported model of images: one float32 input [-1, height, width, channels] in [0, 1],
    class probabilities out; labels in class-id order."""

    path: Path
    signature: str
    input_name: str
    height: int
    width: int
    channels: int
    labels: tuple[str, ...]

    def shape_text(self) -> str:
        return f"{self.height}x{self.width}x{self.channels}"


def _dims(info) -> list[int] | None:
    if info.tensor_shape.unknown_rank:
        return None
    return [dim.size for dim in info.tensor_shape.dim]


def _report_data(report: dict | None) -> dict:
    return ((report or {}).get("params") or {}).get("data") or {}


def _tabular(path: Path, name: str, signature, report: dict | None) -> TabularVersion:
    data = _report_data(report)
    recorded = [Column(c["name"], c["kind"]) for c in data.get("columns", [])]
    if set(signature.inputs) == {EXAMPLES_KEY}:
        receiver, features = "parsing", tuple(recorded)
        if not features:
            raise UsageError(
                f"{path}: takes serialized tf.Examples and its report "
                "(assets.extra/evaluation.json) records no feature columns: cannot tell which "
                "columns to read"
            )
    else:
        receiver, taken = "raw", {}
        for key, info in signature.inputs.items():
            kind = _KINDS.get(info.dtype)
            if kind is None or _dims(info) != [-1]:
                raise UsageError(
                    f"{path}: input {key!r} of signature {name!r} is "
                    f"{types_pb2.DataType.Name(info.dtype)} {_dims(info)}; a CSV column feeds "
                    "one float32, int64 or string value per row"
                )
            taken[key] = Column(key, kind)
        # The training file's column order where the report records it.
        order = [c.name for c in recorded if c.name in taken]
        features = tuple(taken[n] for n in order + sorted(set(taken) - set(order)))
    classes: tuple[str, ...]
    if PREDICTIONS_KEY in signature.outputs:
        task, label_kind, classes = "regression", "float", ()
    else:
        task = "classification"
        label_kind = data.get("label_kind", "string")
        classes = read_labels(path) or tuple(data.get("classes") or ())
        dims = _dims(signature.outputs[PROBABILITIES_KEY])
        if not classes and not dims:
            raise UsageError(
                f"{path}: output {PROBABILITIES_KEY!r} has an unknown shape and the version "
                "names no classes"
            )
        if not classes and dims:
            width = dims[-1]
            classes, label_kind = tuple(str(k) for k in range(width)), "int"
    label = data.get("label", DEFAULT_LABEL)
    return TabularVersion(path, name, receiver, features, label, label_kind, task, classes)


def _image(path: Path, name: str, signature) -> ImageVersion | None:
    (key, info), *others = signature.inputs.items()
    dims = _dims(info)
    if others or info.dtype != types_pb2.DT_FLOAT or dims is None or len(dims) != 4:
        return None
    height, width, channels = dims[1:]
    if min(height, width) <= 0 or channels not in CHANNELS:
        return None
    probabilities = signature.outputs.get(PROBABILITIES_KEY)
    shape = _dims(probabilities) if probabilities is not None else None
    if shape is None or len(shape) != 2:
        return None
    count = shape[1]
    labels = read_labels(path) or tuple(str(k) for k in range(count))
    return ImageVersion(path, name, key, height, width, channels, labels)


def describe_version(path: str | Path) -> TabularVersion | ImageVersion | None:
    """What an exported version takes; None for the image contract's 28x28 models.

    Raises:
        UsageError: the version takes neither CSV rows nor images of a known shape.
    """
    path = Path(path)
    signatures = signature_def_map(path).signature_def
    if PREDICT_SIGNATURE in signatures and (
        {PREDICTIONS_KEY, PROBABILITIES_KEY} & set(signatures[PREDICT_SIGNATURE].outputs)
        and not _image_like(signatures[PREDICT_SIGNATURE])
    ):
        return _tabular(path, PREDICT_SIGNATURE, signatures[PREDICT_SIGNATURE], read_report(path))
    name = SIGNATURE_NAME if SIGNATURE_NAME in signatures else next(iter(sorted(signatures)), None)
    signature = signatures.get(name) if name else None
    if name and signature is not None and len(signature.inputs) == 1:
        info = next(iter(signature.inputs.values()))
        if info.dtype == types_pb2.DT_FLOAT and len(_dims(info) or []) == 3:
            return None  # the image contract: IDX data
        image = _image(path, name, signature)
        if image is not None:
            return image
    raise UsageError(
        f"{path}: takes neither CSV rows (a pre-made Estimator's {PREDICT_SIGNATURE!r} "
        "signature) nor images (one float32 input [-1, height, width, 1 or 3] and "
        f"{PROBABILITIES_KEY!r}); its signatures: {', '.join(sorted(signatures)) or 'none'}"
    )


def _image_like(signature) -> bool:
    return any(len(_dims(info) or []) > 2 for info in signature.inputs.values())


# --- CSV rows -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CsvRows:
    """A CSV file read for a tabular version: its rows, and them as the model's inputs."""

    schema: Schema
    rows: list[list[str]]
    inputs: dict[str, np.ndarray]

    @property
    def header(self) -> tuple[str, ...]:
        return self.schema.header


def _check_columns(version: TabularVersion, path: Path, header, with_label: bool) -> None:
    names = [c.name for c in version.features]
    missing = [n for n in names if n not in header]
    if with_label and version.label not in header:
        raise DataError(
            f"{path}: no label column {version.label!r} (columns: {', '.join(header)}); "
            "evaluating needs the true values"
        )
    unknown = [n for n in header if n not in names and n != version.label]
    if missing or unknown:
        problems = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"not inputs of the model: {', '.join(unknown)}"] if unknown else []
        )
        raise DataError(
            f"{path}: the columns differ from the model's inputs ({'; '.join(problems)}); it "
            f"takes {version.inputs_text()}"
            + (f" and the label column {version.label!r}" if with_label else "")
        )


def _check_values(version: TabularVersion, path: Path, header, rows, lines, with_label) -> None:
    checks = [(c.name, c.kind) for c in version.features if c.kind != "string"]
    for number, row in zip(lines, rows, strict=True):
        for name, kind in checks:
            value = row[header.index(name)]
            fits = is_integer(value) if kind == "int" else is_number(value)
            if not fits:
                shown = repr(value) if value else "an empty value"
                expected = "an integer" if kind == "int" else "a number"
                raise DataError(
                    f"{path}: line {number}, column {name!r}: {shown} is not {expected} (the "
                    f"model takes {_DTYPE_NAMES[kind]})"
                )
        if with_label:
            _check_label(version, path, number, row[header.index(version.label)])


def _check_label(version: TabularVersion, path: Path, line: int, value: str) -> None:
    where = f"{path}: line {line}, label column {version.label!r}"
    if version.task == "regression":
        if not is_number(value):
            raise DataError(f"{where}: {value!r} is not a number (the model is a regressor)")
        return
    name = str(int(value)) if version.label_kind == "int" and is_integer(value) else value
    if name not in version.classes:
        raise DataError(
            f"{where}: {value!r} is not a class of the model (its classes: "
            f"{', '.join(version.classes)})"
        )


def read_csv_for(version: TabularVersion, path: str | Path, with_label: bool) -> CsvRows:
    """Read a CSV file as the version's inputs, checked against what it takes.

    Args:
        with_label: the file must hold the label column (evaluating); otherwise a label
            column is allowed and ignored (predicting on a file with answers in it).
    Raises:
        DataError: unreadable or ragged file, columns that differ from the model's inputs, a
            missing label column, a value not of its column's type, an unknown class.
    """
    path = Path(path)
    header, rows, lines = read_rows(path, with_lines=True)
    _check_columns(version, path, header, with_label)
    _check_values(version, path, header, rows, lines, with_label)
    schema = version.schema(path, header)
    return CsvRows(schema, rows, feature_arrays(schema, header, rows))


def model_inputs(version: TabularVersion, rows: CsvRows) -> dict[str, np.ndarray]:
    """The signature's inputs for rows: the feature arrays, or their tf.Examples."""
    if version.receiver == "parsing":
        return {EXAMPLES_KEY: np.array(to_examples(rows.schema, rows.inputs), object)}
    return rows.inputs


# --- images -------------------------------------------------------------------------------------


def _is_image_file(path: Path) -> bool:
    visible = not path.name.startswith(".")
    return visible and path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES


def read_image(version: ImageVersion, path: Path) -> np.ndarray:
    """One image file as the version's input [height, width, channels] in [0, 1]."""
    try:
        image = load_image(str(path), (version.height, version.width), version.channels)
        return image.numpy()
    except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError) as err:
        problem = err.message.splitlines()[0] if err.message else type(err).__name__
        raise DataError(f"{path}: unreadable image: {problem}") from err


def image_files(root: str | Path) -> list[Path]:
    """The PNG and JPEG files of a file or a folder (its subfolders too), in name order.

    Raises:
        DataError: not found, or a folder without any.
    """
    root = Path(root)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise DataError(f"{root}: not found")
    files = sorted(p for p in root.rglob("*") if _is_image_file(p))
    if not files:
        raise DataError(f"{root}: no PNG or JPEG image in this folder or its subfolders")
    return files


def read_labeled_folder(version: ImageVersion, root: str | Path):
    """An image folder with one subfolder per class, read as the version's inputs.

    Returns:
        (images [n, height, width, channels], class ids by the version's labels, files).
    Raises:
        DataError: no such folder, no class subfolder, a class the model does not know, no
            image, an unreadable image.
    """
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: image folder not found")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataError(f"{root}: no class subfolder (one subfolder of images per class)")
    unknown = [name for name in classes if name not in version.labels]
    if unknown:
        raise DataError(
            f"{root}: class folder(s) {', '.join(unknown)} name no class of the model (its "
            f"classes: {', '.join(version.labels)})"
        )
    files, truth = [], []
    for name in classes:
        found = sorted(p for p in (root / name).iterdir() if _is_image_file(p))
        files += found
        truth += [version.labels.index(name)] * len(found)
    if not files:
        raise DataError(f"{root}: no PNG or JPEG image in its class folders")
    images = np.stack([read_image(version, path) for path in files])
    return images, np.array(truth, np.int64), files


# --- running the model --------------------------------------------------------------------------


def run_batched(
    predictor: SavedModelPredictor, signature: str, inputs: dict[str, np.ndarray], batch_size: int
) -> dict[str, np.ndarray]:
    """Every output of a signature over inputs of any length, batch_size rows per call."""
    count = len(next(iter(inputs.values())))
    parts: dict[str, list[np.ndarray]] = {}
    for start in range(0, count, batch_size):
        chunk = {name: values[start : start + batch_size] for name, values in inputs.items()}
        for key, value in predictor.run(chunk, signature).items():
            parts.setdefault(key, []).append(value)
    return {key: np.concatenate(values) for key, values in parts.items()}


def tabular_answers(version: TabularVersion, outputs: dict[str, np.ndarray]) -> list[dict]:
    """Per row, what the service's friendly answer holds: a classifier's class id, label and
    probabilities by label; a regressor's value."""
    if version.task == "regression":
        return [{"value": value} for value in outputs[PREDICTIONS_KEY].reshape(-1)]
    class_ids = outputs[CLASS_IDS_KEY].reshape(-1)
    return class_answers(class_ids, outputs[PROBABILITIES_KEY], version.classes)


def image_classes(outputs: dict[str, np.ndarray]) -> np.ndarray:
    """An image model's class ids: its `classes` output, or the most probable class."""
    classes = outputs.get(CLASSES_KEY)
    if classes is None or classes.dtype.kind not in "iu":
        return outputs[PROBABILITIES_KEY].argmax(axis=1)
    return classes.reshape(-1)


def image_answers(version: ImageVersion, outputs: dict[str, np.ndarray]) -> list[dict]:
    """Per image: class id, label and probabilities by label."""
    return class_answers(image_classes(outputs), outputs[PROBABILITIES_KEY], version.labels)


def class_answers(class_ids, probabilities, labels) -> list[dict]:
    """A classifier's answers: artifact.contract.prediction_rows, as the service shows them."""
    return list(prediction_rows(class_ids, probabilities, tuple(labels)))


def json_line(key: str, value, answer: dict) -> bytes:
    """One JSON line of batch prediction: where the example came from, then its answer."""
    return to_json({key: value, **answer}) + b"\n"
