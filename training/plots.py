"""PNG plots, drawn headless: an export's plots for its task (a classifier's confusion matrix, a
regressor's predicted against true and residuals; every task's learning curves), and compare's
chart of the kinds side by side.

matplotlib's object API (`Figure`) draws with its Agg renderer and never touches pyplot's
global state or a GUI backend, so the plots work in a container, a CI runner or a thread.
The learning curves come from the run's own TensorBoard event files, read with TensorBoard's
event reader: the training summaries in the model dir (loss and accuracy of the batches) and
the Estimator's evaluations in its `eval/` folder (loss and accuracy on the test split or the
held-out rows). A regressor has no accuracy: its second panel is the RMSE, the root of the
pre-made regression head's loss (the batch's mean squared error) and of its evaluations'
`average_loss` (the evaluation's mean squared error), the report's own metric. Each PNG names
what it shows in its `Title` text chunk, so a reader can tell them apart without a model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import tensorflow as tf
from matplotlib.figure import Figure
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.util import tensor_util

from artifact.contract import (
    CONFUSION_MATRIX_PLOT,
    LEARNING_CURVES_PLOT,
    PREDICTED_VS_TRUE_PLOT,
    RESIDUALS_PLOT,
)
from training.evaluation_report import is_regression

LOSS_TAG = "loss"
ACCURACY_TAG = "accuracy"
CURVE_TAGS = (LOSS_TAG, ACCURACY_TAG)
# A pre-made regression head's evaluation: the mean squared error over the whole evaluation.
AVERAGE_LOSS_TAG = "average_loss"
RMSE = "rmse"  # the curve derived from the two losses (not a summary tag)
REGRESSION_TAGS = (LOSS_TAG, AVERAGE_LOSS_TAG)
# The PNGs' Title text chunk, by plot.
TITLES = {
    CONFUSION_MATRIX_PLOT: "Confusion matrix",
    LEARNING_CURVES_PLOT: "Learning curves",
    PREDICTED_VS_TRUE_PLOT: "Predicted against true",
    RESIDUALS_PLOT: "Residuals against predicted",
}
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


def _roots(points: Points) -> Points:
    return [(step, math.sqrt(value)) for step, value in points if value >= 0]


def learning_curves(
    model_dir: str | Path, task: str = "classification"
) -> dict[str, dict[str, Points]]:
    """{"train": {tag: points}, "eval": {tag: points}} of a model dir: loss and accuracy for a
    classifier; loss and RMSE (from the losses, see the module's docstring) for a regressor."""
    if task != "regression":
        return {
            "train": read_scalars(model_dir),
            "eval": read_scalars(Path(model_dir) / EVAL_SUBDIR),
        }
    train = read_scalars(model_dir, REGRESSION_TAGS)
    evaluated = read_scalars(Path(model_dir) / EVAL_SUBDIR, REGRESSION_TAGS)
    curves: dict[str, dict[str, Points]] = {"train": {}, "eval": {}}
    sources = (("train", train, LOSS_TAG), ("eval", evaluated, AVERAGE_LOSS_TAG))
    for split, found, squared in sources:
        if LOSS_TAG in found:
            curves[split][LOSS_TAG] = found[LOSS_TAG]
        if squared in found:
            curves[split][RMSE] = _roots(found[squared])
    return curves


def _save(figure: Figure, path: Path, title: str) -> Path:
    figure.savefig(path, format="png", dpi=DPI, bbox_inches="tight", metadata={"Title": title})
    return path


def plot_learning_curves(
    curves: dict[str, dict[str, Points]],
    path: Path,
    title: str,
    task: str = "classification",
    evaluated_on: str = "test split",
) -> bool:
    """Loss and accuracy (a regressor: loss and RMSE) against step, training batches and
    evaluations, as a PNG.

    Args:
        evaluated_on: what the evaluations ran on, for the legend.
    Returns:
        False (and writes nothing) when the curves hold no point at all.
    """
    if not any(curves.get(split) for split in ("train", "eval")):
        return False
    figure = Figure(figsize=(9, 3.6), layout="constrained")
    axes = figure.subplots(1, 2)
    series = (
        ("train", "training batches", TRAIN_COLOR, "-"),
        ("eval", f"{evaluated_on} (evaluation)", EVAL_COLOR, "--"),
    )
    panels = (
        ((LOSS_TAG, "Loss (mean squared error)"), (RMSE, "RMSE"))
        if task == "regression"
        else ((LOSS_TAG, "Loss"), (ACCURACY_TAG, "Accuracy"))
    )
    for ax, (tag, name) in zip(axes, panels, strict=True):
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
        elif (
            task == "regression"
            and ax.lines
            and min(min(line.get_ydata()) for line in ax.lines) > 0
        ):
            ax.set_yscale("log")  # squared errors fall by orders of magnitude
        if ax.lines:
            ax.legend(loc="best", fontsize="small")
        else:
            ax.text(0.5, 0.5, "no summaries", ha="center", va="center", transform=ax.transAxes)
    figure.suptitle(title)
    _save(figure, path, TITLES[LEARNING_CURVES_PLOT])
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
        f"{report['examples']:,} {_evaluated_on(report)} examples"
    )
    return _save(figure, path, TITLES[CONFUSION_MATRIX_PLOT])


def _evaluated_on(report: dict) -> str:
    return {"holdout": "held-out"}.get(report.get("split", "test"), report.get("split", "test"))


def _errors_title(report: dict) -> str:
    return (
        f"rmse {report['rmse']:.4g}, mae {report['mae']:.4g} on {report['examples']:,} "
        f"{_evaluated_on(report)} examples"
    )


def plot_predicted_vs_true(truth, predicted, report: dict, path: Path) -> Path:
    """A regressor's predictions against the true values, one point per example, with the
    line where they are equal, as a PNG."""
    truth, predicted = np.asarray(truth, np.float64), np.asarray(predicted, np.float64)
    figure = Figure(figsize=(6.4, 6), layout="constrained")
    ax = figure.subplots()
    low = float(min(truth.min(), predicted.min()))
    high = float(max(truth.max(), predicted.max()))
    margin = (high - low) * 0.05 or 1.0
    ax.plot([low - margin, high + margin], [low - margin, high + margin], "--", color="0.5",
            label="predicted = true")  # fmt: skip
    ax.scatter(truth, predicted, s=18, alpha=0.7, color=TRAIN_COLOR, label="examples")
    ax.set_xlim(low - margin, high + margin)
    ax.set_ylim(low - margin, high + margin)
    ax.set_aspect("equal")
    _label_axes(ax, "true value", "predicted value", "upper left")
    ax.set_title(f"Predicted against true: {_errors_title(report)}")
    return _save(figure, path, TITLES[PREDICTED_VS_TRUE_PLOT])


def _label_axes(ax, x_label: str, y_label: str, legend_at: str = "best") -> None:
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.grid(alpha=0.3)
    ax.legend(loc=legend_at, fontsize="small")


def plot_residuals(truth, predicted, report: dict, path: Path) -> Path:
    """A regressor's residuals (predicted - true) against its predictions, with zero and
    plus or minus the RMSE marked, as a PNG: a trend or a funnel shows what the RMSE hides."""
    truth, predicted = np.asarray(truth, np.float64), np.asarray(predicted, np.float64)
    residuals = predicted - truth
    figure = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = figure.subplots()
    ax.axhline(0.0, color="0.3", lw=1)
    for sign in (-1, 1):
        ax.axhline(sign * report["rmse"], ls="--", color=EVAL_COLOR, lw=1,
                   label="± rmse" if sign > 0 else None)  # fmt: skip
    ax.scatter(predicted, residuals, s=18, alpha=0.7, color=TRAIN_COLOR)
    _label_axes(ax, "predicted value", "residual (predicted - true)")
    ax.set_title(f"Residuals: {_errors_title(report)}")
    return _save(figure, path, TITLES[RESIDUALS_PLOT])


def write_export_plots(
    extra_dir: Path,
    report: dict,
    model_dir: str | Path | None,
    truth=None,
    predicted=None,
) -> list[Path]:
    """Write an export's plots for its task beside its evaluation report (in the staged
    assets.extra/): a classifier's confusion matrix, or a regressor's predicted against true
    and residuals; and the learning curves.

    Args:
        extra_dir: the version's assets.extra folder.
        report: its evaluation report (training/evaluation_report.py's build_report or
            build_regression_report).
        model_dir: the run's model dir, whose event files give the learning curves; None, or
            a dir without summaries, writes no learning curves.
        truth, predicted: a regressor's true values and predictions on the report's examples
            (the report holds only their errors); not used for a classifier.
    Returns:
        The files written.
    Raises:
        ValueError: a regression report without truth and predictions.
    """
    task = "regression" if is_regression(report) else "classification"
    if task == "regression":
        if truth is None or predicted is None:
            raise ValueError("a regressor's plots need its true values and predictions")
        written = [
            plot_predicted_vs_true(truth, predicted, report, extra_dir / PREDICTED_VS_TRUE_PLOT),
            plot_residuals(truth, predicted, report, extra_dir / RESIDUALS_PLOT),
        ]
    else:
        labels = [row["label"] for row in report["per_class"]]
        written = [plot_confusion_matrix(report, labels, extra_dir / CONFUSION_MATRIX_PLOT)]
    if model_dir is not None:
        kind = report.get("params", {}).get("model", "model")
        title = f"Learning curves: {kind}, step {report.get('global_step', '?')}"
        path = extra_dir / LEARNING_CURVES_PLOT
        curves = learning_curves(model_dir, task)
        if plot_learning_curves(curves, path, title, task, _evaluated_on(report) + " examples"):
            written.append(path)
    return written


def plot_comparison(
    rows: Sequence[dict],
    labels: Sequence[str],
    path: Path,
    title: str,
    accuracy_name: str = "Test accuracy",
) -> Path:
    """compare's results side by side: accuracy per kind, and each class's recall per kind,
    as a PNG.

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
    left.set_title(accuracy_name)
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
    return _save(figure, path, "Comparison")


def plot_regression_comparison(rows: Sequence[dict], path: Path, title: str) -> Path:
    """compare's regressors side by side: RMSE, MAE and the largest slice error (a slice's
    RMSE) per kind, lower is better, as a PNG.

    Args:
        rows: compare's result rows (model, rmse, mae, worst_slice), in display order.
    """
    kinds = [row["model"] for row in rows]
    metrics = (
        ("rmse", "RMSE", lambda row: row["rmse"]),
        ("mae", "MAE", lambda row: row["mae"]),
        ("slice", "largest slice RMSE",
         lambda row: row["worst_slice"]["rmse"] if row["worst_slice"] else 0.0),
    )  # fmt: skip
    figure = Figure(figsize=(8, 4.2), layout="constrained")
    ax = figure.subplots()
    width = 0.8 / len(metrics)
    positions = np.arange(len(kinds))
    for i, (_, name, value) in enumerate(metrics):
        offset = (i - (len(metrics) - 1) / 2) * width
        bars = ax.bar(positions + offset, [value(row) for row in rows], width, label=name)
        ax.bar_label(bars, fmt="%.3g", fontsize="small")
    ax.set_xticks(positions, kinds)
    ax.set_ylabel("error (the label's units), lower is better")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    figure.suptitle(title)
    return _save(figure, path, "Comparison")
