"""Pre-made Estimators on feature columns over a CSV file: input, model, export, report.

From a validated `Schema` (training/tabular_schema.py):
- feature columns: `numeric_column` (float32, or int64 where the data is integer) normalized
  by a `normalizer_fn` with the training split's mean and deviation; string columns as
  `categorical_column_with_vocabulary_list` (the training vocabulary plus one OOV bucket) or,
  past the vocabulary threshold, `categorical_column_with_hash_bucket`; the DNN side sees
  them through `indicator_column` / `embedding_column`;
- the CSV read inside the graph by `tf.data.experimental.CsvDataset`, split by row position;
- `LinearClassifier`, `DNNClassifier`, `DNNLinearCombinedClassifier` or their regressors,
  with `label_vocabulary` for string labels;
- serving receivers: raw (one placeholder per feature, the column's dtype, shape [None]) or
  tf.Example parsing (`make_parse_example_spec` of the columns), with TF's own signatures
  (`predict`; with parsing also `classification` / `regression` and `serving_default`);
- the export's evaluation report, computed from the staged SavedModel on the held-out rows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from artifact.contract import ASSETS_EXTRA, LABELS_FILE, REPORT_FILE
from training.baselines import keras_optimizer
from training.evaluation_report import build_regression_report, build_report
from training.plots import write_export_plots
from training.publish import export_version
from training.tabular_schema import HOLDOUT_EVERY, Schema, holdout_rows

TABULAR_KINDS = ("linear", "dnn", "dnn_linear")
RECEIVERS = ("raw", "parsing")
PREDICT_SIGNATURE = "predict"
EXAMPLES_KEY = "examples"  # the parsing receiver's input (TF's name)
DTYPES = {"float": tf.float32, "int": tf.int64, "string": tf.string}
EMBEDDING_DIMENSION = 8
SHUFFLE_BUFFER = 10_000
_OP_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-/]")


def _normalizer(mean: float, std: float):
    def normalize(x):
        return (tf.cast(x, tf.float32) - mean) / std

    return normalize


def base_columns(schema: Schema) -> list:
    """One feature column per CSV feature: numeric or categorical, in file order."""
    columns = []
    for c in schema.columns:
        if c.numeric:
            if c.mean is None or c.std is None:
                raise ValueError(
                    f"the numeric column {c.name!r} has no mean and std to normalize by"
                )
            columns.append(
                tf.feature_column.numeric_column(
                    c.name, dtype=DTYPES[c.kind], normalizer_fn=_normalizer(c.mean, c.std)
                )
            )
        elif c.vocabulary is not None:
            columns.append(
                tf.feature_column.categorical_column_with_vocabulary_list(
                    c.name, list(c.vocabulary), num_oov_buckets=1
                )
            )
        else:
            columns.append(
                tf.feature_column.categorical_column_with_hash_bucket(c.name, c.hash_buckets)
            )
    return columns


def dnn_columns(schema: Schema) -> list:
    """The DNN side's dense columns: numerics as they are, categoricals one-hot (vocabulary)
    or embedded (hashed)."""
    dense = []
    for column, c in zip(base_columns(schema), schema.columns, strict=True):
        if c.numeric:
            dense.append(column)
        elif c.vocabulary is not None:
            dense.append(tf.feature_column.indicator_column(column))
        else:
            dense.append(tf.feature_column.embedding_column(column, EMBEDDING_DIMENSION))
    return dense


def feature_spec(schema: Schema) -> dict:
    """The tf.Example parsing spec of the features (the label excluded)."""
    return tf.feature_column.make_parse_example_spec(base_columns(schema))


def make_estimator(
    schema: Schema, params: dict, config: tf.estimator.RunConfig, warm_start_from=None
):
    """The pre-made Estimator of params['model'] for the schema's task.

    params: model (a TABULAR_KINDS name), hidden_units (dnn, dnn_linear), learning_rate and
    decay_steps (Adam, as the image kinds'), as `train` records them in params.json.
    warm_start_from: tf.estimator.WarmStartSettings (or a checkpoint) to start from (a
    retrain's candidate starts from the serving version's checkpoint).
    """
    kind = params["model"]

    def optimizer():
        # Called in each graph the Estimator builds: an optimizer belongs to one graph.
        return keras_optimizer(params)

    if schema.task == "classification":
        options: dict[str, Any] = {"n_classes": schema.n_classes}
        if schema.label_kind == "string":
            options["label_vocabulary"] = list(schema.classes)
        linear, dnn, combined = (
            tf.estimator.LinearClassifier,
            tf.estimator.DNNClassifier,
            tf.estimator.DNNLinearCombinedClassifier,
        )
    else:
        options = {}
        linear, dnn, combined = (
            tf.estimator.LinearRegressor,
            tf.estimator.DNNRegressor,
            tf.estimator.DNNLinearCombinedRegressor,
        )
    options["warm_start_from"] = warm_start_from
    if kind == "linear":
        return linear(
            feature_columns=base_columns(schema), optimizer=optimizer, config=config, **options
        )
    if kind == "dnn":
        return dnn(
            hidden_units=list(params["hidden_units"]),
            feature_columns=dnn_columns(schema),
            optimizer=optimizer,
            config=config,
            **options,
        )
    if kind == "dnn_linear":
        return combined(
            linear_feature_columns=base_columns(schema),
            linear_optimizer=optimizer,
            dnn_feature_columns=dnn_columns(schema),
            dnn_hidden_units=list(params["hidden_units"]),
            dnn_optimizer=optimizer,
            config=config,
            **options,
        )
    raise ValueError(f"not a tabular kind: {kind!r}; known: {', '.join(TABULAR_KINDS)}")


def dataset(schema: Schema, holdout: bool):
    """({feature: scalar}, label) per row of one split, read from the file by graph ops."""
    defaults = [
        tf.constant("", tf.string) if kind == "string" else DTYPES[kind] for kind in schema.kinds()
    ]
    rows = tf.data.experimental.CsvDataset(schema.path, defaults, header=True)
    names = schema.header

    def split(index, _):
        # is_holdout's rule, in the graph.
        held_out = tf.equal(index % HOLDOUT_EVERY, HOLDOUT_EVERY - 1)
        return held_out if holdout else tf.logical_not(held_out)

    def to_example(_, values):
        features = dict(zip(names, values, strict=True))
        return features, features.pop(schema.label)

    return rows.enumerate().filter(split).map(to_example)


def train_input_fn(schema: Schema, batch_size: int, seed: int | None = None):
    """The training rows: cached, shuffled each epoch, batched, repeated, prefetched."""
    return (
        dataset(schema, holdout=False)
        .cache()
        .shuffle(min(schema.train_rows, SHUFFLE_BUFFER), seed=seed)
        .batch(batch_size)
        .repeat()
        .prefetch(tf.data.AUTOTUNE)
    )


def eval_input_fn(schema: Schema, batch_size: int):
    """The held-out rows, once, in order."""
    return dataset(schema, holdout=True).batch(batch_size)


def _op_name(name: str) -> str:
    safe = _OP_NAME_UNSAFE.sub("_", name)
    return safe if safe[:1].isalnum() else f"f_{safe}"


def serving_input_receiver_fn(schema: Schema, receiver: str):
    """raw: one placeholder per feature, named as its column, of its dtype, shape [None];
    parsing: serialized tf.Examples in `examples`, parsed with the columns' spec."""
    if receiver == "parsing":
        return tf.estimator.export.build_parsing_serving_input_receiver_fn(feature_spec(schema))
    if receiver != "raw":
        raise ValueError(f"unknown receiver {receiver!r}; known: {', '.join(RECEIVERS)}")
    # A bare placeholder fails in TF2's eager mode; only its dtype and shape are used.
    with tf.Graph().as_default():
        features = {
            c.name: tf.compat.v1.placeholder(DTYPES[c.kind], [None], name=_op_name(c.name))
            for c in schema.columns
        }
    return tf.estimator.export.build_raw_serving_input_receiver_fn(features)


# --- rows as model input ----------------------------------------------------------------------


def feature_arrays(schema: Schema, header, rows) -> dict[str, np.ndarray]:
    """The rows' feature values as arrays of the receiver's dtypes, keyed by column."""
    arrays = {}
    for c in schema.columns:
        values = [row[header.index(c.name)] for row in rows]
        if c.kind == "float":
            arrays[c.name] = np.array([float(v) for v in values], np.float32)
        elif c.kind == "int":
            arrays[c.name] = np.array([int(v) for v in values], np.int64)
        else:
            arrays[c.name] = np.array([v.encode() for v in values], object)
    return arrays


def to_examples(schema: Schema, features: dict[str, np.ndarray]) -> list[bytes]:
    """Serialized tf.Examples of feature arrays (feature_arrays'), for the parsing receiver."""
    count = len(next(iter(features.values())))
    examples = []
    for i in range(count):
        feature = {}
        for c in schema.columns:
            value = features[c.name][i]
            if c.kind == "float":
                feature[c.name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
            elif c.kind == "int":
                feature[c.name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
            else:
                feature[c.name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        example = tf.train.Example(features=tf.train.Features(feature=feature))
        examples.append(example.SerializeToString())
    return examples


def saved_model_predict(
    version_path: str | Path, schema: Schema, features: dict[str, np.ndarray], receiver: str
) -> dict[str, np.ndarray]:
    """The `predict` signature's outputs of an exported version for feature arrays."""
    loaded = tf.saved_model.load(str(version_path))
    signature = loaded.signatures[PREDICT_SIGNATURE]
    if receiver == "parsing":
        inputs = {EXAMPLES_KEY: tf.constant(to_examples(schema, features))}
    else:
        inputs = {name: tf.constant(values) for name, values in features.items()}
    return {key: value.numpy() for key, value in signature(**inputs).items()}


# --- the export -------------------------------------------------------------------------------


def evaluation_report(schema: Schema, outputs: dict, header, rows, **context) -> dict:
    """The task's report on held-out rows from the `predict` outputs.

    classification: accuracy, per-class precision/recall/support, confusion matrix (by class
    id, labels.txt's order); regression: RMSE, MAE, the largest error, and the same per value
    of each categorical column (vocabulary columns; hashed ones too, by their raw value).
    """
    if schema.task == "classification":
        labels = [row[header.index(schema.label)] for row in rows]
        truth = [schema.classes.index(v if schema.label_kind == "string" else str(int(v)))
                 for v in labels]  # fmt: skip
        predicted = outputs["class_ids"].reshape(-1)
        return {
            "task": schema.task,
            **build_report(truth, predicted, schema.classes, **context),
        }
    slices = {
        c.name: [row[header.index(c.name)] for row in rows] for c in schema.columns if not c.numeric
    }
    truth, predicted = regression_points(schema, outputs, header, rows)
    return build_regression_report(truth, predicted, slices, task=schema.task, **context)


def regression_points(schema: Schema, outputs: dict, header, rows):
    """A regressor's (true values, predictions) on rows, as float arrays (its plots draw
    them); (None, None) for a classifier."""
    if schema.task != "regression":
        return None, None
    truth = np.array([float(row[header.index(schema.label)]) for row in rows])
    return truth, outputs["predictions"].reshape(-1)


def export_tabular(
    estimator, schema: Schema, export_dir, receiver: str, context: dict
) -> tuple[Path | str, dict]:
    """Export a new version through the receiver, with labels.txt (classifiers), the
    evaluation report on the held-out rows made by the staged SavedModel itself, and the
    task's plots (training/plots.py).

    Returns:
        (the version directory, its report).
    """
    header, rows = holdout_rows(schema.path)
    reports = []

    def write_assets(staged: Path) -> None:
        outputs = saved_model_predict(
            staged, schema, feature_arrays(schema, header, rows), receiver
        )
        report = evaluation_report(schema, outputs, header, rows, receiver=receiver, **context)
        extra = staged / ASSETS_EXTRA
        if schema.task == "classification":
            (extra / LABELS_FILE).write_text("\n".join(schema.classes) + "\n", encoding="utf-8")
        (extra / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        truth, predicted = regression_points(schema, outputs, header, rows)
        write_export_plots(extra, report, context.get("model_dir"), truth, predicted)
        reports.append(report)

    version = export_version(
        estimator, export_dir, serving_input_receiver_fn(schema, receiver), write_assets
    )
    return version, reports[0]
