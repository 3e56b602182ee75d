"""`python -m training train --csv FILE` and `train --image-folder DIR`: training on the data a
kind's `prepare` read and checked (training/kinds/csv.py, image_folder.py), not only IDX.

A CSV file trains a pre-made Estimator on feature columns (training/tabular.py); an image
folder trains a small CNN on images of any size (training/image_folder.py). Both validate
everything before they write anything, train with train_and_evaluate on their training rows
(evaluating on the held-out ones), and export a new version in TF Serving's layout through
training/publish.py's staged, atomic export.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import tensorflow as tf

from artifact.storage import location
from training import cli, determinism, distributed, runs
from training.configs import ModelOptions, RunOptions, TrainConfig
from training.errors import UsageError
from training.evaluation_report import format_report
from training.hooks import ProgressHook


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A CSV file or an image folder read and checked for a run (its kind's `prepare`):
    what train_prepared counts, records, trains and exports."""

    count: int  # training examples
    data: dict  # the data as the run's params record it
    what: str  # the data, as the line before training names it
    extra_params: dict  # params the data decides (an image folder's number of classes)
    estimator: Callable[[dict, tf.estimator.RunConfig], tf.estimator.Estimator]
    train_input: Callable[[], tf.data.Dataset]
    eval_input: Callable[[], tf.data.Dataset]
    # (estimator, export dir, report context) -> the version exported and its report
    export: Callable[[tf.estimator.Estimator, object, dict], tuple[Path | str, dict]]


def _check_options(config: TrainConfig, kind, others) -> None:
    """Refuse what does not apply to the data (its kind's `prepare` defaults what does)."""
    for other in others:
        other.refuse_options(config, kind.option)
    if distributed.read_tf_config() is not None:
        raise UsageError(f"TF_CONFIG is set: {kind.option} trains on one host only; unset it")
    if config.model not in (None, *kind.model_kinds):
        raise UsageError(f"--model {config.model} is not for {kind.option}; use {kind.models_text}")


def run_params(options: ModelOptions, kind: str, max_steps: int, receiver: str, data: dict) -> dict:
    """The params of a CSV or image-folder run: what its Estimator is built from and
    params.json records (`train`'s, and a retrain's of such a model)."""
    return {
        "model": kind,
        **cli.schedule_params(options, max_steps),
        "receiver": receiver,
        "data": data,
    }


def run_config(options: RunOptions, model_dir: Path) -> tf.estimator.RunConfig:
    """The RunConfig of a CSV or image-folder run (`train`'s, and a retrain's of such a
    model): the seed, checkpoint interval, summaries and --deterministic's sessions."""
    return tf.estimator.RunConfig(
        model_dir=str(model_dir),
        tf_random_seed=options.seed,
        save_checkpoints_steps=options.checkpoint_steps,
        save_summary_steps=100,
        keep_checkpoint_max=3,
        log_step_count_steps=100,
        session_config=determinism.session_config(options.deterministic),
    )


def _check_resumable(model_dir: Path, params: dict) -> None:
    previous = runs.previous_params(model_dir)
    if previous is None:
        return
    same_data = previous.get("data") == json.loads(json.dumps(params["data"]))
    if previous.get("model") != params["model"] or not same_data:
        raise UsageError(
            f"{model_dir}: holds a run of another model or other data (model "
            f"{previous.get('model')}); use a new --model-dir"
        )


@dataclasses.dataclass(frozen=True)
class TrainedRun:
    """What train_prepared did: the kind trained, its budget (steps, and the training examples one
    epoch holds), how long it took, and the version it exported with its evaluation report
    (None with --no-export)."""

    kind: str
    model_dir: Path
    max_steps: int
    train_examples: int
    train_seconds: float
    version: Path | str | None
    report: dict | None


def train_and_report(config: TrainConfig, kind, others, default_epochs: float) -> int:
    """Train on a CSV file or an image folder (`kind`, training/kinds/); export a new version
    unless --no-export. `others`: the other kinds, whose options are refused."""
    run = train_prepared(config, kind, others, default_epochs)
    if run.version is not None and run.report is not None:
        print(format_report(run.report), flush=True)
        print(f"Exported {run.version} after {run.train_seconds / 60:.1f} min of training.")
        sys.stdout.flush()
    return 0


def train_prepared(config: TrainConfig, kind, others, default_epochs: float) -> TrainedRun:
    """Train config.model (or the data's default kind) on the data of `kind` (a CSV file or an
    image folder, training/kinds/) to the budget, evaluating on the held-out rows or images;
    export unless config.no_export.

    Raises:
        UsageError / DataError: options that do not apply, bad data, a model dir of another
            run; all before anything is written.
    """
    _check_options(config, kind, others)
    default_model_dir, default_export_dir = kind.default_folders(kind.source(config))
    model_dir = Path(config.model_dir or default_model_dir)
    export_dir = location(config.export_dir or default_export_dir)
    prepared = kind.prepare(config)
    model, count = config.model or kind.default_model, prepared.count
    steps_per_epoch = math.ceil(count / config.batch_size)
    max_steps = cli.budget_steps(config, default_epochs, steps_per_epoch)
    params = run_params(config, model, max_steps, config.receiver or "raw", prepared.data)
    _check_resumable(model_dir, params)
    estimator_config = run_config(config, model_dir)
    params.update(prepared.extra_params)
    estimator = prepared.estimator(params, estimator_config)
    # Everything is checked: from here on the run writes.
    model_dir.mkdir(parents=True, exist_ok=True)
    runs.write_params(model_dir, params)
    start_step = runs.latest_step(model_dir)
    print(
        f"Training on {prepared.what}, model {model}; model dir {model_dir}"
        + (f", resuming at step {start_step}" if start_step else ""),
        flush=True,
    )
    started = time.perf_counter()
    if start_step < max_steps:
        tf.estimator.train_and_evaluate(
            estimator,
            tf.estimator.TrainSpec(
                prepared.train_input,
                max_steps=max_steps,
                hooks=[ProgressHook(max_steps, config.batch_size, label="train")],
            ),
            tf.estimator.EvalSpec(
                prepared.eval_input,
                steps=None,
                start_delay_secs=0,
                throttle_secs=config.eval_every_secs,
            ),
        )
    else:
        print(f"{model_dir} is already at step {start_step} >= {max_steps}: nothing to train.")
    train_seconds = time.perf_counter() - started
    if config.no_export:
        return TrainedRun(model, model_dir, max_steps, count, train_seconds, None, None)
    context = runs.report_context(kind.source(config), model_dir, params, train_seconds)
    context["split"] = "holdout"
    version, report = prepared.export(estimator, export_dir, context)
    return TrainedRun(model, model_dir, max_steps, count, train_seconds, version, report)
