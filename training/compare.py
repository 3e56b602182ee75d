"""`python -m training compare`: every model kind on the same data and budget, best first.

The recommended workflow: a pre-made baseline first, then the custom Estimator, and keep the
custom model only if it beats the baselines by enough to pay for itself. Each kind trains for
the same steps with the same batch size, learning rate and seed, is exported, and is evaluated
through its exported SavedModel on the test split. The table (test accuracy, per-class recall,
training time, parameter count, export size) is printed and saved as comparison.md and
comparison.json in --work-dir, with comparison.png, a chart of the kinds side by side; the
exports are a model repository under --work-dir/models
(`MODEL_BASE_PATH=<work-dir>/models MODEL_NAME=dnn python -m service` serves one).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from artifact.repository import read_report
from training import cli, data, plots, runs
from training.errors import UsageError
from training.estimator import MODEL_KINDS, make_estimator
from training.hooks import ProgressHook
from training.publish import export_evaluated
from training.train import add_model_arguments, model_params, pixel_stats

DEFAULT_EPOCHS = 1.0
DEFAULT_WORK_DIR = "runs/compare"
TABLE_FILE = "comparison.md"
RESULTS_FILE = "comparison.json"
CHART_FILE = "comparison.png"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `compare` subcommand's options."""
    cli.add_data_arguments(p)
    p.add_argument(
        "--models",
        type=cli.name_list,
        default=list(MODEL_KINDS),
        help=f"the kinds to compare, comma-separated (default: {','.join(MODEL_KINDS)})",
    )
    p.add_argument(
        "--work-dir",
        default=DEFAULT_WORK_DIR,
        help="new or empty folder for each kind's model dir, the exports and the table "
        "(default: %(default)s)",
    )
    cli.add_budget_arguments(p, DEFAULT_EPOCHS)  # the same budget for every kind
    add_model_arguments(p, seed=0)  # one seed for every kind unless told otherwise


def saved_model_parameter_count(version: Path) -> int:
    """Scalars in an exported version's float variables (the model; not the global step)."""
    reader = tf.train.load_checkpoint(str(version / "variables" / "variables"))
    dtypes = reader.get_variable_to_dtype_map()
    return int(
        sum(
            np.prod(shape)
            for name, shape in reader.get_variable_to_shape_map().items()
            if dtypes[name].is_floating
        )
    )


def format_table(rows: list[dict], labels) -> str:
    """The results as a Markdown table, in the given order."""
    head = ["rank", "model", "test accuracy", "training s", "parameters", "export MB"]
    head += [f"recall {label}" for label in labels]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rank, row in enumerate(rows, 1):
        cells = [
            str(rank),
            row["model"],
            f"{row['accuracy']:.4f}",
            f"{row['train_seconds']:.1f}",
            f"{row['parameters']:,}",
            f"{row['export_bytes'] / 1e6:.2f}",
        ]
        cells += [f"{recall:.3f}" for recall in row["recall"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cmd_compare(args) -> int:
    """Train, export and evaluate each kind; print and save the table, best first."""
    kinds = list(dict.fromkeys(args.models))
    unknown = [k for k in kinds if k not in MODEL_KINDS]
    if unknown or not kinds:
        raise UsageError(
            f"--models: unknown kind(s) {', '.join(unknown) or '(none given)'}; "
            f"known kinds: {', '.join(MODEL_KINDS)}"
        )
    work_dir = Path(args.work_dir)
    if work_dir.exists() and (not work_dir.is_dir() or any(work_dir.iterdir())):
        raise UsageError(
            f"--work-dir {work_dir}: already exists and is not empty; every kind must start "
            "from scratch, so give a new folder"
        )
    labels = cli.labels(args)
    train_split, train_images, _ = data.load_split(args.data_dir, "train")
    _, test_images, test_labels = data.load_split(args.data_dir, "test")
    steps_per_epoch = math.ceil(train_split.count / args.batch_size)
    max_steps = cli.budget_steps(args, DEFAULT_EPOCHS, steps_per_epoch)
    stats = pixel_stats(train_images)
    print(
        f"Comparing {', '.join(kinds)}: {max_steps} steps of {args.batch_size} each on "
        f"{train_split.count:,} images from {args.data_dir}; work dir {work_dir}",
        flush=True,
    )
    rows = []
    for kind in kinds:
        model_dir = work_dir / kind
        params = model_params(args, kind, max_steps, stats)
        params.update(data_dir=str(args.data_dir), labels=list(labels))
        model_dir.mkdir(parents=True)
        runs.write_params(model_dir, params)
        estimator = make_estimator(
            str(model_dir), params, seed=args.seed, save_checkpoints_steps=max_steps
        )
        started = time.perf_counter()
        estimator.train(
            lambda: data.train_input_fn(train_split, args.batch_size, args.seed),
            max_steps=max_steps,
            hooks=[ProgressHook(max_steps, args.batch_size, label=kind)],
        )
        train_seconds = time.perf_counter() - started
        context = runs.report_context(args.data_dir, model_dir, params, train_seconds)
        version = export_evaluated(
            estimator, work_dir / "models" / kind, labels, test_images, test_labels, context
        )
        report = read_report(version)
        rows.append(
            {
                "model": kind,
                "accuracy": report["accuracy"],
                "recall": [row["recall"] for row in report["per_class"]],
                "train_seconds": round(train_seconds, 1),
                "parameters": saved_model_parameter_count(version),
                "export_bytes": runs.directory_bytes(version),
                "steps": context["global_step"],
                "version": str(version),
            }
        )
        print(f"[{kind}] test accuracy {report['accuracy']:.4f}; exported {version}", flush=True)
    rows.sort(key=lambda row: row["accuracy"], reverse=True)
    table = format_table(rows, labels)
    epochs = max_steps / steps_per_epoch
    budget = f"{max_steps} steps of {args.batch_size} ({epochs:.2g} epoch{'s' * (epochs != 1)})"
    print(f"\nTest accuracy on {len(test_labels):,} images after {budget}, best first:")
    print(table)
    (work_dir / TABLE_FILE).write_text(f"Budget: {budget}, seed {args.seed}.\n\n{table}\n")
    results = {"budget_steps": max_steps, "batch_size": args.batch_size, "labels": list(labels)}
    results["results"] = rows
    (work_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2) + "\n")
    title = f"{len(test_labels):,} test images after {budget}, best first"
    plots.plot_comparison(rows, labels, work_dir / CHART_FILE, title)
    print(f"Wrote {work_dir / TABLE_FILE}, {work_dir / RESULTS_FILE} and {work_dir / CHART_FILE}")
    return 0
