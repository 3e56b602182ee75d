"""Blessing a retrained candidate, as TFX's Evaluator does: thresholds, a verdict, a report.

The candidate and the baseline (the version serving now) are evaluated on the same held-out
data. For a classifier their confusion matrices come in, and every metric is computed here
from the counts, so "not worse" compares exact numbers, not rounded ones; for a regressor,
their predictions and the truth, from which the errors are computed here.

Thresholds follow the task, each with TFX's direction (MetricDirection): higher is better for
a classifier's accuracy and recall, lower is better for a regressor's errors.
- classifier, value: `min_accuracy`, the candidate's overall accuracy at least this;
  change, against the baseline: `max_accuracy_drop` (default 0: not worse), checked overall,
  on the test split alone and on the reference slice (a fixed half of the test split,
  training/sources.py's REFERENCE_RULE, which no feedback can touch), so new data whose
  held-out slice carries the same mistakes as its training part (mislabeled feedback, a
  flood from one token) cannot buy its way past the reference data;
  `max_class_recall_drop`, each class's recall overall.
- regressor, value: `max_rmse`, the candidate's RMSE at most this; change: `max_rmse_increase`
  (default 0: not worse) overall, on the test split and on the reference slice as above;
  `max_mae_increase`, the MAE overall; `max_slice_error_increase`, the largest RMSE of a
  slice (the rows of one value of a categorical column).
With no baseline (no version serving yet) only the value thresholds apply, and with none set
the first candidate is blessed (TFX rubber-stamps the first model).

No TensorFlow here: the tables are tested in the fast tier.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import numpy as np

OVERALL = "overall"
TEST_SLICE = "test split"
NEW_SLICE = "new data"
REFERENCE_SLICE = "reference"
CLASSIFICATION, REGRESSION = "classification", "regression"
# TFX's MetricDirection.
HIGHER_IS_BETTER, LOWER_IS_BETTER = "higher_is_better", "lower_is_better"
MAX_SLICE_RMSE = "max_slice_rmse"
FORMAT_VERSION = 1
# Float rounding only (0.79 - 0.8 is -0.010000000000000009): one example of a million held-out
# ones moves a metric by 1e-6, far above this.
TOLERANCE = 1e-9


_CLASSIFIER_THRESHOLDS = ("min_accuracy", "max_accuracy_drop", "max_class_recall_drop")
_REGRESSOR_THRESHOLDS = (
    "max_rmse",
    "max_rmse_increase",
    "max_mae_increase",
    "max_slice_error_increase",
)


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """What the candidate must reach to be blessed (None: not checked); those of its task
    apply."""

    min_accuracy: float | None = None
    max_accuracy_drop: float = 0.0
    max_class_recall_drop: float | None = None
    max_rmse: float | None = None
    max_rmse_increase: float = 0.0
    max_mae_increase: float | None = None
    max_slice_error_increase: float | None = None
    task: str = CLASSIFICATION

    def as_json(self) -> dict:
        names = _CLASSIFIER_THRESHOLDS if self.task == CLASSIFICATION else _REGRESSOR_THRESHOLDS
        return {name: getattr(self, name) for name in names}


@dataclasses.dataclass(frozen=True)
class Check:
    """One threshold applied: the number checked, the bound it must reach, the result."""

    metric: str
    kind: str  # "value" or "change"
    bound: float  # the checked number must be >= this (higher is better) or <= (lower)
    checked: float  # the candidate's value, or its change against the baseline
    candidate: float
    baseline: float | None
    direction: str = HIGHER_IS_BETTER

    @property
    def passed(self) -> bool:
        if self.direction == LOWER_IS_BETTER:
            return self.checked <= self.bound + TOLERANCE
        return self.checked >= self.bound - TOLERANCE

    @property
    def short_by(self) -> float:
        """How far the checked number misses its bound (0 when it passes)."""
        if self.passed:
            return 0.0
        return abs(self.checked - self.bound)

    def describe(self) -> str:
        """'accuracy: change -0.0123 < -0.0000 (...): short by 0.0123', 'rmse: change +0.0200
        > +0.0000 (...): over by 0.0200', or the pass."""
        what = "value" if self.kind == "value" else "change"
        lower = self.direction == LOWER_IS_BETTER
        op = ("<=" if lower else ">=") if self.passed else (">" if lower else "<")
        line = f"{self.metric}: {what} {self.checked:+.4f} {op} {self.bound:+.4f}"
        if self.kind == "change":
            line += f" (candidate {self.candidate:.4f}, baseline {self.baseline:.4f})"
        missed = "over by" if lower else "short by"
        return line if self.passed else f"{line}: {missed} {self.short_by:.4f}"

    def as_json(self) -> dict:
        return {
            "metric": self.metric,
            "kind": self.kind,
            "direction": self.direction,
            "bound": self.bound,
            "checked": self.checked,
            "candidate": self.candidate,
            "baseline": self.baseline,
            "passed": self.passed,
            "short_by": self.short_by,
        }


def metrics(confusions: dict[str, np.ndarray], labels: tuple[str, ...]) -> dict[str, float]:
    """Flat metric name -> value from confusion matrices [true, predicted] per slice.

    `accuracy` is the overall slice's, `accuracy/<slice>` the others'; `recall/<label>` and
    `precision/<label>` are overall, and left out for a class with no example (recall) or no
    prediction (precision), where they mean nothing.
    """
    overall = np.asarray(confusions[OVERALL], np.int64)
    result = {"accuracy": _accuracy(overall)}
    for name, confusion in confusions.items():
        if name != OVERALL and np.asarray(confusion).sum():
            result[f"accuracy/{name}"] = _accuracy(np.asarray(confusion, np.int64))
    support, predicted, hits = overall.sum(axis=1), overall.sum(axis=0), np.diag(overall)
    for k, label in enumerate(labels):
        if support[k]:
            result[f"recall/{label}"] = float(hits[k] / support[k])
    for k, label in enumerate(labels):
        if predicted[k]:
            result[f"precision/{label}"] = float(hits[k] / predicted[k])
    return result


def _accuracy(confusion: np.ndarray) -> float:
    total = confusion.sum()
    return float(np.trace(confusion) / total) if total else 0.0


def regression_metrics(
    truth: np.ndarray,
    predicted: np.ndarray,
    slices: dict[str, np.ndarray],
    groups: dict[str, np.ndarray] | None = None,
) -> dict[str, float]:
    """Flat metric name -> value of a regressor's predictions against the truth.

    `rmse` and `mae` overall, `rmse/<slice>` for each slice mask with examples, and for each
    categorical column of `groups` (column -> each example's value) `rmse/<column>=<value>`
    per value, the largest of which is `max_slice_rmse`.
    """
    errors = np.asarray(predicted, np.float64) - np.asarray(truth, np.float64)

    def rmse(mask) -> float:
        return float(np.sqrt(np.mean(errors[mask] ** 2)))

    result = {"rmse": rmse(slice(None)), "mae": float(np.mean(np.abs(errors)))}
    for name, mask in slices.items():
        if np.asarray(mask).any():
            result[f"rmse/{name}"] = rmse(np.asarray(mask))
    by_value = {}
    for column, values in (groups or {}).items():
        values = np.asarray(values, object)
        for value in sorted(set(values.tolist()), key=str):
            by_value[f"rmse/{column}={value}"] = rmse(values == value)
    if by_value:
        result[MAX_SLICE_RMSE] = max(by_value.values())
        result.update(by_value)
    return result


def checks(
    candidate: dict[str, float], baseline: dict[str, float] | None, thresholds: Thresholds
) -> list[Check]:
    """Every threshold that applies, in a fixed order: value, then changes (the main metric
    overall, on the test split and the reference slice; then the others)."""
    if thresholds.task == REGRESSION:
        return _regression_checks(candidate, baseline, thresholds)
    found = []
    if thresholds.min_accuracy is not None:
        value = candidate["accuracy"]
        found.append(Check("accuracy", "value", thresholds.min_accuracy, value, value, None))
    if baseline is None:
        return found
    for metric in ("accuracy", f"accuracy/{TEST_SLICE}", f"accuracy/{REFERENCE_SLICE}"):
        if metric in candidate and metric in baseline:
            found.append(_change(metric, candidate, baseline, thresholds.max_accuracy_drop))
    if thresholds.max_class_recall_drop is not None:
        for metric in candidate:
            if metric.startswith("recall/") and metric in baseline:
                found.append(_change(metric, candidate, baseline, thresholds.max_class_recall_drop))
    return found


def _regression_checks(
    candidate: dict[str, float], baseline: dict[str, float] | None, thresholds: Thresholds
) -> list[Check]:
    found = []
    if thresholds.max_rmse is not None:
        value = candidate["rmse"]
        found.append(
            Check("rmse", "value", thresholds.max_rmse, value, value, None, LOWER_IS_BETTER)
        )
    if baseline is None:
        return found
    increases: list[tuple[str, float | None]] = [
        (metric, thresholds.max_rmse_increase)
        for metric in ("rmse", f"rmse/{TEST_SLICE}", f"rmse/{REFERENCE_SLICE}")
    ]
    increases += [
        ("mae", thresholds.max_mae_increase),
        (MAX_SLICE_RMSE, thresholds.max_slice_error_increase),
    ]
    for metric, increase in increases:
        if increase is not None and metric in candidate and metric in baseline:
            found.append(_change(metric, candidate, baseline, increase, LOWER_IS_BETTER))
    return found


def _change(
    metric: str, candidate: dict, baseline: dict, allowed: float, direction=HIGHER_IS_BETTER
) -> Check:
    """A change threshold: at most `allowed` worse than the baseline, in the direction."""
    return Check(
        metric,
        "change",
        allowed if direction == LOWER_IS_BETTER else -allowed,
        candidate[metric] - baseline[metric],
        candidate[metric],
        baseline[metric],
        direction,
    )


@dataclasses.dataclass(frozen=True)
class Blessing:
    """The verdict and everything it was made of."""

    candidate: dict[str, float]
    baseline: dict[str, float] | None
    thresholds: Thresholds
    checks: tuple[Check, ...]

    @property
    def blessed(self) -> bool:
        return all(check.passed for check in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [check for check in self.checks if not check.passed]


def judge(
    candidate: dict[str, float], baseline: dict[str, float] | None, thresholds: Thresholds
) -> Blessing:
    """Apply the thresholds to the candidate's (and the baseline's) metrics."""
    return Blessing(candidate, baseline, thresholds, tuple(checks(candidate, baseline, thresholds)))


def blessing_json(blessing: Blessing, **context) -> dict:
    """blessing.json: the verdict, every metric side by side, thresholds, checks, context.

    `candidate` and `baseline` map each metric's name to its value (the service's page shows
    them side by side); `failed` says which threshold failed by how much, in words; context
    adds the versions, the runs, the data (sources, counts, hashes) and what was published.
    """
    return {
        "format": FORMAT_VERSION,
        "blessed": blessing.blessed,
        "task": blessing.thresholds.task,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "candidate": {k: round(v, 6) for k, v in blessing.candidate.items()},
        "baseline": (
            None
            if blessing.baseline is None
            else {k: round(v, 6) for k, v in blessing.baseline.items()}
        ),
        "thresholds": blessing.thresholds.as_json(),
        "checks": [check.as_json() for check in blessing.checks],
        "failed": [check.describe() for check in blessing.failed],
        **context,
    }


def format_blessing(blessing: Blessing) -> str:
    """The metrics side by side with the thresholds that apply to them, and the verdict."""
    by_metric: dict[str, list[Check]] = {}
    for check in blessing.checks:
        by_metric.setdefault(check.metric, []).append(check)
    baseline = blessing.baseline or {}
    rows = [("metric", "candidate", "baseline", "change", "threshold", "result")]
    for metric, value in blessing.candidate.items():
        before = baseline.get(metric)
        applied = by_metric.get(metric, [])
        rows.append(
            (
                metric,
                f"{value:.4f}",
                "-" if before is None else f"{before:.4f}",
                "-" if before is None else f"{value - before:+.4f}",
                "; ".join(_bound_text(c) for c in applied) or "-",
                "; ".join("ok" if c.passed else f"FAILED by {c.short_by:.4f}" for c in applied),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) if i < 4 else cell
            for i, cell in enumerate(row)
        ).rstrip()
        for row in rows
    ]
    if blessing.baseline is None:
        lines.append("No version serves yet: only the value thresholds apply.")
    if blessing.blessed:
        lines.append(f"Blessed: {len(blessing.checks)} threshold(s) passed.")
    else:
        lines.append(f"Not blessed: {len(blessing.failed)} threshold(s) failed:")
        lines.extend(f"  {check.describe()}" for check in blessing.failed)
    return "\n".join(lines)


def _bound_text(check: Check) -> str:
    op = "<=" if check.direction == LOWER_IS_BETTER else ">="
    return f"{'value' if check.kind == 'value' else 'change'} {op} {check.bound:+.4f}"


def format_sources(sources: list[dict]) -> str:
    """How many examples came from where: read, duplicates dropped, held out, trained on."""
    header = ("source", "read", "duplicates", "conflicts", "held out", "trained")
    keys = ("read", "duplicates", "label_conflicts", "held_out", "trained")
    rows = [header] + [(s["source"], *(f"{s[k]:,}" for k in keys)) for s in sources]
    totals = ("total", *(f"{sum(s[k] for s in sources):,}" for k in keys))
    rows.append(totals)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row))
        for row in rows
    )
