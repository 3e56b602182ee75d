"""The evaluation reports: for classifiers accuracy, per-class precision and recall and the
confusion matrix; for regressors RMSE, MAE and the largest error, overall and over slices."""

from __future__ import annotations

import datetime as dt

import numpy as np


def build_report(true_classes, predicted_classes, labels, **context) -> dict:
    """A JSON-ready report comparing predictions with the truth.

    Args:
        true_classes, predicted_classes: integer arrays of equal length.
        labels: the class names, in class-id order (10 for the image contract).
        context: extra fields to record (data set, steps, model dir, ...).
    """
    true_classes = np.asarray(true_classes, np.int64)
    predicted_classes = np.asarray(predicted_classes, np.int64)
    num_classes = len(labels)
    confusion = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(confusion, (true_classes, predicted_classes), 1)
    support = confusion.sum(axis=1)
    predicted = confusion.sum(axis=0)
    hits = np.diag(confusion)
    per_class = [
        {
            "class_id": k,
            "label": labels[k],
            "precision": round(float(hits[k] / predicted[k]), 4) if predicted[k] else 0.0,
            "recall": round(float(hits[k] / support[k]), 4) if support[k] else 0.0,
            "support": int(support[k]),
        }
        for k in range(num_classes)
    ]
    return {
        "accuracy": round(float(hits.sum() / max(len(true_classes), 1)), 4),
        "examples": int(len(true_classes)),
        "per_class": per_class,
        "confusion_matrix": confusion.tolist(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **context,
    }


def _errors(truth: np.ndarray, predicted: np.ndarray) -> dict:
    errors = predicted - truth
    return {
        "examples": int(len(truth)),
        "rmse": round(float(np.sqrt(np.mean(errors**2))), 6),
        "mae": round(float(np.mean(np.abs(errors))), 6),
        "max_error": round(float(np.max(np.abs(errors))), 6),
    }


def build_regression_report(truth, predicted, slices: dict | None = None, **context) -> dict:
    """A JSON-ready regression report: RMSE, MAE and the largest absolute error, overall and
    per slice.

    Args:
        truth, predicted: float arrays of equal, non-zero length.
        slices: column name -> the rows' values of that column (categorical columns); each
            value's rows get their own errors, worst RMSE first.
        context: extra fields to record.
    """
    truth = np.asarray(truth, np.float64)
    predicted = np.asarray(predicted, np.float64)
    by_slice = {}
    for column, values in (slices or {}).items():
        values = np.asarray(values, object)
        rows = [
            {"value": str(value), **_errors(truth[values == value], predicted[values == value])}
            for value in sorted(set(values.tolist()))
        ]
        by_slice[column] = sorted(rows, key=lambda row: -row["rmse"])
    return {
        **_errors(truth, predicted),
        "label_mean": round(float(truth.mean()), 6),
        "label_std": round(float(truth.std()), 6),
        "slices": by_slice,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **context,
    }


def is_regression(report: dict) -> bool:
    """Whether a report is a regressor's (build_regression_report's) rather than a
    classifier's."""
    return "rmse" in report


def worst_slice(report: dict) -> dict | None:
    """A regression report's largest slice error: {"column", "value", "rmse", "examples"} of
    the slice with the highest RMSE over every categorical column; None without slices."""
    rows = [
        {"column": column, **row}
        for column, column_rows in report.get("slices", {}).items()
        for row in column_rows
    ]
    if not rows:
        return None
    worst = max(rows, key=lambda row: row["rmse"])
    return {key: worst[key] for key in ("column", "value", "rmse", "examples")}


def format_report(report: dict) -> str:
    """The report as a few lines for a terminal."""
    if is_regression(report):
        lines = [
            f"rmse {report['rmse']:.4f}, mae {report['mae']:.4f}, largest error "
            f"{report['max_error']:.4f} on {report['examples']} examples"
        ]
        for column, rows in report["slices"].items():
            worst = rows[0]
            lines.append(
                f"{column}: worst slice {worst['value']!r} rmse {worst['rmse']:.4f} "
                f"({worst['examples']} examples)"
            )
        return "\n".join(lines)
    lines = [f"accuracy {report['accuracy']:.4f} on {report['examples']} examples"]
    lines.append(f"{'class':<14}{'precision':>10}{'recall':>8}{'support':>9}")
    for row in report["per_class"]:
        lines.append(
            f"{row['label']:<14}{row['precision']:>10.4f}{row['recall']:>8.4f}{row['support']:>9}"
        )
    return "\n".join(lines)
