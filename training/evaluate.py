"""`python -m training evaluate PATH`: the evaluation report of a checkpoint or an export.

PATH is a model dir (its latest checkpoint, through the Estimator), an exported version, or a
model folder (its newest version, through the SavedModel). The report follows the model's
task (training/evaluation_report.py): a classifier's accuracy, per-class precision and recall and
confusion matrix; a regressor's RMSE, MAE, largest error and errors by categorical value. It
is printed and written as JSON.

A 28x28 model of IDX data is evaluated on --data-dir's test split; an exported CSV model on
--csv FILE (the model's feature columns and its label column), an exported image model on
--image-folder DIR (one subfolder per class, named as the model's classes): every row or image
of them (training/exported_model.py reads them against what the version takes).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from artifact.contract import normalize_pixels
from artifact.repository import newest_version, read_labels, resolve_version_path
from artifact.saved_model import SavedModelPredictor
from training import cli, data, exported_model, kinds, runs
from training.configs import EvaluateConfig
from training.errors import UsageError
from training.estimator import make_estimator
from training.evaluation_report import build_report, format_report
from training.runs import EVAL_BATCH_SIZE


def evaluate(config: EvaluateConfig) -> int:
    """Evaluate on the model's kind of data; print the report and write it to --output."""
    path = Path(config.path)
    if not path.exists():
        raise UsageError(f"{path}: not found")
    if config.label and not config.csv:
        raise UsageError("--label is for --csv")
    if (path / "saved_model.pb").is_file() or newest_version(path) is not None:
        version_path = resolve_version_path(path)
        described = exported_model.describe_version(version_path)
        if described is not None:
            report = _evaluate_export(config, described)
        else:
            _refuse_other_data(config, f"{version_path} takes 28x28 images: evaluate it on IDX "
                               "files with --data-dir")  # fmt: skip
            report = _evaluate_idx_export(config, version_path)
    else:
        params = runs.load_params(path)
        if "data" in params:
            raise UsageError(
                f"{path}: a model dir of a --csv or --image-folder run: evaluate its exported "
                "version (models/NAME) with --csv FILE or --image-folder DIR"
            )
        _refuse_other_data(config, f"{path} is a model dir: evaluate an exported version")
        report = _evaluate_checkpoint(config, path, params)
    print(format_report(report))
    Path(config.output).write_text(json.dumps(report, indent=2) + "\n")
    print(f"Wrote {config.output}")
    return 0


def _refuse_other_data(config: EvaluateConfig, why: str) -> None:
    for kind in kinds.KINDS.values():
        if kind.given(config):
            raise UsageError(f"{kind.option}: {why}")


def _evaluate_idx_export(config: EvaluateConfig, version_path: Path) -> dict:
    _, test_images, test_labels = data.load_split(config.data_dir, "test")
    predictor = SavedModelPredictor(version_path)
    classes, _ = predictor.predict_batched(normalize_pixels(test_images), EVAL_BATCH_SIZE)
    labels = read_labels(version_path) or cli.labels(config.labels, config.data_dir)
    return build_report(
        test_labels, classes, labels, data_dir=str(config.data_dir), split="test",
        saved_model=str(version_path),
    )  # fmt: skip


def _evaluate_checkpoint(config: EvaluateConfig, model_dir: Path, params: dict) -> dict:
    # The data first: a bad data dir is named whatever the model dir holds.
    _, test_images, test_labels = data.load_split(config.data_dir, "test")
    if runs.latest_step(model_dir) == 0:
        raise UsageError(f"{model_dir}: holds no checkpoint")
    estimator = make_estimator(str(model_dir), params)
    predictions = estimator.predict(
        lambda: data.predict_input_fn(test_images, EVAL_BATCH_SIZE), predict_keys=["classes"]
    )
    classes = np.fromiter((p["classes"] for p in predictions), np.int64, len(test_images))
    labels = tuple(params.get("labels") or cli.labels(config.labels, config.data_dir))
    return build_report(
        test_labels, classes, labels, data_dir=str(config.data_dir), split="test",
        model_dir=str(model_dir), global_step=runs.latest_step(model_dir),
    )  # fmt: skip


def _evaluate_export(config: EvaluateConfig, version) -> dict:
    """An exported CSV or image model on its kind's data (training/kinds/)."""
    (kind,) = [kind for kind in kinds.KINDS.values() if kind.takes(version)]
    return kind.evaluate_export(config, version)
