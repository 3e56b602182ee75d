"""The plots: an export's confusion matrix and learning curves (from the run's real event
files), and compare's chart of the kinds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import tensorflow as tf
from support.training_harness import assert_real_png

from artifact.contract import (
    ASSETS_EXTRA,
    CLASSIFIER_PLOTS,
    CONFUSION_MATRIX_PLOT,
    LEARNING_CURVES_PLOT,
)
from artifact.repository import read_report
from training import plots
from training.comparison_table import CHART_FILE, RESULTS_FILE
from training.estimator import MODEL_KINDS


def independent_scalars(directory: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of a tag read with TF's own summary_iterator, not training.plots."""
    found = []
    for path in sorted(directory.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            found += [(event.step, v.simple_value) for v in event.summary.value if v.tag == tag]
    return found


def test_the_export_writes_both_plots_beside_its_report(trained_model):
    extra = trained_model.version_path / ASSETS_EXTRA
    assert sorted(p.name for p in extra.glob("*.png")) == sorted(CLASSIFIER_PLOTS)
    assert_real_png(extra / CONFUSION_MATRIX_PLOT, 500, 450)
    assert_real_png(extra / LEARNING_CURVES_PLOT, 700, 300)


def test_the_learning_curves_are_the_runs_own_summaries(trained_model):
    curves = plots.learning_curves(trained_model.model_dir)
    for tag in ("loss", "accuracy"):
        train = independent_scalars(trained_model.model_dir, tag)
        evaluated = independent_scalars(trained_model.model_dir / "eval", tag)
        assert train and evaluated, f"the run wrote no {tag} summaries"
        assert curves["train"][tag] == train
        assert curves["eval"][tag] == evaluated
    # The last evaluation is of the exported step, on the same test images as the report.
    report = read_report(trained_model.version_path)
    step, accuracy = curves["eval"]["accuracy"][-1]
    assert step == trained_model.max_steps == report["global_step"]
    assert accuracy == pytest.approx(report["accuracy"], abs=1 / report["examples"])


def write_events(directory: Path, name: str, points: list[tuple[int, float]], tf2: bool) -> None:
    """An event file with a `loss` scalar per point, written by TF's own writers: TF1's
    FileWriter (simple values, as the Estimator writes) or TF2's (scalar tensors)."""
    scratch = directory / f"scratch-{name}"
    if tf2:
        writer = tf.summary.create_file_writer(str(scratch))
        with writer.as_default():
            for step, value in points:
                tf.summary.scalar("loss", value, step=step)
        writer.close()
    else:
        with tf.Graph().as_default():  # TF1's writer refuses eager mode
            writer = tf.compat.v1.summary.FileWriter(str(scratch))
        for step, value in points:
            summary = tf.compat.v1.Summary(
                value=[tf.compat.v1.Summary.Value(tag="loss", simple_value=value)]
            )
            writer.add_summary(summary, step)
        writer.close()
    (written,) = scratch.glob("events.out.tfevents.*")
    written.rename(directory / f"events.out.tfevents.{name}.test")
    shutil.rmtree(scratch)


@pytest.mark.parametrize(
    "tf2", [pytest.param(False, id="tf1-simple-values"), pytest.param(True, id="tf2-tensors")]
)
def test_a_resumed_run_keeps_the_history_that_led_to_its_weights(tmp_path, tf2):
    # A run killed after step 30 resumed from its checkpoint at step 20: TensorBoard drops the
    # orphaned points after it, and so do the learning curves.
    write_events(tmp_path, "1000000001", [(10, 3.0), (20, 2.0), (30, 1.5)], tf2)
    write_events(tmp_path, "1000000002", [(20, 1.9), (40, 1.0)], tf2)
    found = plots.read_scalars(tmp_path)
    assert list(found) == ["loss"]
    steps, values = zip(*found["loss"], strict=True)
    assert steps == (10, 20, 40)
    assert values == pytest.approx((3.0, 1.9, 1.0))  # float32 on disk
    assert plots.read_scalars(tmp_path, ["accuracy"]) == {}


def test_a_run_without_summaries_gets_no_learning_curves(trained_model, tmp_path):
    report = read_report(trained_model.version_path)
    written = plots.write_export_plots(tmp_path, report, tmp_path / "empty-model-dir")
    assert written == [tmp_path / CONFUSION_MATRIX_PLOT]
    assert not (tmp_path / LEARNING_CURVES_PLOT).exists()


def test_compare_writes_its_chart_and_every_kind_its_plots(comparison):
    chart = comparison.work_dir / CHART_FILE
    assert_real_png(chart, 1000, 350)
    assert f"and {chart}" in comparison.stdout
    results = json.loads((comparison.work_dir / RESULTS_FILE).read_text())
    for row in results["results"]:
        extra = Path(row["version"]) / ASSETS_EXTRA
        assert sorted(p.name for p in extra.glob("*.png")) == sorted(CLASSIFIER_PLOTS), row["model"]
    assert sorted(row["model"] for row in results["results"]) == sorted(MODEL_KINDS)
