"""`python -m training compare` on MNIST-format IDX images (the `idx` kind's,
training/kinds/idx.py): every model kind on the same data and budget, best first.

The recommended workflow: a pre-made baseline first, then the custom Estimator, and keep the
custom model only if it beats the baselines by enough to pay for itself. Each kind trains for
the same steps with the same batch size, learning rate and seed, is exported, and is evaluated
through its exported SavedModel on the test split. The table (test accuracy, per-class recall,
training time, parameter count, export size) is printed and saved as comparison.md and
comparison.json in --work-dir, with comparison.png, a chart of the kinds side by side; the
exports are a model repository under --work-dir/models
(`MODEL_BASE_PATH=<work-dir>/models MODEL_NAME=dnn python -m service` serves one).

With --csv or --image-folder, the kinds of that data are compared instead, ranked by the
task's metric (training/kinds/prepared_comparison.py).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from training import cli, data, determinism, plots, runs
from training.comparison_table import (
    budget_text,
    check_work_dir,
    chosen_kinds,
    format_table,
    save_comparison,
    saved_model_parameter_count,
)
from training.configs import CompareConfig
from training.estimator import MODEL_KINDS, make_estimator
from training.hooks import ProgressHook
from training.kinds.idx_training import model_params, pixel_stats
from training.publish import export_evaluated

# compare's budget on IDX images (a CSV file's or an image folder's is train's).
DEFAULT_EPOCHS = 1.0


def compare_idx(config: CompareConfig, others) -> int:
    """Train, export and evaluate each model kind on IDX images; print and save the table,
    best first. `others`: the other kinds of data (training/kinds/), whose options are
    refused."""
    for other in others:
        other.refuse_options(config, "--data-dir")
    kinds = chosen_kinds(config.models, MODEL_KINDS)
    work_dir = Path(config.work_dir)
    check_work_dir(work_dir)
    labels = cli.labels(config.labels, config.data_dir)
    train_split, train_images, _ = data.load_split(config.data_dir, "train")
    _, test_images, test_labels = data.load_split(config.data_dir, "test")
    steps_per_epoch = math.ceil(train_split.count / config.batch_size)
    max_steps = cli.budget_steps(config, DEFAULT_EPOCHS, steps_per_epoch)
    stats = pixel_stats(train_images)
    print(
        f"Comparing {', '.join(kinds)}: {max_steps} steps of {config.batch_size} each on "
        f"{train_split.count:,} images from {config.data_dir}; work dir {work_dir}",
        flush=True,
    )
    rows = []
    for kind in kinds:
        model_dir = work_dir / kind
        params = model_params(config, kind, max_steps, stats)
        params.update(data_dir=str(config.data_dir), labels=list(labels))
        model_dir.mkdir(parents=True)
        runs.write_params(model_dir, params)
        estimator = make_estimator(
            str(model_dir),
            params,
            seed=config.seed,
            save_checkpoints_steps=max_steps,
            session_config=determinism.session_config(config.deterministic),
        )
        started = time.perf_counter()
        estimator.train(
            lambda: data.train_input_fn(train_split, config.batch_size, config.seed),
            max_steps=max_steps,
            hooks=[ProgressHook(max_steps, config.batch_size, label=kind)],
        )
        train_seconds = time.perf_counter() - started
        context = runs.report_context(config.data_dir, model_dir, params, train_seconds)
        version = runs.local_version(
            export_evaluated(
                estimator, work_dir / "models" / kind, labels, test_images, test_labels, context
            )
        )
        report = runs.exported_report(version)
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
    budget = budget_text(max_steps, config.batch_size, steps_per_epoch)
    results = {"budget_steps": max_steps, "batch_size": config.batch_size, "labels": list(labels)}
    save_comparison(
        work_dir,
        f"Test accuracy on {len(test_labels):,} images after {budget}, best first",
        f"Budget: {budget}, seed {config.seed}.",
        format_table(rows, labels),
        {**results, "results": rows},
        lambda path: plots.plot_comparison(
            rows, labels, path, f"{len(test_labels):,} test images after {budget}, best first"
        ),
    )
    return 0
