"""CSV files (`--csv`): pre-made Estimators on feature columns (training/tabular.py,
training/tabular_schema.py), and what a retrain reads of them."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import tensorflow as tf

from artifact.saved_model import SavedModelPredictor
from training import (
    exported_model,
    sources,
    tabular,
    tabular_schema,
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
from training.evaluation_report import build_regression_report, build_report
from training.kinds.base import DataKind, base_path, given_path
from training.kinds.model_data import (
    CLASSIFICATION,
    REGRESSION,
    ModelData,
    Reader,
    estimator_config,
)
from training.kinds.prepared_comparison import compare_prepared
from training.kinds.prepared_training import Prepared, run_params, train_and_report
from training.runs import EVAL_BATCH_SIZE


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

    def run_params(
        self, options: ModelOptions, model: str, max_steps: int, baseline_params: dict
    ) -> dict:
        return run_params(options, model, max_steps, self.receiver, self.schema.to_json())

    def report(self, truth, predicted, groups, **context) -> dict:
        if self.task == CLASSIFICATION:
            return {"task": self.task, **build_report(truth, predicted, self.labels, **context)}
        return build_regression_report(truth, predicted, groups, task=self.task, **context)

    def estimator(self, run_dir, params, options: RunOptions | None, warm_start):
        return tabular.make_estimator(
            self.schema, params, estimator_config(options, run_dir), warm_start
        )

    def receiver_fn(self):
        return tabular.serving_input_receiver_fn(self.schema, self.receiver)


def _text(value) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _csv_data(
    options: DataOptions, recorded: dict, params: dict, has_baseline: bool, others
) -> CsvData:
    for other in others:
        if other.given(options):
            raise UsageError(
                f"{other.option}: the serving version was trained on a CSV file (--csv)"
            )
    if not has_baseline:
        schema = tabular_schema.infer_schema(
            given_path(options.csv, "--csv"), options.label or "label", options.task,
            options.max_vocabulary or tabular_schema.DEFAULT_MAX_VOCABULARY,
        )  # fmt: skip
        return CsvData(schema, options.receiver or "raw")
    path = base_path(options.csv, recorded.get("csv"), "--csv", Path.is_file)
    header, rows = tabular_schema.read_rows(path)
    expected = sorted([c["name"] for c in recorded["columns"]] + [recorded["label"]])
    if sorted(header) != expected:
        raise DataError(
            f"{path}: its columns are {', '.join(header)}; the serving version was trained on "
            f"{', '.join(expected)}"
        )
    for option, given, key in (("--label", options.label, "label"),
                               ("--task", options.task, "task")):  # fmt: skip
        if given is not None and given != recorded.get(key):
            raise UsageError(
                f"{option} {given}: the serving version's is {recorded.get(key)!r}; leave "
                f"{option} out to keep it"
            )
    receiver = params.get("receiver", "raw")
    if options.receiver is not None and options.receiver != receiver:
        raise UsageError(f"--receiver {options.receiver}: the serving version's is {receiver}")
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


class CsvKind(DataKind):
    """A CSV file with a header and a label column: linear, dnn or dnn_linear pre-made
    Estimators (training/tabular.py)."""

    name = "csv"
    option = "--csv"
    attribute = "csv"
    model_kinds = tabular.TABULAR_KINDS
    default_model = "linear"
    only_options = {
        "--label": "label",
        "--task": "task",
        "--max-vocabulary": "max_vocabulary",
        "--receiver": "receiver",
    }
    location_keys = ("csv",)
    noun = "CSV file"

    @property
    def models_text(self) -> str:
        return ", ".join(self.model_kinds)

    def default_folders(self, source) -> tuple[str, str]:
        name = Path(source).stem
        return f"runs/{name}", f"models/{name}"

    def prepare(self, config: TrainConfig) -> Prepared:
        """The CSV file read and checked; --label, --max-vocabulary and --receiver defaulted."""
        source = given_path(config.csv, self.option)
        schema = tabular_schema.infer_schema(
            source,
            config.label or "label",
            config.task,
            config.max_vocabulary or tabular_schema.DEFAULT_MAX_VOCABULARY,
        )
        receiver = config.receiver or "raw"
        return Prepared(
            count=schema.train_rows,
            data=schema.to_json(),
            what=f"{schema.train_rows:,} rows of {config.csv} ({schema.task}, label "
            f"{schema.label!r})",
            extra_params={},
            estimator=lambda params, run: tabular.make_estimator(schema, params, run),
            train_input=lambda: tabular.train_input_fn(schema, config.batch_size, config.seed),
            eval_input=lambda: tabular.eval_input_fn(schema, EVAL_BATCH_SIZE),
            export=lambda estimator, export_dir, context: tabular.export_tabular(
                estimator, schema, export_dir, receiver, context
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
        return _csv_data(options, recorded, params, has_baseline, others)

    def takes(self, version) -> bool:
        return isinstance(version, exported_model.TabularVersion)

    def evaluate_export(self, config: EvaluateConfig, version) -> dict:
        """Every row of --csv (the label column --label's, or the version's)."""
        if not config.csv:
            raise UsageError(
                f"{version.path} is a model of CSV rows (it takes {version.inputs_text()}): "
                f"evaluate it with --csv FILE holding those columns and the label column "
                f"{(config.label or version.label)!r}"
            )
        if config.label:
            version = dataclasses.replace(version, label=config.label)
        rows = exported_model.read_csv_for(version, config.csv, with_label=True)
        predictor = SavedModelPredictor(version.path)
        inputs = exported_model.model_inputs(version, rows)
        outputs = exported_model.run_batched(predictor, version.signature, inputs, EVAL_BATCH_SIZE)
        return tabular.evaluation_report(
            rows.schema, outputs, rows.header, rows.rows, csv=str(config.csv),
            receiver=version.receiver, saved_model=str(version.path), split="all",
        )  # fmt: skip


CSV = CsvKind()
