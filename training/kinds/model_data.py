"""What a retrain reads, trains and judges of a model, whatever its kind of data: the
interface (ModelData) that each kind implements (training/kinds/idx.py, csv.py,
image_folder.py).

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
    normalize_pixels,
)
from artifact.saved_model import SavedModelPredictor
from training import (
    data,
    finetune,
    publish,
    sources,
)
from training.configs import ModelOptions, RunOptions
from training.errors import DataError
from training.evaluation_report import build_report
from training.feedback_source import FeedbackSelection
from training.kinds.prepared_training import run_config

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
    def run_params(
        self, options: ModelOptions, model: str, max_steps: int, baseline_params: dict
    ) -> dict:
        """The run's params (what its Estimator is built from), as `train` records them.

        Args:
            options: the retrain's budget, layers and schedule (its RetrainConfig).
            model: the model kind (--model, or the serving version's).
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
    def estimator(self, run_dir: Path, params: dict, options: RunOptions | None, warm_start):
        """The Estimator of this kind, in run_dir, started from warm_start (or None);
        without options (a retrain's seed, checkpoints and evaluations), one that only builds
        graphs."""

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


def estimator_config(options: RunOptions | None, run_dir: Path) -> tf.estimator.RunConfig:
    """The run's RunConfig (`train`'s); without options, one that only builds graphs."""
    if options is None:
        return tf.estimator.RunConfig(model_dir=str(run_dir))
    return run_config(options, run_dir)
