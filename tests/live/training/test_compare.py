"""`python -m training compare`: every kind on the same budget, a table best first."""

from __future__ import annotations

import json

import pytest
from support.helpers import assert_one_error_line
from support.training_harness import COMPARE_BATCH_SIZE, COMPARE_STEPS, LABELS, call_main

from artifact.repository import read_report
from training.comparison_table import RESULTS_FILE, TABLE_FILE, format_table
from training.errors import UsageError
from training.estimator import MODEL_KINDS
from training.runs import directory_bytes, exported_report, local_version

PARAMETERS = {
    "cnn": 3_274_634,
    "keras": 3_274_634,
    "linear": 28 * 28 * 10 + 10,
    "dnn": 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10,
}


def test_compare_trains_every_kind_on_one_budget_and_ranks_them(comparison):
    results = json.loads((comparison.work_dir / RESULTS_FILE).read_text())
    assert results["budget_steps"] == COMPARE_STEPS
    assert results["batch_size"] == COMPARE_BATCH_SIZE
    rows = results["results"]
    assert sorted(row["model"] for row in rows) == sorted(MODEL_KINDS)
    accuracies = [row["accuracy"] for row in rows]
    assert accuracies == sorted(accuracies, reverse=True), "not best first"
    for row in rows:
        kind = row["model"]
        version = comparison.work_dir / "models" / kind / "1"
        assert row["version"] == str(version)
        report = read_report(version)
        assert row["accuracy"] == report["accuracy"]
        assert row["recall"] == [r["recall"] for r in report["per_class"]]
        assert row["steps"] == COMPARE_STEPS == report["global_step"]
        assert row["parameters"] == PARAMETERS[kind]
        assert row["export_bytes"] == directory_bytes(version) > 0
        assert row["train_seconds"] > 0
        params = json.loads((comparison.work_dir / kind / "params.json").read_text())
        assert params["max_steps"] == COMPARE_STEPS and params["seed"] == 0
    # The linear model is the smallest export, the CNNs the largest.
    sizes = {row["model"]: row["export_bytes"] for row in rows}
    assert sizes["linear"] < sizes["dnn"] < min(sizes["cnn"], sizes["keras"])

    table = (comparison.work_dir / TABLE_FILE).read_text()
    assert table.startswith(f"Budget: {COMPARE_STEPS} steps of {COMPARE_BATCH_SIZE}")
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| rank | model | test accuracy | training s | parameters |")
    assert [line.split(" | ")[1] for line in lines[1:]] == [row["model"] for row in rows]
    assert lines[1].startswith(f"| 1 | {rows[0]['model']} | {rows[0]['accuracy']:.4f} |")
    # Printed too, after the per-kind progress.
    assert format_table(rows, LABELS) in comparison.stdout
    assert "best first" in comparison.stdout


def test_format_table():
    rows = [
        {"model": "dnn", "accuracy": 0.8512, "train_seconds": 9.04, "parameters": 235146,
         "export_bytes": 2_900_000, "recall": [0.5] * 10},
        {"model": "linear", "accuracy": 0.8, "train_seconds": 3.0, "parameters": 7850,
         "export_bytes": 120_000, "recall": [1.0] * 10},
    ]  # fmt: skip
    lines = format_table(rows, [str(d) for d in range(10)]).splitlines()
    assert len(lines) == 4
    assert lines[0].endswith("| recall 8 | recall 9 |")
    assert (
        lines[2]
        == "| 1 | dnn | 0.8512 | 9.0 | 235,146 | 2.90 | " + " | ".join(["0.500"] * 10) + " |"
    )
    assert lines[3].startswith("| 2 | linear | 0.8000 | 3.0 | 7,850 | 0.12 | 1.000 |")


def test_compare_refuses_a_work_dir_that_holds_something(tmp_path, small_data_dir, capsys):
    work_dir = tmp_path / "work"
    (work_dir / "cnn").mkdir(parents=True)
    code = call_main("compare", "--data-dir", small_data_dir, "--work-dir", work_dir,
                     "--max-steps", 1)  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 2
    assert_one_error_line(err, f"--work-dir {work_dir}: already exists and is not empty")
    assert [p.name for p in work_dir.iterdir()] == ["cnn"]


def test_compare_rejects_unknown_kinds(tmp_path, small_data_dir, capsys):
    work_dir = tmp_path / "work"
    code = call_main("compare", "--data-dir", small_data_dir, "--work-dir", work_dir,
                     "--models", "linear,svm", "--max-steps", 1)  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 2
    assert_one_error_line(
        err, "--models: unknown kind(s) svm; known kinds: cnn, linear, dnn, keras"
    )
    assert not work_dir.exists()


def test_a_comparison_reads_its_versions_from_a_local_folder(tmp_path):
    (tmp_path / "1").mkdir()
    assert local_version(str(tmp_path / "1")) == tmp_path / "1"
    for version in (None, "s3://bucket/models/m/1"):
        with pytest.raises(
            UsageError, match=f"reads its models' versions from its work dir, got {version}"
        ):
            local_version(version)
    with pytest.raises(UsageError, match="exported without its evaluation report"):
        exported_report(tmp_path / "1")
