"""`python -m training compare --csv FILE` or `--image-folder DIR`: every kind of that data on
one budget, ranked by the task's metric.

The recommended workflow on a user's own data: the pre-made kinds (linear, dnn, dnn_linear) on
the same CSV file, or the image kinds (cnn, keras) on the same folder. Each is trained by
`train`'s own code (training/kinds/prepared_training.py: train_and_evaluate on the training
rows or images) for the same steps, batch size, learning rate and seed, exported to
WORK_DIR/models/KIND with its report and plots, and ranked on the held-out rows or images by
the task's metric: a classifier's accuracy (best first, with each class's recall), a
regressor's RMSE (lowest first, with its MAE, largest error and largest slice error). The
table is printed and saved as comparison.md and comparison.json, and drawn as comparison.png,
as for IDX data.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from training import cli, plots, runs
from training.comparison_table import (
    budget_text,
    check_work_dir,
    chosen_kinds,
    format_table,
    save_comparison,
    saved_model_parameter_count,
)
from training.configs import CompareConfig, TrainConfig
from training.evaluation_report import is_regression, worst_slice
from training.hooks import DEFAULT_HOOKS
from training.kinds.prepared_training import TrainedRun, train_prepared


def _train_config(config: CompareConfig, kind: str, work_dir: Path) -> TrainConfig:
    """`train`'s config for one kind: compare's data, budget and model options, its own
    model dir and export dir, train's defaults for the rest, and none of the IDX kinds'
    options."""
    train_fields = {field.name for field in dataclasses.fields(TrainConfig)}
    shared = {
        field.name: getattr(config, field.name)
        for field in dataclasses.fields(config)
        if field.name in train_fields
    }
    return TrainConfig(
        **shared,
        model=kind,
        model_dir=str(work_dir / kind),
        export_dir=str(work_dir / "models" / kind),
        # train's schedule: the last evaluation is of the exported step.
        checkpoint_steps=cli.DEFAULT_CHECKPOINT_STEPS,
        eval_every_secs=cli.DEFAULT_EVAL_EVERY_SECS,
        no_export=False,
        hooks=list(DEFAULT_HOOKS),
        check_numerics=False,
        warm_start_from=None,
        fine_tune_from=None,
        warm_start_vars=".*",
        fine_tune_scopes=None,
        max_worker_delay_secs=None,
        num_gpus=None,
    )


def _report(run: TrainedRun) -> dict:
    """A run's evaluation report (read back from its version when the run did not keep it)."""
    if run.report is not None:
        return run.report
    return runs.exported_report(runs.local_version(run.version))


def result_row(run: TrainedRun) -> dict:
    """One kind's row: the task's metrics on the held-out data, cost and size."""
    version = runs.local_version(run.version)
    report = _report(run)
    if is_regression(report):
        metrics = {
            "task": "regression",
            "rmse": report["rmse"],
            "mae": report["mae"],
            "max_error": report["max_error"],
            "worst_slice": worst_slice(report),
        }
    else:
        metrics = {
            "task": "classification",
            "accuracy": report["accuracy"],
            "recall": [row["recall"] for row in report["per_class"]],
        }
    return {
        "model": run.kind,
        **metrics,
        "train_seconds": round(run.train_seconds, 1),
        "parameters": saved_model_parameter_count(version),
        "export_bytes": runs.directory_bytes(version),
        "steps": report["global_step"],
        "version": str(run.version),
    }


def format_regression_table(rows: list[dict]) -> str:
    """Regressors' results as a Markdown table, in the given order."""
    head = ["rank", "model", "rmse", "mae", "largest error", "largest slice error",
            "training s", "parameters", "export MB"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rank, row in enumerate(rows, 1):
        worst = row["worst_slice"]
        shown = f"{worst['rmse']:.4f} ({worst['column']}={worst['value']})" if worst else "-"
        cells = [
            str(rank),
            row["model"],
            f"{row['rmse']:.4f}",
            f"{row['mae']:.4f}",
            f"{row['max_error']:.4f}",
            shown,
            f"{row['train_seconds']:.1f}",
            f"{row['parameters']:,}",
            f"{row['export_bytes'] / 1e6:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compare_prepared(config: CompareConfig, kind, others, default_epochs: float) -> int:
    """Train, export and evaluate each model kind on --csv or --image-folder (`kind`,
    training/kinds/); print and save the table, best first by the task's metric."""
    source = f"{kind.option} {kind.source(config)}"
    kinds = chosen_kinds(config.models, kind.model_kinds, " for " + kind.option)
    work_dir = Path(config.work_dir)
    check_work_dir(work_dir)
    print(f"Comparing {', '.join(kinds)} on {source}; work dir {work_dir}", flush=True)
    rows = []
    for model in kinds:
        last = train_prepared(_train_config(config, model, work_dir), kind, others, default_epochs)
        row = result_row(last)
        rows.append(row)
        metric = "rmse" if row["task"] == "regression" else "accuracy"
        print(f"[{model}] held-out {metric} {row[metric]:.4f}; exported {last.version}", flush=True)
    budget = budget_text(
        last.max_steps, config.batch_size, math.ceil(last.train_examples / config.batch_size)
    )
    last_report = _report(last)
    examples = last_report["examples"]
    results = {"task": rows[0]["task"], "budget_steps": last.max_steps,
               "batch_size": config.batch_size}  # fmt: skip
    if rows[0]["task"] == "regression":
        rows.sort(key=lambda row: row["rmse"])
        heading = f"RMSE on {examples:,} held-out rows after {budget}, best (lowest) first"
        table = format_regression_table(rows)

        def draw(path: Path) -> object:
            return plots.plot_regression_comparison(rows, path, heading)
    else:
        rows.sort(key=lambda row: row["accuracy"], reverse=True)
        labels = [row["label"] for row in last_report["per_class"]]
        results["labels"] = labels
        heading = f"Accuracy on {examples:,} held-out examples after {budget}, best first"
        table = format_table(rows, labels, "held-out accuracy")

        def draw(path: Path) -> object:
            return plots.plot_comparison(rows, labels, path, heading, "Held-out accuracy")

    save_comparison(
        work_dir, heading, f"Data: {source}. Budget: {budget}, seed {config.seed}.", table,
        {**results, "results": rows}, draw,
    )  # fmt: skip
    return 0
