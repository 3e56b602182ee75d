"""PNG plots, drawn headless: an export's confusion matrix and learning curves, and compare's
chart of the kinds side by side.

matplotlib's object API (`Figure`) draws with its Agg renderer and never touches pyplot's
global state or a GUI backend, so the plots work in a container, a CI runner or a thread.
The learning curves come from the run's own TensorBoard event files, read with TensorBoard's
event reader: the training summaries in the model dir (loss and accuracy of the batches) and
the Estimator's evaluations in its `eval/` folder (loss and accuracy on the test split).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import tensorflow as tf
from matplotlib.figure import Figure
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.util import tensor_util

from artifact.contract import CONFUSION_MATRIX_PLOT, LEARNING_CURVES_PLOT

LOSS_TAG = "loss"
ACCURACY_TAG = "accuracy"
CURVE_TAGS = (LOSS_TAG, ACCURACY_TAG)
# The Estimator writes its evaluations' summaries to this folder of the model dir.
EVAL_SUBDIR = "eval"
EVENT_FILES = "events.out.tfevents.*"
DPI = 100
TRAIN_COLOR = "#1f77b4"
EVAL_COLOR = "#d62728"

Points = list[tuple[int, float]]


def _scalar(value) -> float | None:
    """A summary value's number: TF1's simple_value, or a scalar tensor (TF2 and TensorBoard's
    reader, which moves simple values into tensors)."""
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if value.HasField("tensor"):
        array = tensor_util.make_ndarray(value.tensor)
        if array.size == 1 and array.dtype.kind == "f":
            return float(array.reshape(()))
    return None


def read_scalars(directory: str | Path, tags: Iterable[str] = CURVE_TAGS) -> dict[str, Points]:
    """tag -> [(step, value)] from the event files directly in a folder, oldest first.

    A run resumed from an earlier checkpoint writes its steps again: as TensorBoard does
    (EventAccumulator's purge of orphaned data), a step at or below one already read drops the
    points from that step on, so each curve is the history that led to the final weights.
    """
    wanted = set(tags)
    found: dict[str, Points] = {tag: [] for tag in wanted}
    # Event file names start with the time they were opened: name order is write order.
    for path in sorted(tf.io.gfile.glob(str(Path(directory) / EVENT_FILES))):
        for event in EventFileLoader(path).Load():
            for value in event.summary.value:
                if value.tag not in wanted:
                    continue
                number = _scalar(value)
                if number is None:
                    continue
                points = found[value.tag]
                while points and points[-1][0] >= event.step:
                    points.pop()
                points.append((int(event.step), number))
    return {tag: points for tag, points in found.items() if points}


def learning_curves(model_dir: str | Path) -> dict[str, dict[str, Points]]:
    """{"train": {tag: points}, "eval": {tag: points}} for loss and accuracy of a model dir."""
    return {
        "train": read_scalars(model_dir),
        "eval": read_scalars(Path(model_dir) / EVAL_SUBDIR),
    }


def _save(figure: Figure, path: Path) -> Path:
    figure.savefig(path, format="png", dpi=DPI, bbox_inches="tight")
    return path


def plot_learning_curves(curves: dict[str, dict[str, Points]], path: Path, title: str) -> bool:
    """Loss and accuracy against step, training batches and evaluations, as a PNG.

    Returns:
        False (and writes nothing) when the curves hold no point at all.
    """
    if not any(curves.get(split) for split in ("train", "eval")):
        return False
    figure = Figure(figsize=(9, 3.6), layout="constrained")
    axes = figure.subplots(1, 2)
    series = (
        ("train", "training batches", TRAIN_COLOR, "-"),
        ("eval", "test split (evaluation)", EVAL_COLOR, "--"),
    )
    for ax, tag, name in zip(axes, CURVE_TAGS, ("Loss", "Accuracy"), strict=True):
        for split, label, color, style in series:
            points = curves.get(split, {}).get(tag)
            if points:
                steps, values = zip(*points, strict=True)
                ax.plot(steps, values, style, marker="o", markersize=4, color=color, label=label)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if tag == ACCURACY_TAG:
            ax.set_ylim(0, 1)
        if ax.lines:
            ax.legend(loc="best", fontsize="small")
        else:
            ax.text(0.5, 0.5, "no summaries", ha="center", va="center", transform=ax.transAxes)
    figure.suptitle(title)
    _save(figure, path)
    return True


def plot_confusion_matrix(report: dict, labels: Sequence[str], path: Path) -> Path:
    """The report's confusion matrix as a heatmap of counts (rows: true class), as a PNG.

    The colour is each cell's share of its true class, so a rare class reads as clearly as a
    common one; the number is the count.
    """
    confusion = np.asarray(report["confusion_matrix"], np.int64)
    support = confusion.sum(axis=1, keepdims=True)
    shares = confusion / np.maximum(support, 1)
    figure = Figure(figsize=(7, 6.2), layout="constrained")
    ax = figure.subplots()
    image = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    ticks = np.arange(len(labels))
    ax.set_xticks(ticks, labels, rotation=45, ha="right", rotation_mode="anchor")
    ax.set_yticks(ticks, labels)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    for (row, column), count in np.ndenumerate(confusion):
        color = "white" if shares[row, column] > 0.5 else "black"
        ax.text(column, row, str(count), ha="center", va="center", color=color, fontsize=8)
    figure.colorbar(image, ax=ax, shrink=0.8, label="share of the true class")
    ax.set_title(
        f"Confusion matrix: accuracy {report['accuracy']:.4f} on "
        f"{report['examples']:,} {report.get('split', 'test')} images"
    )
    return _save(figure, path)


def write_export_plots(extra_dir: Path, report: dict, model_dir: str | Path | None) -> list[Path]:
    """Write an export's plots beside its evaluation report (in the staged assets.extra/).

    Args:
        extra_dir: the version's assets.extra folder.
        report: its evaluation report (training/evaluation.py's build_report).
        model_dir: the run's model dir, whose event files give the learning curves; None, or
            a dir without summaries, writes no learning curves.
    Returns:
        The files written.
    """
    labels = [row["label"] for row in report["per_class"]]
    written = [plot_confusion_matrix(report, labels, extra_dir / CONFUSION_MATRIX_PLOT)]
    if model_dir is not None:
        kind = report.get("params", {}).get("model", "model")
        title = f"Learning curves: {kind}, step {report.get('global_step', '?')}"
        path = extra_dir / LEARNING_CURVES_PLOT
        if plot_learning_curves(learning_curves(model_dir), path, title):
            written.append(path)
    return written


def plot_comparison(rows: Sequence[dict], labels: Sequence[str], path: Path, title: str) -> Path:
    """compare's results side by side: test accuracy per kind, and each class's recall per
    kind, as a PNG.

    Args:
        rows: compare's result rows (model, accuracy, recall per class), in display order.
    """
    kinds = [row["model"] for row in rows]
    figure = Figure(figsize=(12, 4.2), layout="constrained")
    left, right = figure.subplots(1, 2, width_ratios=(1, 3))
    colors = [f"C{i}" for i in range(len(rows))]
    bars = left.bar(kinds, [row["accuracy"] for row in rows], color=colors)
    left.bar_label(bars, fmt="%.3f", fontsize="small")
    left.set_ylim(0, 1.08)
    left.set_title("Test accuracy")
    left.grid(axis="y", alpha=0.3)
    width = 0.8 / max(len(rows), 1)
    classes = np.arange(len(labels))
    for i, row in enumerate(rows):
        offset = (i - (len(rows) - 1) / 2) * width
        right.bar(classes + offset, row["recall"], width, color=colors[i], label=row["model"])
    right.set_xticks(classes, labels, rotation=30, ha="right", rotation_mode="anchor")
    right.set_ylim(0, 1.08)
    right.set_title("Recall per class")
    right.grid(axis="y", alpha=0.3)
    right.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    figure.suptitle(title)
    return _save(figure, path)
