"""Blessing: TFX-style value and change thresholds on exact metrics, higher is better for a
classifier's, lower for a regressor's; the table, the report. No TensorFlow (the fast tier)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from training.blessing import (
    LOWER_IS_BETTER,
    MAX_SLICE_RMSE,
    NEW_SLICE,
    OVERALL,
    REFERENCE_SLICE,
    TEST_SLICE,
    Thresholds,
    blessing_json,
    format_blessing,
    format_sources,
    judge,
    metrics,
    regression_metrics,
)

LABELS = tuple("abcdefghij")


def confusion(hits: list[int], support: int = 10) -> np.ndarray:
    """A confusion matrix where class k has `support` examples and hits[k] of them right
    (the misses go to the next class)."""
    matrix = np.zeros((10, 10), np.int64)
    for k, right in enumerate(hits):
        matrix[k, k] = right
        matrix[k, (k + 1) % 10] = support - right
    return matrix


def slices(overall_hits, test_hits=None, reference_hits=None) -> dict[str, np.ndarray]:
    test = confusion(test_hits if test_hits is not None else overall_hits)
    found = {OVERALL: confusion(overall_hits), TEST_SLICE: test, NEW_SLICE: np.zeros((10, 10))}
    if reference_hits is not None:
        found[REFERENCE_SLICE] = confusion(reference_hits)
    return found


def test_metrics_are_exact_and_leave_out_what_means_nothing():
    matrix = confusion([7] * 9 + [0], support=3 * 3)
    matrix[9] = 0  # class j has no example
    matrix[:, 0] = 0  # and nothing is predicted as class a (its 7 hits gone too)
    found = metrics({OVERALL: matrix, NEW_SLICE: np.zeros((10, 10))}, LABELS)
    assert found["accuracy"] == 56 / 74  # exact: from the counts, not rounded
    assert "recall/j" not in found and "accuracy/new data" not in found
    assert found["recall/a"] == 0.0 and found["recall/b"] == 7 / 9
    assert "precision/a" not in found and found["precision/b"] == 7 / 9


# Each case: candidate hits per class, baseline hits (None: no baseline), thresholds,
# expected verdict, the checks that fail.
CASES = [
    pytest.param([8] * 10, [8] * 10, Thresholds(), True, [], id="equal-is-not-worse"),
    pytest.param([8] * 9 + [7], [8] * 10, Thresholds(), False, ["accuracy", "accuracy/test split"], id="one-image-worse-fails-at-drop-0"),
    pytest.param([8] * 9 + [7], [8] * 10, Thresholds(max_accuracy_drop=0.01), True, [], id="within-the-allowed-drop"),
    pytest.param([9] * 9 + [4], [8] * 10, Thresholds(max_class_recall_drop=0.3), False, ["recall/j"], id="a-class-recall-drop"),
    pytest.param([9] * 9 + [4], [8] * 10, Thresholds(), True, [], id="recall-not-checked-by-default"),
    pytest.param([5] * 10, None, Thresholds(), True, [], id="first-model-rubber-stamped"),
    pytest.param([5] * 10, None, Thresholds(min_accuracy=0.6), False, ["accuracy"], id="first-model-value-threshold"),
    pytest.param([9] * 10, [5] * 10, Thresholds(min_accuracy=0.95), False, ["accuracy"], id="better-but-under-the-value"),
]  # fmt: skip


@pytest.mark.parametrize("candidate, baseline, thresholds, blessed, failing", CASES)
def test_thresholds(candidate, baseline, thresholds, blessed, failing):
    verdict = judge(
        metrics(slices(candidate), LABELS),
        None if baseline is None else metrics(slices(baseline), LABELS),
        thresholds,
    )
    assert verdict.blessed is blessed
    assert [check.metric for check in verdict.failed] == failing


def test_the_test_split_is_judged_on_its_own():
    """Poisoned new data can raise the overall accuracy while the test split falls."""
    candidate = metrics(slices([9] * 10, test_hits=[5] * 10), LABELS)
    baseline = metrics(slices([8] * 10, test_hits=[8] * 10), LABELS)
    verdict = judge(candidate, baseline, Thresholds())
    assert not verdict.blessed
    (failed,) = verdict.failed
    assert failed.metric == "accuracy/test split"
    assert failed.short_by == pytest.approx(0.3)
    assert failed.describe() == (
        "accuracy/test split: change -0.3000 < -0.0000 (candidate 0.5000, baseline 0.8000): "
        "short by 0.3000"
    )


def test_the_reference_slice_is_judged_on_its_own():
    """A flood's held-out part lifts the overall accuracy and even the test split's (the
    flood's images happened to land there in an older store): the reference slice decides."""
    candidate = metrics(slices([9] * 10, test_hits=[9] * 10, reference_hits=[4] * 10), LABELS)
    baseline = metrics(slices([8] * 10, test_hits=[8] * 10, reference_hits=[6] * 10), LABELS)
    verdict = judge(candidate, baseline, Thresholds(max_accuracy_drop=0.1))
    (failed,) = verdict.failed
    assert failed.metric == f"accuracy/{REFERENCE_SLICE}"
    assert failed.short_by == pytest.approx(0.1)


def test_the_table_shows_every_metric_side_by_side_and_the_failures():
    verdict = judge(
        metrics(slices([8] * 9 + [6]), LABELS),
        metrics(slices([8] * 10), LABELS),
        Thresholds(max_accuracy_drop=0.01, max_class_recall_drop=0.1),
    )
    table = format_blessing(verdict)
    lines = table.splitlines()
    assert lines[0].split() == ["metric", "candidate", "baseline", "change", "threshold", "result"]
    assert lines[1].split() == [
        "accuracy",
        "0.7800",
        "0.8000",
        "-0.0200",
        "change",
        ">=",
        "-0.0100",
        "FAILED",
        "by",
        "0.0100",
    ]
    (recall_j,) = [line for line in lines if line.startswith("recall/j ")]
    assert recall_j.split() == [
        "recall/j",
        "0.6000",
        "0.8000",
        "-0.2000",
        "change",
        ">=",
        "-0.1000",
        "FAILED",
        "by",
        "0.1000",
    ]
    (recall_a,) = [line for line in lines if line.startswith("recall/a ")]
    assert recall_a.endswith("ok")
    assert lines[-4] == "Not blessed: 3 threshold(s) failed:"
    assert lines[-1].startswith("  recall/j: change -0.2000 < -0.1000")


def test_with_no_baseline_the_table_says_so():
    table = format_blessing(judge(metrics(slices([5] * 10), LABELS), None, Thresholds()))
    assert "No version serves yet: only the value thresholds apply." in table
    assert table.endswith("Blessed: 0 threshold(s) passed.")


def test_blessing_json_holds_both_sides_the_thresholds_and_the_failures():
    verdict = judge(
        metrics(slices([8] * 9 + [7]), LABELS), metrics(slices([8] * 10), LABELS), Thresholds()
    )
    document = json.loads(json.dumps(blessing_json(verdict, versions={"candidate": None})))
    assert document["blessed"] is False
    assert document["candidate"]["accuracy"] == 0.79 and document["baseline"]["accuracy"] == 0.8
    assert set(document["candidate"]) == set(document["baseline"])
    assert all(isinstance(v, float) for v in document["candidate"].values())
    assert document["thresholds"] == {
        "min_accuracy": None,
        "max_accuracy_drop": 0.0,
        "max_class_recall_drop": None,
    }
    assert [c["metric"] for c in document["checks"]] == ["accuracy", "accuracy/test split"]
    assert document["checks"][0]["short_by"] == pytest.approx(0.01)
    assert document["failed"][0].startswith("accuracy: change -0.0100 < -0.0000")
    assert document["versions"] == {"candidate": None}


def test_the_sources_table_counts_where_examples_came_from():
    rows = [
        {"source": "test split", "read": 300, "duplicates": 0, "label_conflicts": 0, "held_out": 300, "trained": 0},
        {"source": "feedback", "read": 1200, "duplicates": 5, "label_conflicts": 2, "held_out": 233, "trained": 962},
    ]  # fmt: skip
    lines = format_sources(rows).splitlines()
    assert lines[0].split() == [
        "source",
        "read",
        "duplicates",
        "conflicts",
        "held",
        "out",
        "trained",
    ]
    assert lines[2].split() == ["feedback", "1,200", "5", "2", "233", "962"]
    assert lines[3].split() == ["total", "1,500", "5", "2", "533", "962"]


# --- regressors: lower is better --------------------------------------------------------------


def errors(*per_example: float) -> tuple[np.ndarray, np.ndarray]:
    """(truth, predicted) whose errors are per_example."""
    truth = np.arange(len(per_example), dtype=np.float64)
    return truth, truth + np.asarray(per_example)


def test_regression_metrics_are_rmse_mae_and_the_worst_slice():
    truth, predicted = errors(3, -4, 0, 0)
    groups = {"city": np.array(["a", "a", "b", "b"], object)}
    test = np.array([True, True, False, False])
    found = regression_metrics(truth, predicted, {TEST_SLICE: test, NEW_SLICE: ~test}, groups)
    assert found["rmse"] == pytest.approx(np.sqrt(25 / 4))
    assert found["mae"] == pytest.approx(7 / 4)
    assert found["rmse/test split"] == pytest.approx(np.sqrt(25 / 2))
    assert found["rmse/city=a"] == pytest.approx(np.sqrt(25 / 2)) and found["rmse/city=b"] == 0
    assert found[MAX_SLICE_RMSE] == found["rmse/city=a"]
    empty = regression_metrics(truth, predicted, {REFERENCE_SLICE: np.zeros(4, bool)})
    assert f"rmse/{REFERENCE_SLICE}" not in empty and MAX_SLICE_RMSE not in empty


def regression(candidate_errors, baseline_errors=None, **thresholds):
    groups = {"city": np.array(["a", "b"] * 2, object)}
    test = np.array([True, True, False, False])
    slices = {TEST_SLICE: test, REFERENCE_SLICE: test & [True, False, False, False]}
    measured = [
        None if e is None else regression_metrics(*errors(*e), slices, groups)
        for e in (candidate_errors, baseline_errors)
    ]
    return judge(*measured, Thresholds(task="regression", **thresholds))


REGRESSION_CASES = [
    pytest.param([1, 1, 1, 1], [1, 1, 1, 1], {}, True, [], id="equal-is-not-worse"),
    pytest.param([0.5, 0.5, 0.5, 0.5], [1, 1, 1, 1], {}, True, [], id="lower-error-is-better"),
    pytest.param([1, 1, 1, 1.5], [1, 1, 1, 1], {}, False, ["rmse"], id="a-higher-rmse-fails-at-0"),
    pytest.param([2, 1, 1, 1], [1, 1, 1, 1], {}, False, ["rmse", "rmse/test split", "rmse/reference"], id="the-reference-slice-worse"),
    pytest.param([1, 1, 1, 1.5], [1, 1, 1, 1], {"max_rmse_increase": 0.2}, True, [], id="within-the-allowed-increase"),
    pytest.param([0, 0, 0, 3], [1, 1, 1, 1], {"max_rmse_increase": 1.0}, True, [], id="mae-not-checked-by-default"),
    pytest.param([0, 0, 0, 3], [1, 1, 1, 1], {"max_rmse_increase": 1.0, "max_mae_increase": 0}, True, [], id="lower-mae-passes"),
    pytest.param([0, 0, 0, 3], [1, 1, 1, 1], {"max_rmse_increase": 1.0, "max_slice_error_increase": 0.5}, False, [MAX_SLICE_RMSE], id="the-worst-slice-worse"),
    pytest.param([5, 5, 5, 5], None, {}, True, [], id="first-model-rubber-stamped"),
    pytest.param([5, 5, 5, 5], None, {"max_rmse": 4.0}, False, ["rmse"], id="first-model-value-threshold"),
]  # fmt: skip


@pytest.mark.parametrize("candidate, baseline, thresholds, blessed, failing", REGRESSION_CASES)
def test_regression_thresholds_lower_is_better(candidate, baseline, thresholds, blessed, failing):
    verdict = regression(candidate, baseline, **thresholds)
    assert verdict.blessed is blessed
    assert [check.metric for check in verdict.failed] == failing
    assert all(check.direction == LOWER_IS_BETTER for check in verdict.checks)


def test_a_regressors_failure_says_over_by_and_blessing_json_names_the_direction():
    verdict = regression([1, 1, 1, 13**0.5], [1, 1, 1, 1])  # rmse 2 against 1
    (failed,) = verdict.failed
    assert failed.short_by == pytest.approx(1.0)
    assert failed.describe() == (
        "rmse: change +1.0000 > +0.0000 (candidate 2.0000, baseline 1.0000): over by 1.0000"
    )
    table = format_blessing(verdict)
    (rmse,) = [line for line in table.splitlines() if line.startswith("rmse ")]
    assert rmse.split()[4:] == ["change", "<=", "+0.0000", "FAILED", "by", "1.0000"]
    document = json.loads(json.dumps(blessing_json(verdict)))
    assert document["task"] == "regression"
    assert document["thresholds"] == {
        "max_rmse": None,
        "max_rmse_increase": 0.0,
        "max_mae_increase": None,
        "max_slice_error_increase": None,
    }
    assert document["checks"][0]["direction"] == "lower_is_better"
    assert document["checks"][0]["bound"] == 0.0 and document["checks"][0]["checked"] == 1.0
