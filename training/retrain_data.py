"""What the gated retrain reads, trains and judges for each kind of model: the IDX image
contract (Fashion-MNIST), a CSV model (`train --csv`) and an image-folder model
(`train --image-folder`).

Each source of labeled examples (the base data's held-out and training parts, each
`--extra-data` of the model's own kind, the feedback store) is a `Reader`, and is read twice,
streaming from its files both times, never loaded whole:

1. the scan (Python, one example at a time): each example's content bytes and label go to
   training/sources.py's ScanBuilder, which keeps a digest and two keys (a few dozen bytes an
   example), so that the assembly can drop duplicates and split the new data;
2. tf.data: the examples as (features, target), zipped with the one byte per example the
   assembly decided (written to the run dir, read back by a FixedLengthRecordDataset) and
   filtered: the training input (each source shuffled within a buffer, the sources sampled
   in proportion to what they give, `sample_from_datasets`) and the held-out set, which the
   candidate and the serving version predict batch by batch.

The feedback store's shards are read as tf.Example records (TFRecordDataset over the shards'
files) or, for the image contract, as the MNIST-format shards of earlier versions
(FixedLengthRecordDataset); the examples past a sender's cap (training/feedback_source.py)
are skipped. A target is a class id (int64) for a classifier and the value (float32) for a
regressor; each kind turns it into the label its Estimator takes.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import json
import math
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import tensorflow as tf

from artifact import feedback
from artifact.contract import (
    ASSETS_EXTRA,
    IMAGE_HEIGHT,
    IMAGE_WIDTH,
    INPUT_KEY,
    LABELS_FILE,
    REPORT_FILE,
    SIGNATURE_NAME,
    normalize_pixels,
)
from artifact.saved_model import SavedModelPredictor
from artifact.warmup import WARMUP_BATCH_SIZES
from training import (
    data,
    determinism,
    finetune,
    image_folder,
    publish,
    sources,
    tabular,
    tabular_schema,
)
from training import train as idx_train
from training.errors import DataError, UsageError
from training.estimator import make_estimator, trainable_variable_shapes
from training.evaluation import build_regression_report, build_report
from training.feedback_source import FeedbackSelection
from training.runs import EVAL_BATCH_SIZE
from training.train_any import run_config, run_params

CLASSIFICATION, REGRESSION = "classification", "regression"
# At most this many bytes of examples wait in each source's shuffle buffer (and never more
# than this many examples).
SHUFFLE_BYTES = 64 * 1024**2
SHUFFLE_EXAMPLES = 10_000
SCAN_BATCH = 256  # tf.Examples parsed at once while scanning
IDX_IMAGE_BYTES = IMAGE_HEIGHT * IMAGE_WIDTH


@dataclasses.dataclass
class Reader:
    """One source of labeled examples, read twice in the same order (module docstring)."""

    name: str  # "test split", "train split", "extra data", "feedback"
    path: str
    role: str  # sources.HELD_OUT, TRAINED or NEW
    count: int  # examples, in file order
    scan: Callable[[sources.ScanBuilder], None]  # adds (or skips) each example, in order
    dataset: Callable[[], tf.data.Dataset]  # (features, target) of each example, in order
    detail: dict = dataclasses.field(default_factory=dict)


def _gzip_type(path: str) -> str:
    with open(path, "rb") as f:
        return "GZIP" if f.read(2) == b"\x1f\x8b" else ""


def idx_dataset(images: list[str], labels: list[str]) -> tf.data.Dataset:
    """({'image': float32 [28, 28]}, int64 target) of MNIST-format files (gzipped or not),
    streamed record by record; the files are in order, each images file with its labels."""

    def files(paths, record, header):
        # One dataset over each run of files of the same compression, in order.
        runs: list[tuple[str, list[str]]] = []
        for path in paths:
            kind = _gzip_type(path)
            if runs and runs[-1][0] == kind:
                runs[-1][1].append(path)
            else:
                runs.append((kind, [path]))
        joined = None
        for kind, names in runs:
            part = tf.data.FixedLengthRecordDataset(
                names, record, header_bytes=header, compression_type=kind
            )
            joined = part if joined is None else joined.concatenate(part)
        return joined

    def parse(image, label):
        pixels = tf.reshape(tf.io.decode_raw(image, tf.uint8), [IMAGE_HEIGHT, IMAGE_WIDTH])
        return {INPUT_KEY: normalize_pixels(pixels)}, tf.cast(
            tf.io.decode_raw(label, tf.uint8)[0], tf.int64
        )

    return tf.data.Dataset.zip(
        (
            files(images, IDX_IMAGE_BYTES, data.IMAGES_HEADER_BYTES),
            files(labels, 1, data.LABELS_HEADER_BYTES),
        )
    ).map(parse, num_parallel_calls=tf.data.AUTOTUNE)


def _quantized(image: np.ndarray) -> bytes:
    """An image's content for the digests: its pixels in [0, 1] as 0-255 bytes."""
    return np.rint(np.clip(image, 0.0, 1.0) * 255.0).astype(np.uint8).tobytes()


class ModelData(abc.ABC):
    """One kind of model's data, Estimator and export, for the retrain.

    Attributes:
        kind: "idx", "csv" or "image_folder".
        task: CLASSIFICATION or REGRESSION.
        labels: the classes, in class-id order (labels.txt); () for a regressor.
        base: the base data (the IDX folder, the CSV file, the image folder).
    """

    kind: str
    task: str = CLASSIFICATION
    labels: tuple[str, ...] = ()
    base: str

    # --- sources ----------------------------------------------------------------------------

    @abc.abstractmethod
    def base_readers(self) -> list[Reader]:
        """The base data's test (held out) and train parts."""

    @abc.abstractmethod
    def extra_reader(self, path: str) -> Reader:
        """One `--extra-data` of this kind, all new.

        Raises:
            DataError: not there, or not data of this kind and this model's columns/classes.
        """

    @abc.abstractmethod
    def feature_spec(self) -> dict:
        """The tf.Example features of a feedback example (the label's aside)."""

    @abc.abstractmethod
    def feedback_content(self, features: dict[str, np.ndarray]) -> bytes:
        """A parsed feedback example's content bytes, as the base data's are made."""

    @abc.abstractmethod
    def feedback_features(self, parsed: dict) -> dict:
        """Graph ops: the features the Estimator takes, of a parsed feedback example."""

    def label_spec(self) -> tf.io.FixedLenFeature:
        dtype = tf.int64 if self.task == CLASSIFICATION else tf.float32
        return tf.io.FixedLenFeature([], dtype)

    def readers(self, extra: list[str], selection: FeedbackSelection | None) -> list[Reader]:
        """Every source, in priority order (training/sources.py)."""
        found = self.base_readers() + [self.extra_reader(path) for path in extra]
        if selection is not None:
            found.append(self.feedback_reader(selection))
        return found

    def feedback_reader(self, selection: FeedbackSelection) -> Reader:
        """The feedback store's closed shards (MNIST-format ones first, then the tf.Example
        ones, each in the store's order), the examples the selection does not keep skipped."""
        idx = [(s, k) for s, k in zip(selection.shards, selection.keep, strict=True)
               if s.format == feedback.IDX_FORMAT]  # fmt: skip
        examples = [(s, k) for s, k in zip(selection.shards, selection.keep, strict=True)
                    if s.format == feedback.EXAMPLES_FORMAT]  # fmt: skip
        if idx and self.kind != "idx":
            raise DataError(
                f"{idx[0][0].path}: an MNIST-format shard (28x28 images, of the versions "
                f"before tf.Example) in the store of this {self.kind} model"
            )
        files = [str(shard.path / feedback.EXAMPLES_FILE) for shard, _ in examples]
        spec = {**self.feature_spec(), feedback.LABEL_FEATURE: self.label_spec()}

        def scan(builder: sources.ScanBuilder) -> None:
            for shard, keep in idx:
                try:
                    content = feedback.read_shard(shard.path)
                except feedback.FeedbackFormatError as err:
                    raise DataError(str(err)) from err
                for image, label, kept in zip(content.images, content.labels, keep, strict=True):
                    if kept:
                        builder.add(image.tobytes(), int(label))
                    else:
                        builder.skip()
            for shard, keep in examples:
                self._scan_records(shard, keep, spec, builder)

        def dataset() -> tf.data.Dataset:
            parts = []
            if idx:
                parts.append(
                    idx_dataset(
                        [str(s.path / feedback.IMAGES_FILE) for s, _ in idx],
                        [str(s.path / feedback.LABELS_FILE) for s, _ in idx],
                    )
                )
            if files:

                def parse(record):
                    parsed = tf.io.parse_single_example(record, spec)
                    return self.feedback_features(parsed), parsed[feedback.LABEL_FEATURE]

                parts.append(
                    tf.data.TFRecordDataset(files).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
                )
            if not parts:
                return self._empty()
            return parts[0] if len(parts) == 1 else parts[0].concatenate(parts[1])

        return Reader(
            "feedback",
            str(selection.store),
            sources.NEW,
            sum(len(s) for s in selection.shards),
            scan,
            dataset,
            selection.detail,
        )

    def _empty(self) -> tf.data.Dataset:
        """No example, of this kind's element spec (a store with no closed shard)."""
        spec = self.feature_spec()
        features = {
            name: tf.zeros([0, *feature.shape], feature.dtype) for name, feature in spec.items()
        }
        label = self.label_spec()
        parsed = tf.data.Dataset.from_tensor_slices(
            {**features, feedback.LABEL_FEATURE: tf.zeros([0], label.dtype)}
        )
        return parsed.map(lambda p: (self.feedback_features(p), p[feedback.LABEL_FEATURE]))

    def _scan_records(self, shard, keep, spec, builder: sources.ScanBuilder) -> None:
        """One tf.Example shard's examples: parsed by TensorFlow in batches; a record that
        does not parse is found and named by parsing it alone."""
        path = shard.path / feedback.EXAMPLES_FILE
        batches = (
            tf.data.TFRecordDataset(str(path))
            .batch(SCAN_BATCH)
            .map(lambda records: tf.io.parse_example(records, spec))
        )
        index = 0
        try:
            for batch in batches.as_numpy_iterator():
                labels = batch.pop(feedback.LABEL_FEATURE)
                for i in range(len(labels)):
                    if not keep[index]:
                        builder.skip()
                    else:
                        features = {name: values[i] for name, values in batch.items()}
                        builder.add(
                            self.feedback_content(features),
                            self._feedback_target(labels[i], path, index),
                        )
                    index += 1
        except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as err:
            raise DataError(self._bad_record(path, spec, err)) from err
        if index != len(keep):
            raise DataError(f"{path}: {index} records, its shard says {len(keep)}")

    def _feedback_target(self, label, path: Path, index: int) -> float:
        if self.task == CLASSIFICATION and not 0 <= int(label) < len(self.labels):
            raise DataError(
                f"{path}, record {index}: {feedback.LABEL_FEATURE} is class id {int(label)}; "
                f"this model's classes are 0-{len(self.labels) - 1}"
            )
        return float(label)

    def _bad_record(self, path: Path, spec: dict, err: Exception) -> str:
        """Which record of a shard does not parse, and why, in TensorFlow's words."""
        for index, record in enumerate(tf.data.TFRecordDataset(str(path))):
            try:
                tf.io.parse_single_example(record, spec)
            except tf.errors.InvalidArgumentError as bad:
                words = bad.message.strip().splitlines()[0]
                return (
                    f"{path}, record {index}: not an example of this {self.kind} model's "
                    f"features ({', '.join(sorted(spec))}): {words}"
                )
        return f"{path}: {getattr(err, 'message', err)}"

    # --- the model --------------------------------------------------------------------------

    def to_label(self, target):
        """Graph ops: a target as the label the Estimator takes."""
        return tf.cast(target, tf.int32) if self.task == CLASSIFICATION else target

    def shuffle_buffer(self, count: int) -> int:
        return max(1, min(count, SHUFFLE_EXAMPLES, SHUFFLE_BYTES // self.example_bytes()))

    @abc.abstractmethod
    def example_bytes(self) -> int:
        """About what one example takes in memory (the shuffle buffers are sized by it)."""

    @abc.abstractmethod
    def predictions(self, predictor: SavedModelPredictor, features: dict) -> np.ndarray:
        """A SavedModel's class ids (or values) for a batch of features."""

    def groups(self, features: dict) -> dict[str, np.ndarray]:
        """A regressor's slices of a batch: each categorical column's values."""
        return {}

    def report(self, truth, predicted, groups, **context) -> dict:
        """The candidate's evaluation report on the held-out set."""
        return build_report(truth, predicted, self.labels, **context)

    default_model: str = "cnn"

    @abc.abstractmethod
    def run_params(self, args, max_steps: int, baseline_params: dict) -> dict:
        """The run's params (what its Estimator is built from), as `train` records them.

        Args:
            baseline_params: the serving version's, when the candidate starts from it ({}
                otherwise): what lives in the graph, not the checkpoint, is kept.
        """

    def finish_params(self, params: dict, trained: Callable[[], tf.data.Dataset]) -> None:  # noqa: B027 - most kinds have nothing to fill in
        """Fill in what the trained examples decide (`trained` streams them)."""

    def warm_start(self, checkpoint: str, params: dict, run_dir: Path):
        """WarmStartSettings for every trainable variable, checked first against the
        checkpoint (UsageError naming a variable it lacks or holds in another shape)."""
        estimator = self.estimator(run_dir, params, None, None)
        with tf.Graph().as_default():
            tf.compat.v1.set_random_seed(0)  # only the shapes are read (estimator.py's why)
            receiver = self.receiver_fn()()
            estimator.model_fn(
                receiver.features, None, tf.estimator.ModeKeys.PREDICT, estimator.config
            )
            shapes = {v.op.name: v.shape.as_list() for v in tf.compat.v1.trainable_variables()}
        return finetune.warm_start_settings(checkpoint, ".*", shapes)

    @abc.abstractmethod
    def receiver_fn(self):
        """The export's serving input receiver function."""

    @abc.abstractmethod
    def estimator(self, run_dir: Path, params: dict, args, warm_start):
        """The Estimator of this kind, in run_dir, started from warm_start (or None)."""

    @contextlib.contextmanager
    def staged(
        self,
        estimator,
        run_dir: Path,
        model_name: str,
        build_report: Callable[[Path], dict],
        checkpoint: str,
        warmup,
        write_plots: Callable[[Path, dict], object],
    ) -> Iterator[Path]:
        """The candidate staged as a complete version in run_dir (removed when the block ends
        unless published), with the assets `train` exports for its kind: labels.txt
        (classifiers), evaluation.json (build_report, called with the staged path) and the
        task's plots (write_plots, called with assets.extra and the report)."""
        with publish._staged_saved_model(
            estimator, run_dir, self.receiver_fn(), checkpoint
        ) as staged:
            extra = staged / ASSETS_EXTRA
            if self.labels:
                text = "\n".join(self.labels) + "\n"
                (extra / LABELS_FILE).write_text(text, encoding="utf-8")
            report = build_report(staged)
            (extra / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
            write_plots(extra, report)
            yield staged

    def warmup_images(self, held_out: HeldOut) -> np.ndarray | None:
        return None


# --- the IDX image contract -------------------------------------------------------------------


class IdxData(ModelData):
    """MNIST-format folders: `--data-dir`'s train and test splits, `--extra-data` folders."""

    kind = "idx"

    def __init__(self, data_dir: str, labels: tuple[str, ...]):
        self.base = str(data_dir)
        self.labels = tuple(labels)

    def _reader(self, name: str, folder: str, role: str, splits: list[str], detail=None):
        """Splits of an MNIST-format folder, validated whole once (headers, counts, labels in
        range), then streamed; the scan reads one split's files at a time."""
        found = [data.load_split(folder, split)[0] for split in splits]

        def scan(builder: sources.ScanBuilder) -> None:
            for split in found:
                images = data.read_images(split.images_path)
                labels = data.read_labels(split.labels_path)
                for image, label in zip(images, labels, strict=True):
                    builder.add(image.tobytes(), int(label))

        def dataset():
            return idx_dataset([s.images_path for s in found], [s.labels_path for s in found])

        count = sum(split.count for split in found)
        return Reader(name, str(folder), role, count, scan, dataset, detail or {})

    def base_readers(self) -> list[Reader]:
        return [
            self._reader("test split", self.base, sources.HELD_OUT, ["test"]),
            self._reader("train split", self.base, sources.TRAINED, ["train"]),
        ]

    def extra_reader(self, path: str) -> Reader:
        if not Path(path).is_dir():
            raise DataError(f"--extra-data {path}: folder not found")
        splits = [split for split in data.SPLITS if data.has_split(path, split)]
        if not splits:
            raise DataError(
                f"--extra-data {path}: holds no MNIST-format train- or t10k- images file"
            )
        return self._reader("extra data", path, sources.NEW, splits, {"splits": splits})

    def feature_spec(self) -> dict:
        return {INPUT_KEY: tf.io.FixedLenFeature([IMAGE_HEIGHT, IMAGE_WIDTH], tf.float32)}

    def feedback_content(self, features) -> bytes:
        return _quantized(features[INPUT_KEY])

    def feedback_features(self, parsed) -> dict:
        return {INPUT_KEY: parsed[INPUT_KEY]}

    def example_bytes(self) -> int:
        return IDX_IMAGE_BYTES * 4

    def predictions(self, predictor, features) -> np.ndarray:
        return predictor.run(features[INPUT_KEY], SIGNATURE_NAME)["classes"]

    def run_params(self, args, max_steps, baseline_params) -> dict:
        # The linear and dnn normalizers are graph constants: keep the ones the weights know.
        stats = (baseline_params.get("pixel_mean"), baseline_params.get("pixel_std"))
        return idx_train.model_params(args, args.model, max_steps, stats)

    def finish_params(self, params, trained) -> None:
        if params["pixel_mean"] is None:
            params["pixel_mean"], params["pixel_std"] = _pixel_stats(trained())

    def warm_start(self, checkpoint, params, run_dir):
        # Checked against the model's variables first: a mismatch is a clear error.
        shapes = trainable_variable_shapes(make_estimator(str(run_dir), params))
        return finetune.warm_start_settings(checkpoint, ".*", shapes)

    def receiver_fn(self):
        return publish.serving_input_receiver_fn()

    def estimator(self, run_dir, params, args, warm_start):
        return make_estimator(
            str(run_dir),
            params,
            seed=args.seed,
            save_checkpoints_steps=args.checkpoint_steps,
            warm_start_from=warm_start,
            session_config=determinism.session_config(args.deterministic),
        )

    @contextlib.contextmanager
    def staged(self, estimator, run_dir, model_name, build_report, checkpoint, warmup, write_plots):
        with publish.staged_version(
            estimator, run_dir, model_name, self.labels, build_report, checkpoint, warmup,
            write_extras=write_plots,
        ) as staged:  # fmt: skip
            yield staged

    def warmup_images(self, held_out: HeldOut) -> np.ndarray | None:
        return held_out.first_inputs(max(WARMUP_BATCH_SIZES))[INPUT_KEY]


def _pixel_stats(trained: tf.data.Dataset) -> tuple[float, float]:
    """Mean and standard deviation of the trained images' pixels in [0, 1] (the linear and
    dnn kinds' normalizer), streamed."""
    total = squares = count = 0.0
    for features, _ in trained.batch(1000).as_numpy_iterator():
        pixels = features[INPUT_KEY].astype(np.float64)
        total += pixels.sum()
        squares += (pixels**2).sum()
        count += pixels.size
    if not count:
        return 0.0, 1.0
    mean = total / count
    return round(mean, 6), round(math.sqrt(max(squares / count - mean**2, 0.0)), 6)


# --- CSV files ---------------------------------------------------------------------------------


def _content_of_values(columns, values: list) -> bytes:
    """A row's content: each feature's typed value, in the schema's column order (float32,
    int64, or a string's length and UTF-8 bytes)."""
    parts = []
    for column, value in zip(columns, values, strict=True):
        if column.kind == "float":
            parts.append(struct.pack("<f", value))
        elif column.kind == "int":
            parts.append(struct.pack("<q", value))
        else:
            raw = value if isinstance(value, bytes) else value.encode("utf-8")
            parts.append(struct.pack("<I", len(raw)) + raw)
    return b"".join(parts)


class CsvData(ModelData):
    """A CSV file with a header and a label column (training/tabular_schema.py): the base
    file's rows (every HOLDOUT_EVERY-th held out, the test split), `--extra-data` CSV files
    with the same columns."""

    kind = "csv"
    default_model = "linear"

    def __init__(self, schema: tabular_schema.Schema, receiver: str):
        self.schema = schema
        self.receiver = receiver
        self.base = schema.path
        self.task = schema.task
        self.labels = schema.classes

    def _reader(self, path: str, name: str, role: str, part: bool | None) -> Reader:
        """The rows of a CSV file; part: True = the held-out rows, False = the others, None =
        all of them."""
        schema = self.schema
        header, rows = tabular_schema.read_rows(path)
        if sorted(header) != sorted(schema.header):
            raise DataError(
                f"{path}: its columns are {', '.join(header)}; this model's are "
                f"{', '.join(schema.header)}"
            )
        count = sum(
            1 for i in range(len(rows)) if part is None or tabular_schema.is_holdout(i) == part
        )
        del rows
        columns = schema.columns

        def scan(builder: sources.ScanBuilder) -> None:
            # Checked as it is read: a bad value is named by its line.
            header, rows, lines = tabular_schema.read_rows(path, with_lines=True)
            at = {name: header.index(name) for name in header}
            for i, (row, line) in enumerate(zip(rows, lines, strict=True)):
                if part is not None and tabular_schema.is_holdout(i) != part:
                    continue
                values = [self._value(path, line, c, row[at[c.name]]) for c in columns]
                builder.add(
                    _content_of_values(columns, values),
                    self._target(path, line, row[at[schema.label]]),
                )

        def dataset() -> tf.data.Dataset:
            kinds = {c.name: c.kind for c in columns} | {schema.label: schema.label_kind}
            defaults = [
                tf.constant("", tf.string) if kinds[n] == "string" else tabular.DTYPES[kinds[n]]
                for n in header
            ]
            rows = tf.data.experimental.CsvDataset(path, defaults, header=True).enumerate()
            if part is not None:
                held = tabular_schema.HOLDOUT_EVERY

                def keep(index, _):
                    return tf.equal(tf.equal(index % held, held - 1), part)

                rows = rows.filter(keep)
            return rows.map(lambda _, values: self._example(dict(zip(header, values, strict=True))))

        return Reader(name, str(path), role, count, scan, dataset)

    def _value(self, path, line, column, text: str):
        """A CSV field as its column's type (what TensorFlow's CSV reader makes of it)."""
        if column.kind == "string":
            return text
        fits = tabular_schema.is_integer if column.kind == "int" else tabular_schema.is_number
        if not fits(text):
            shown = repr(text) if text else "an empty value"
            what = "an integer" if column.kind == "int" else "a number"
            raise DataError(
                f"{path}: line {line}, column {column.name!r}: {shown} is not {what} (the "
                f"column is {column.kind})"
            )
        return int(text) if column.kind == "int" else float(np.float32(float(text)))

    def _target(self, path, line, text: str) -> float:
        """The label field as a class id or a value."""
        schema = self.schema
        if schema.task == REGRESSION:
            if not tabular_schema.is_number(text):
                raise DataError(
                    f"{path}: line {line}, label {schema.label!r}: {text!r} is not a number"
                )
            return float(np.float32(float(text)))
        name = text
        if schema.label_kind == "int" and tabular_schema.is_integer(text):
            name = str(int(text))
        if name not in schema.classes:
            raise DataError(
                f"{path}: line {line}, label {schema.label!r}: {text!r} is not one of this "
                f"model's classes ({', '.join(schema.classes)})"
            )
        return float(schema.classes.index(name))

    def _example(self, row: dict):
        """Graph ops: a CSV row's features and target."""
        schema = self.schema
        label = row.pop(schema.label)
        if schema.task == REGRESSION:
            target = tf.cast(label, tf.float32)
        elif schema.label_kind == "string":
            matches = tf.cast(tf.equal(tf.constant(schema.classes), label), tf.int64)
            target = tf.argmax(matches, output_type=tf.int64)
        else:
            target = tf.cast(label, tf.int64)
        return {c.name: row[c.name] for c in schema.columns}, target

    def base_readers(self) -> list[Reader]:
        return [
            self._reader(self.base, "test split", sources.HELD_OUT, True),
            self._reader(self.base, "train split", sources.TRAINED, False),
        ]

    def extra_reader(self, path: str) -> Reader:
        if not Path(path).is_file():
            raise DataError(f"--extra-data {path}: file not found (a CSV file for this model)")
        return self._reader(path, "extra data", sources.NEW, None)

    def feature_spec(self) -> dict:
        return {
            c.name: tf.io.FixedLenFeature([], tabular.DTYPES[c.kind]) for c in self.schema.columns
        }

    def feedback_content(self, features) -> bytes:
        values = [np.asarray(features[c.name]).item() for c in self.schema.columns]
        return _content_of_values(self.schema.columns, values)

    def feedback_features(self, parsed) -> dict:
        return {c.name: parsed[c.name] for c in self.schema.columns}

    def to_label(self, target):
        schema = self.schema
        if schema.task == REGRESSION:
            return target
        if schema.label_kind == "string":
            return tf.gather(tf.constant(schema.classes), target)
        return target

    def example_bytes(self) -> int:
        return 64 * (len(self.schema.columns) + 1)

    def predictions(self, predictor, features) -> np.ndarray:
        features = {c.name: features[c.name] for c in self.schema.columns}
        if self.receiver == "parsing":
            inputs = {
                tabular.EXAMPLES_KEY: np.array(tabular.to_examples(self.schema, features), object)
            }
        else:
            inputs = features
        outputs = predictor.run(inputs, tabular.PREDICT_SIGNATURE)
        key = "class_ids" if self.task == CLASSIFICATION else "predictions"
        return outputs[key].reshape(-1)

    def groups(self, features) -> dict[str, np.ndarray]:
        if self.task != REGRESSION:
            return {}
        return {
            c.name: np.array([_text(v) for v in features[c.name]], object)
            for c in self.schema.columns
            if not c.numeric
        }

    def run_params(self, args, max_steps, baseline_params) -> dict:
        return run_params(args, args.model, max_steps, self.receiver, self.schema.to_json())

    def report(self, truth, predicted, groups, **context) -> dict:
        if self.task == CLASSIFICATION:
            return {"task": self.task, **build_report(truth, predicted, self.labels, **context)}
        return build_regression_report(truth, predicted, groups, task=self.task, **context)

    def estimator(self, run_dir, params, args, warm_start):
        return tabular.make_estimator(self.schema, params, _config(args, run_dir), warm_start)

    def receiver_fn(self):
        return tabular.serving_input_receiver_fn(self.schema, self.receiver)


def _text(value) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


# --- image folders -----------------------------------------------------------------------------


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

    def run_params(self, args, max_steps, baseline_params) -> dict:
        data = {**self.folder.to_json(), "image_size": self.size, "channels": self.channels}
        params = run_params(args, args.model, max_steps, "raw", data)
        return {**params, "num_classes": len(self.labels)}

    def report(self, truth, predicted, groups, **context) -> dict:
        return build_report(truth, predicted, self.labels, task=CLASSIFICATION, **context)

    def estimator(self, run_dir, params, args, warm_start):
        return image_folder.make_estimator(params, _config(args, run_dir), warm_start)

    def receiver_fn(self):
        return image_folder.serving_input_receiver_fn(self.size, self.channels)


def _config(args, run_dir: Path) -> tf.estimator.RunConfig:
    """The run's RunConfig (`train`'s); without args, one that only builds graphs."""
    if args is None:
        return tf.estimator.RunConfig(model_dir=str(run_dir))
    return run_config(args, run_dir)


# --- which kind --------------------------------------------------------------------------------


def model_data(args, report: dict, labels_of_idx: Callable[[], tuple[str, ...]]) -> ModelData:
    """The data of the model being retrained: the serving version's kind (its evaluation
    report's params), or the one --csv / --image-folder / --data-dir names for a first model.

    Raises:
        UsageError: options of another kind than the serving version's, a base file that is
            gone (give it again), or options that contradict the serving version's.
        DataError: the base data is not usable.
    """
    params = report.get("params") or {}
    data = params.get("data")
    recorded = data if isinstance(data, dict) else {}
    if "csv" in recorded or (args.csv and not report):
        return _csv_data(args, recorded, params, bool(report))
    if "image_folder" in recorded or (args.image_folder and not report):
        return _folder_data(args, recorded, bool(report))
    if args.csv or args.image_folder:
        option = "--csv" if args.csv else "--image-folder"
        raise UsageError(
            f"{option}: the serving version was trained on MNIST-format images (--data-dir), "
            f"not a {'CSV file' if args.csv else 'folder of images'}; retrain it on its own "
            "kind of data"
        )
    for option, attribute in (("--label", "label"), ("--task", "task"), ("--receiver", "receiver"),
                              ("--image-size", "image_size"), ("--channels", "channels"),
                              ("--max-vocabulary", "max_vocabulary")):  # fmt: skip
        if getattr(args, attribute) is not None:
            raise UsageError(f"{option} is for --csv or --image-folder models")
    return IdxData(args.data_dir, labels_of_idx())


def _base(given: str | None, recorded: str | None, option: str, exists) -> str:
    path = given or recorded
    if path is None or not exists(Path(path)):
        where = f" on {recorded}, which is not there" if recorded else ""
        raise UsageError(
            f"{option}: the serving version was trained{where}; give its base data again "
            f"with {option}"
        )
    return path


def _csv_data(args, recorded: dict, params: dict, has_baseline: bool) -> CsvData:
    if args.image_folder:
        raise UsageError("--image-folder: the serving version was trained on a CSV file (--csv)")
    if not has_baseline:
        schema = tabular_schema.infer_schema(
            args.csv, args.label or "label", args.task,
            args.max_vocabulary or tabular_schema.DEFAULT_MAX_VOCABULARY,
        )  # fmt: skip
        return CsvData(schema, args.receiver or "raw")
    path = _base(args.csv, recorded.get("csv"), "--csv", Path.is_file)
    header, rows = tabular_schema.read_rows(path)
    expected = sorted([c["name"] for c in recorded["columns"]] + [recorded["label"]])
    if sorted(header) != expected:
        raise DataError(
            f"{path}: its columns are {', '.join(header)}; the serving version was trained on "
            f"{', '.join(expected)}"
        )
    for option, attribute, key in (("--label", "label", "label"), ("--task", "task", "task")):
        given = getattr(args, attribute)
        if given is not None and given != recorded.get(key):
            raise UsageError(
                f"{option} {given}: the serving version's is {recorded.get(key)!r}; leave "
                f"{option} out to keep it"
            )
    receiver = params.get("receiver", "raw")
    if args.receiver is not None and args.receiver != receiver:
        raise UsageError(f"--receiver {args.receiver}: the serving version's is {receiver}")
    columns = tuple(
        tabular_schema.Column(**{**c, "vocabulary": c["vocabulary"] and tuple(c["vocabulary"])})
        for c in recorded["columns"]
    )
    train_rows = sum(1 for i in range(len(rows)) if not tabular_schema.is_holdout(i))
    schema = tabular_schema.Schema(
        path=str(path),
        header=tuple(header),
        label=recorded["label"],
        label_kind=recorded["label_kind"],
        task=recorded["task"],
        columns=columns,
        classes=tuple(recorded.get("classes") or ()),
        train_rows=train_rows,
        holdout_rows=len(rows) - train_rows,
    )
    return CsvData(schema, receiver)


def _folder_data(args, recorded: dict, has_baseline: bool) -> FolderData:
    if args.csv:
        raise UsageError("--csv: the serving version was trained on a folder of images")
    path = args.image_folder if not has_baseline else _base(
        args.image_folder, recorded.get("image_folder"), "--image-folder", Path.is_dir
    )  # fmt: skip
    folder = image_folder.scan_image_folder(path)
    size = recorded.get("image_size") or args.image_size or image_folder.DEFAULT_IMAGE_SIZE
    channels = recorded.get("channels") or args.channels or image_folder.DEFAULT_CHANNELS
    for option, given, kept in (("--image-size", args.image_size, size),
                                ("--channels", args.channels, channels)):  # fmt: skip
        if given is not None and given != kept:
            raise UsageError(f"{option} {given}: the serving version takes {kept}")
    if has_baseline and tuple(recorded.get("classes") or ()) != folder.classes:
        raise DataError(
            f"{path}: its classes are {', '.join(folder.classes)}; the serving version's are "
            f"{', '.join(recorded.get('classes') or ())}"
        )
    return FolderData(folder, size, channels)


# --- the selections, the training input and the held-out set ----------------------------------


def write_selections(run_dir: Path, readers: list[Reader], selections) -> list[Path]:
    """Each source's byte per example (sources.assemble's), where the input reads them."""
    folder = run_dir / "data"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for number, (reader, selection) in enumerate(zip(readers, selections, strict=True)):
        if len(selection) != reader.count:
            raise AssertionError(
                f"{reader.name}: {len(selection)} decisions, {reader.count} examples"
            )
        path = folder / f"select-{number}.bin"
        path.write_bytes(np.asarray(selection, np.uint8).tobytes())
        paths.append(path)
    return paths


def _decision(byte):
    return tf.io.decode_raw(byte, tf.uint8)[0]


def _without_code(features, target, code):
    return features, target


def _selected(reader: Reader, path: Path, codes: tuple[int, ...]) -> tf.data.Dataset:
    """(features, target, code) of a source's examples whose byte is one of `codes`."""
    decisions = tf.data.FixedLengthRecordDataset(str(path), 1).map(_decision)
    wanted = tf.constant(codes, tf.uint8)

    def chosen(example, code):
        return tf.reduce_any(tf.equal(code, wanted))

    def flat(example, code):
        features, target = example
        return features, target, code

    return tf.data.Dataset.zip((reader.dataset(), decisions)).filter(chosen).map(flat)


def training_input(
    model: ModelData, readers, paths, trained: list[int], batch_size: int, seed: int | None
) -> tf.data.Dataset:
    """Every source's trained examples, each shuffled within its buffer and repeated, the
    sources sampled in proportion to what they give; batched."""
    # In a scope of its own: sample_from_datasets makes a top-level op named "logits", and a
    # pre-made DNN's Keras layer of that name would then take "logits_1" for its variables,
    # which no checkpoint of the model has.
    with tf.name_scope("retrain_input"):
        parts, weights = [], []
        for reader, path, count in zip(readers, paths, trained, strict=True):
            if count:
                part = _selected(reader, path, (sources.TRAIN,)).map(_without_code)
                parts.append(part.shuffle(model.shuffle_buffer(count), seed=seed).repeat())
                weights.append(count / sum(trained))
        mixed = (
            parts[0]
            if len(parts) == 1
            else tf.data.Dataset.sample_from_datasets(parts, weights=weights, seed=seed)
        )

        def labeled(features, target):
            return features, model.to_label(target)

        return (
            mixed.map(labeled, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(batch_size)
            .prefetch(tf.data.AUTOTUNE)
        )


def trained_examples(readers, paths) -> tf.data.Dataset:
    """(features, target) of every trained example, source after source, once."""
    found = None
    for reader, path in zip(readers, paths, strict=True):
        part = _selected(reader, path, (sources.TRAIN,)).map(_without_code)
        found = part if found is None else found.concatenate(part)
    return found


def held_out_input(readers, paths) -> tf.data.Dataset:
    """(features, target, code) of every held-out example, source after source."""
    found = None
    for reader, path in zip(readers, paths, strict=True):
        part = _selected(reader, path, sources.HELD_CODES)
        found = part if found is None else found.concatenate(part)
    return found


def evaluation_input(model: ModelData, readers, paths) -> tf.data.Dataset:
    """The held-out set as the Estimator's evaluation takes it: (features, label), batched."""

    def labeled(features, target, code):
        return features, model.to_label(target)

    return held_out_input(readers, paths).map(labeled).batch(EVAL_BATCH_SIZE)


@dataclasses.dataclass
class HeldOut:
    """The held-out set both models are judged on, streamed batch by batch; what is kept
    whole is a few numbers an example: its truth, slice and categorical values."""

    model: ModelData
    batches: Callable[[], Iterator[tuple[dict, np.ndarray, np.ndarray]]]
    truth: np.ndarray  # class ids, or values
    slices: dict[str, np.ndarray]  # slice name -> mask over the examples
    groups: dict[str, np.ndarray]  # a regressor's categorical column -> each example's value

    def __len__(self) -> int:
        return len(self.truth)

    def predict(self, predictor: SavedModelPredictor) -> np.ndarray:
        """A SavedModel's class ids (or values) for every held-out example, in order."""
        parts = [self.model.predictions(predictor, features) for features, _, _ in self.batches()]
        return np.concatenate(parts) if parts else np.zeros(0)

    def first_inputs(self, count: int) -> dict:
        for features, _, _ in self.batches():
            return {name: value[:count] for name, value in features.items()}
        return {}


def held_out_set(model: ModelData, readers, paths) -> HeldOut:
    """The held-out set: read once here for its truth and slices (a few numbers an
    example); its features are streamed again for each model that predicts it."""

    def batches():
        return held_out_input(readers, paths).batch(EVAL_BATCH_SIZE).as_numpy_iterator()

    truths, codes = [], []
    groups: dict[str, list[np.ndarray]] = {}
    for features, targets, batch_codes in batches():
        truths.append(targets)
        codes.append(batch_codes)
        for column, values in model.groups(features).items():
            groups.setdefault(column, []).append(values)
    truth = np.concatenate(truths) if truths else np.zeros(0)
    code = np.concatenate(codes) if codes else np.zeros(0, np.uint8)
    slices = {
        sources.TEST_SLICE: np.isin(code, (sources.HELD_TEST, sources.HELD_REFERENCE)),
        sources.NEW_SLICE: code == sources.HELD_NEW,
        sources.REFERENCE_SLICE: code == sources.HELD_REFERENCE,
    }
    return HeldOut(
        model,
        batches,
        truth,
        slices,
        {column: np.concatenate(parts) for column, parts in groups.items()},
    )


def steps_per_epoch(trained: int, batch_size: int) -> int:
    return max(1, math.ceil(trained / batch_size))
