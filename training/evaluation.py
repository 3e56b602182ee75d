"""The evaluation report: accuracy, per-class precision and recall, confusion matrix."""

from __future__ import annotations

import datetime as dt

import numpy as np

from artifact.contract import NUM_CLASSES


def build_report(true_classes, predicted_classes, labels, **context) -> dict:
    """A JSON-ready report comparing predictions with the truth.

    Args:
        true_classes, predicted_classes: integer arrays of equal length.
        labels: the NUM_CLASSES class names.
        context: extra fields to record (data set, steps, model dir, ...).
    """
    true_classes = np.asarray(true_classes, np.int64)
    predicted_classes = np.asarray(predicted_classes, np.int64)
    confusion = np.zeros((NUM_CLASSES, NUM_CLASSES), np.int64)
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
        for k in range(NUM_CLASSES)
    ]
    return {
        "accuracy": round(float(hits.sum() / max(len(true_classes), 1)), 4),
        "examples": int(len(true_classes)),
        "per_class": per_class,
        "confusion_matrix": confusion.tolist(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **context,
    }


def format_report(report: dict) -> str:
    """The report as a few lines for a terminal."""
    lines = [f"accuracy {report['accuracy']:.4f} on {report['examples']} examples"]
    lines.append(f"{'class':<14}{'precision':>10}{'recall':>8}{'support':>9}")
    for row in report["per_class"]:
        lines.append(
            f"{row['label']:<14}{row['precision']:>10.4f}{row['recall']:>8.4f}{row['support']:>9}"
        )
    return "\n".join(lines)
