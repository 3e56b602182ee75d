"""The regression report and the classification report for any number of classes
(training/evaluation_report.py): numbers worked out by hand, no TensorFlow."""

from __future__ import annotations

import math

import pytest

from training.evaluation_report import build_regression_report, build_report, format_report


def test_regression_report_overall_and_per_slice():
    truth = [1.0, 2.0, 3.0, 4.0]
    predicted = [1.5, 2.0, 1.0, 4.0]  # errors 0.5, 0, -2, 0
    report = build_regression_report(
        truth, predicted, {"city": ["a", "a", "b", "b"]}, task="regression"
    )
    assert report["examples"] == 4 and report["task"] == "regression"
    assert report["rmse"] == pytest.approx(math.sqrt((0.25 + 4) / 4), abs=1e-6)
    assert report["mae"] == pytest.approx(2.5 / 4)
    assert report["max_error"] == 2.0
    a, b = sorted(report["slices"]["city"], key=lambda row: row["value"])
    assert (a["examples"], a["max_error"], a["mae"]) == (2, 0.5, 0.25)
    assert (b["examples"], b["max_error"], b["rmse"]) == (2, 2.0, pytest.approx(math.sqrt(2)))
    assert [row["value"] for row in report["slices"]["city"]] == ["b", "a"], "worst first"
    assert "rmse 1.0308" in format_report(report)


def test_classification_report_for_three_classes():
    report = build_report([0, 1, 2, 2], [0, 2, 2, 2], ("high", "low", "mid"))
    assert report["confusion_matrix"] == [[1, 0, 0], [0, 0, 1], [0, 0, 2]]
    assert report["accuracy"] == 0.75
    assert [row["recall"] for row in report["per_class"]] == [1.0, 0.0, 1.0]
    assert [row["precision"] for row in report["per_class"]] == [1.0, 0.0, pytest.approx(0.6667)]
