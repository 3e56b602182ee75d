"""`python -m training evaluate PATH`: the evaluation report of a checkpoint or an export.

PATH is a model dir (its latest checkpoint, through the Estimator), an exported version, or a
model folder (its newest version, through the SavedModel). The report is printed and written
as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from artifact.contract import normalize_pixels
from artifact.repository import newest_version, read_labels, resolve_version_path
from artifact.saved_model import SavedModelPredictor
from training import cli, data, runs
from training.errors import UsageError
from training.estimator import make_estimator
from training.evaluation import build_report, format_report
from training.runs import EVAL_BATCH_SIZE


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `evaluate` subcommand's options."""
    p.add_argument(
        "path",
        help="a --model-dir with checkpoints, an exported version (models/NAME/VERSION) "
        "or a model folder (its newest version)",
    )
    cli.add_data_arguments(p)
    p.add_argument(
        "--output",
        default="evaluation.json",
        help="where to write the report (default: %(default)s)",
    )


def cmd_evaluate(args) -> int:
    """Evaluate on the test split; print the report and write it to --output."""
    path = Path(args.path)
    _, test_images, test_labels = data.load_split(args.data_dir, "test")
    if not path.exists():
        raise UsageError(f"{path}: not found")
    if (path / "saved_model.pb").is_file() or newest_version(path) is not None:
        version_path = resolve_version_path(path)
        predictor = SavedModelPredictor(version_path)
        classes, _ = predictor.predict_batched(normalize_pixels(test_images), EVAL_BATCH_SIZE)
        labels = read_labels(version_path) or cli.labels(args)
        source = {"saved_model": str(version_path)}
    else:
        params = runs.load_params(path)
        if runs.latest_step(path) == 0:
            raise UsageError(f"{path}: holds no checkpoint")
        estimator = make_estimator(str(path), params)
        predictions = estimator.predict(
            lambda: data.predict_input_fn(test_images, EVAL_BATCH_SIZE), predict_keys=["classes"]
        )
        classes = np.fromiter((p["classes"] for p in predictions), np.int64, len(test_images))
        labels = tuple(params.get("labels") or cli.labels(args))
        source = {"model_dir": str(path), "global_step": runs.latest_step(path)}
    report = build_report(
        test_labels, classes, labels, data_dir=str(args.data_dir), split="test", **source
    )
    print(format_report(report))
    Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    print(f"Wrote {args.output}")
    return 0
