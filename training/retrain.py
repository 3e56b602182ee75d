"""`python -m training retrain`: a gated retrain, safe to run every night unattended.

    python -m training retrain --data-dir D --model-dir runs/fashion_mnist \\
        --export-dir models/fashion_mnist [--extra-data DIR ...] [--feedback-dir FEEDBACK_DIR] \\
        [--config models/models.config --publish canary]
    python -m training retrain --export-dir models/classification --model-dir runs/c \\
        [--csv classification.csv] [--extra-data more.csv ...] [--feedback-dir FEEDBACK_DIR]

Any model `train` makes retrains: the IDX image contract, a CSV model, an image-folder model
(training/retrain_data.py; the serving version's report says which, and where its base data
is, unless --csv or --image-folder gives it again).

1. Data (training/sources.py): the base data's test split (held out) and train split, the
   `--extra-data` of the model's kind and the closed shards of the service's feedback store;
   an example seen before is counted once; the new data is split into trained and held out
   by a seeded hash of each example. Every source is streamed from its files (a scan, then
   tf.data), never loaded whole.
2. Baseline: the version serving now, the model config's `stable` label when it has one,
   else the newest version the config's policy serves (the newest on disk without a config).
3. Training, in a run folder of its own under --model-dir (named by a hash of everything
   that shapes the model: the same command on the same data resumes it after a kill),
   warm-started (tf.estimator.WarmStartSettings) from the checkpoint that produced the
   baseline, which its evaluation.json records; `--from-scratch` starts anew.
4. The candidate is exported into the run folder, never into the repository, and both it and
   the baseline are evaluated through their SavedModels on the same held-out set; the
   blessing (training/blessing.py: a classifier's accuracy and recalls, a regressor's errors)
   is printed and written as blessing.json.
5. Blessed: the candidate is published atomically as the next version (with its
   blessing.json), and `--publish canary|stable` moves the label with training.promote's
   `promote`. Not blessed: nothing under the model repository changes.
   With `--stage-to DIR` the retrain publishes nothing and only reads the repository: the
   blessed candidate is left in DIR for `python -m training publish`, the small step with
   write access (training/staging.py).

Exit codes: 0 published (or already published by an earlier run), 1 crash, 2 bad input,
3 not blessed, 75 another retrain holds the lock.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import tensorflow as tf

from artifact import feedback
from artifact.contract import ASSETS_EXTRA, BLESSING_FILE
from artifact.model_config import ModelEntry
from artifact.repository import read_labels, read_report
from artifact.saved_model import SavedModelPredictor
from artifact.storage import basename, is_url, location
from training import (
    blessing,
    cli,
    data,
    feedback_source,
    finetune,
    kinds,
    lock,
    publish,
    retrain_data,
    runs,
    sources,
    staging,
    train,
)
from training.errors import UsageError
from training.estimator import DEFAULT_HIDDEN_UNITS
from training.kinds.model_data import HeldOut, ModelData, Reader
from training.plots import write_export_plots
from training.staging import EXIT_LOCKED, EXIT_NOT_BLESSED
from training.versions import (
    PUBLISH_MODES,
    Baseline,
    config_entry,
    move_label,
    pin_stable_before_a_canary,
    publish_staged,
    published_number,
    serving_baseline,
    write_json,
)

# In the model dir: the local copy of a serving version on object storage, judged against.
BASELINE_COPY = ".baseline"
# A warm-started candidate needs fewer passes than a first model (train's default is 10).
DEFAULT_EPOCHS = 2
DEFAULT_HOLDOUT_FRACTION = 0.2
RUN_PREFIX = "retrain-"
# Params that do not change the trained weights (or follow from the data and the start,
# which the run id holds: the pixel statistics of a first IDX model): a rerun that differs
# only in these resumes.
_NOT_IN_RUN_ID = ("hooks", "check_numerics", "data_dir", "pixel_mean", "pixel_std")
# What the run starts from, on top of the inputs.
_START = ("baseline_version", "warm_start_from")


def unit_fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def holdout_fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


unit_fraction.__name__ = "number in [0, 1]"
holdout_fraction.__name__ = "number in [0, 1)"
non_negative_float.__name__ = "non-negative number"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `retrain` subcommand's options: train's, with the same meaning, plus its own."""
    cli.add_data_arguments(p)
    train.add_run_arguments(
        p,
        model_dir_help="runs folder: each retrain trains in a folder of its own under it "
        "(retrain-<hash of the data and options>), which a killed retrain resumes; "
        f"{lock.LOCK_FILE} there keeps one retrain at a time",
        any_data=True,
    )
    cli.add_budget_arguments(p, DEFAULT_EPOCHS)
    train.add_model_arguments(p, seed=0)
    train.add_schedule_arguments(p)
    train.add_hook_arguments(p)
    train.add_any_data_arguments(p)
    new = p.add_argument_group("new data")
    new.add_argument(
        "--extra-data",
        action="append",
        default=[],
        metavar="PATH",
        help="more labeled data of the model's kind to add: a folder of MNIST-format files "
        "(train- and/or t10k- images and labels), a CSV file with the model's columns, or a "
        "folder of class subfolders of images; repeat for several",
    )
    new.add_argument(
        "--feedback-dir",
        metavar="DIR",
        help="the service's FEEDBACK_DIR: the closed shards of DIR/<model name> are added",
    )
    feedback_source.add_retrain_arguments(new)
    new.add_argument(
        "--holdout-fraction",
        type=holdout_fraction,
        default=DEFAULT_HOLDOUT_FRACTION,
        help="share of the new examples held out (never trained on) and added to the test "
        "split to judge the candidate (default: %(default)s)",
    )
    new.add_argument(
        "--holdout-seed",
        type=int,
        default=0,
        help="seed of the held-out split; an example stays on its side from run to run as "
        "long as the seed and fraction stay (default: %(default)s)",
    )
    start = p.add_argument_group("start")
    start.add_argument(
        "--from-scratch",
        action="store_true",
        help="train anew instead of warm-starting from the checkpoint of the serving version",
    )
    gate = p.add_argument_group(
        "blessing (TFX's Evaluator thresholds)",
        "A classifier is judged by its accuracy and recalls (higher is better), a regressor by "
        "its RMSE, MAE and largest slice error (lower is better).",
    )
    gate.add_argument(
        "--min-accuracy",
        type=unit_fraction,
        default=None,
        help="classifiers, value threshold: the candidate's accuracy on the held-out set at "
        "least this",
    )
    gate.add_argument(
        "--max-accuracy-drop",
        type=unit_fraction,
        default=None,
        help="classifiers, change threshold: the candidate's accuracy, overall, on the test "
        "split and on the reference slice, at most this below the serving version's "
        "(default: 0, not worse)",
    )
    gate.add_argument(
        "--max-class-recall-drop",
        type=unit_fraction,
        default=None,
        help="classifiers, change threshold: each class's recall at most this below the "
        "serving version's (default: not checked)",
    )
    gate.add_argument(
        "--max-rmse",
        type=non_negative_float,
        default=None,
        help="regressors, value threshold: the candidate's RMSE on the held-out set at most this",
    )
    gate.add_argument(
        "--max-rmse-increase",
        type=non_negative_float,
        default=None,
        help="regressors, change threshold: the candidate's RMSE, overall, on the test split "
        "and on the reference slice, at most this above the serving version's (default: 0, "
        "not worse)",
    )
    gate.add_argument(
        "--max-mae-increase",
        type=non_negative_float,
        default=None,
        help="regressors, change threshold: the candidate's MAE at most this above the "
        "serving version's (default: not checked)",
    )
    gate.add_argument(
        "--max-slice-error-increase",
        type=non_negative_float,
        default=None,
        help="regressors, change threshold: the largest RMSE of a slice (the rows of one value "
        "of a categorical column) at most this above the serving version's (default: not "
        "checked)",
    )
    out = p.add_argument_group("publishing")
    out.add_argument(
        "--config",
        metavar="FILE",
        help="TF Serving's model config (ModelServerConfig text) that lists --export-dir: its "
        "stable label names the serving version, and --publish canary|stable edit it",
    )
    out.add_argument(
        "--publish",
        choices=PUBLISH_MODES,
        default="version",
        help="when blessed: version = the next version only; canary = and label it canary "
        "(pinning stable to the serving version first when no label is set); stable = and "
        "label it stable (default: %(default)s)",
    )
    out.add_argument(
        "--stage-to",
        metavar="DIR",
        help="publish nothing, and only read the model repository: leave what the retrain "
        "decided (a blessed candidate, complete, with the digest of each file) in DIR, a "
        "folder of its own that it empties first, for `python -m training publish --staged "
        "DIR`, the step that writes the repository",
    )
    out.add_argument(
        "--wait-for-lock",
        type=non_negative_float,
        default=0.0,
        metavar="SECS",
        help="when another retrain runs on this --model-dir, wait this long for it before "
        "giving up with exit code 75 (default: %(default)s, give up at once)",
    )


@dataclasses.dataclass(frozen=True)
class Gate:
    """What a candidate is judged against, by which thresholds, and where a blessed one goes."""

    args: argparse.Namespace  # its --data-dir, --export-dir, --config and --publish
    thresholds: blessing.Thresholds
    entry: ModelEntry | None  # --config's entry for --export-dir; None without --config
    model_name: str
    baseline: Baseline | None  # None: no version on disk yet
    baseline_report: dict  # the baseline's evaluation report; {} when it has none


@dataclasses.dataclass(frozen=True)
class Candidate:
    """The run that trained the candidate, and on what."""

    run_dir: Path
    params: dict
    labels: tuple[str, ...]
    assembled: sources.Assembled
    inputs_key: str  # _inputs_key's hash: a later retrain on the same inputs stops early
    train_seconds: float
    model: ModelData
    readers: tuple[Reader, ...]
    selections: tuple[Path, ...]  # each reader's decisions, one byte an example
    args: argparse.Namespace


def cmd_retrain(args) -> int:
    """Train a candidate, judge it against the serving version, publish it only if blessed."""
    if args.stage_to and args.publish != "version":
        raise UsageError(
            f"--publish {args.publish} with --stage-to: the publish step moves the label "
            f"(`python -m training publish --staged {args.stage_to} --publish {args.publish} "
            "...`)"
        )
    if args.publish != "version" and not args.config:
        raise UsageError(
            f"--publish {args.publish} moves a label in the model config: give --config"
        )
    _default_folders(args)
    hooks = cli.hook_names(args.hooks)
    model_dir = Path(args.model_dir)
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
        lock_file = os.open(model_dir / lock.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        os.close(lock_file)
    except OSError as err:
        raise UsageError(f"--model-dir {model_dir}: cannot write there: {err.strerror}") from err
    try:
        with lock.hold(model_dir / lock.LOCK_FILE, args.wait_for_lock), ExitStack() as held:
            # The repository root, not the model's folder: a first publish makes that one.
            # On object storage there is no folder to lock: the model dir's lock is the one.
            remote = is_url(args.export_dir)
            repository = None if remote else Path(args.export_dir).absolute().parent
            if args.stage_to:
                _hold_staging_area(args, repository, held)
            elif not remote:
                try:
                    held.enter_context(lock.hold_directory(repository, args.wait_for_lock))
                except OSError as err:
                    raise UsageError(
                        f"--export-dir {args.export_dir}: cannot open its folder: {err.strerror}"
                    ) from err
            return _retrain(args, hooks, model_dir, held)
    except lock.LockHeld as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_LOCKED


def _hold_staging_area(args, repository: Path | None, held: ExitStack) -> None:
    """--stage-to's folder, made, locked for the run (not the repository: a staged retrain
    writes nothing there) and emptied of what an earlier retrain staged."""
    stage_dir = staging.make_area(args.stage_to, repository)
    held.enter_context(lock.hold_directory(stage_dir, args.wait_for_lock))
    staging.clear(stage_dir)


def _default_folders(args) -> None:
    """--model-dir and --export-dir as `train` defaults them: for the IDX images the
    Fashion-MNIST folders, for --csv and --image-folder runs/NAME and models/NAME."""
    model_dir, export_dir = kinds.of_args(args).default_folders(args)
    args.model_dir = args.model_dir or model_dir
    args.export_dir = args.export_dir or export_dir


def _thresholds(args, task: str) -> blessing.Thresholds:
    """The gate of the model's task; the other task's options are refused."""
    classifier = {
        "--min-accuracy": args.min_accuracy,
        "--max-accuracy-drop": args.max_accuracy_drop,
        "--max-class-recall-drop": args.max_class_recall_drop,
    }
    regressor = {
        "--max-rmse": args.max_rmse,
        "--max-rmse-increase": args.max_rmse_increase,
        "--max-mae-increase": args.max_mae_increase,
        "--max-slice-error-increase": args.max_slice_error_increase,
    }
    classifies = task == blessing.CLASSIFICATION
    for option, value in (regressor if classifies else classifier).items():
        if value is not None:
            raise UsageError(
                f"{option} is for {'regressors' if classifies else 'classifiers'}: this model "
                f"is a {'classifier' if classifies else 'regressor'}"
            )
    return blessing.Thresholds(
        min_accuracy=args.min_accuracy,
        max_accuracy_drop=args.max_accuracy_drop or 0.0,
        max_class_recall_drop=args.max_class_recall_drop,
        max_rmse=args.max_rmse,
        max_rmse_increase=args.max_rmse_increase or 0.0,
        max_mae_increase=args.max_mae_increase,
        max_slice_error_increase=args.max_slice_error_increase,
        task=task,
    )


def _scan(readers, holdout_seed: int) -> list[sources.Scanned]:
    """Every source read once, one example at a time (training/retrain_data.py)."""
    scanned = []
    for reader in readers:
        builder = sources.ScanBuilder(holdout_seed)
        reader.scan(builder)
        found = builder.build(reader.name, reader.path, reader.role, reader.detail)
        if len(found) != reader.count:
            raise data.DataError(
                f"{reader.path}: {len(found)} examples read, {reader.count} expected (it "
                "changed while it was read?)"
            )
        scanned.append(found)
    return scanned


def _retrain(args, hooks, model_dir: Path, held: ExitStack) -> int:
    export_dir = location(args.export_dir)
    entry = config_entry(args.config, export_dir) if args.config else None
    model_name = entry.name if entry is not None else basename(export_dir)
    # A serving version on object storage is judged from a local copy.
    fetch_to = model_dir / BASELINE_COPY if is_url(export_dir) else None
    baseline = serving_baseline(entry, export_dir, fetch_to)
    baseline_report = (read_report(baseline.path) or {}) if baseline is not None else {}
    model = kinds.retrain_data(args, baseline_report, lambda: _labels(args, baseline))
    labels = _model_labels(args, baseline, model)
    _model_kind(args, baseline, baseline_report, model)
    thresholds = _thresholds(args, model.task)
    selection = None
    if args.feedback_dir:
        root = Path(args.feedback_dir)
        if not root.is_dir():
            raise data.DataError(f"--feedback-dir {root}: folder not found")
        store = feedback.store_dir(root, model_name)
        # Held until the retrain ends: expiry does not remove shards it streams.
        held.enter_context(feedback.reading(store))
        max_age = args.feedback_max_age_days
        selection = feedback_source.select_feedback(
            store,
            args.max_feedback_per_sender,
            tuple(args.exclude_sender),
            None if max_age is None else dt.timedelta(days=max_age),
        )
    readers = model.readers(args.extra_data, selection)
    scanned = _scan(readers, args.holdout_seed)
    assembled = sources.assemble(scanned, args.holdout_fraction, args.holdout_seed)
    if assembled.train_count == 0:
        raise data.DataError(f"{model.base}: no example left to train on")
    start = None
    if baseline is not None and not args.from_scratch:
        start = _start_checkpoint(baseline, baseline_report)
        _keep_architecture(args, baseline, baseline_report)
    steps_per_epoch = math.ceil(assembled.train_count / args.batch_size)
    max_steps = cli.budget_steps(args, DEFAULT_EPOCHS, steps_per_epoch)
    base_params = (baseline_report.get("params") or {}) if start is not None else {}
    params = model.run_params(args, max_steps, base_params)
    params.update(
        data_dir=str(model.base),
        labels=list(labels),
        hooks=list(hooks),
        check_numerics=args.check_numerics,
        warm_start_from=start,
        baseline_version=baseline.version if baseline is not None else None,
    )
    inputs_key = _inputs_key(params, assembled, args.from_scratch)
    run_dir = model_dir / (RUN_PREFIX + _run_id(inputs_key, params))
    print(blessing.format_sources(assembled.sources), flush=True)
    for source in assembled.sources:
        if source["source"] == "feedback" and source["senders"]:
            print(feedback_source.format_senders(source), flush=True)
    if _trained_on_the_same_inputs(baseline, inputs_key):
        print(
            f"The serving version {baseline.version} was retrained on these very data with "
            "these options (its blessing.json says so): nothing new to train on."
        )
        _record_staged_outcome(
            args, model_name, baseline, staging.UNCHANGED,
            f"the serving version {baseline.version} was retrained on these very inputs",
        )  # fmt: skip
        return 0
    print(
        f"Baseline: {_describe_baseline(baseline)}; "
        + (f"warm start from {start}" if start else "training from scratch")
        + f"; run dir {run_dir}",
        flush=True,
    )
    step = runs.latest_step(run_dir) if (run_dir / runs.PARAMS_FILE).is_file() else 0
    if step >= max_steps:
        published = runs.exported_version_of(export_dir, run_dir, step)
        if published is not None:
            print(f"{run_dir} at step {step} is already published as {published}.")
            _record_staged_outcome(
                args, model_name, baseline, staging.PUBLISHED,
                f"{run_dir} at step {step} was published earlier",
                published_version=published_number(published),
            )  # fmt: skip
            if args.publish != "version":
                move_label(args.config, entry, args.publish, published_number(published))
            return 0
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = retrain_data.write_selections(run_dir, readers, assembled.selections)
    trained = [int((selection == sources.TRAIN).sum()) for selection in assembled.selections]
    model.finish_params(params, lambda: retrain_data.trained_examples(readers, paths))
    runs.check_resumable(run_dir, params)
    runs.write_params(run_dir, params)
    started = time.perf_counter()
    if step < max_steps:
        warm_start = model.warm_start(start, params, run_dir) if start and step == 0 else None
        estimator = model.estimator(run_dir, params, args, warm_start)
        print(
            f"Training on {assembled.train_count:,} examples ({steps_per_epoch} steps/epoch) "
            f"to step {max_steps}" + (f", resuming at step {step}" if step else ""),
            flush=True,
        )
        train.train_and_evaluate(
            estimator,
            lambda: retrain_data.training_input(
                model, readers, paths, trained, args.batch_size, args.seed
            ),
            lambda: retrain_data.evaluation_input(model, readers, paths),
            max_steps,
            run_dir,
            args.batch_size,
            args.eval_every_secs,
        )
    else:
        print(f"{run_dir} is already at step {step} >= {max_steps}: nothing to train.")
    train_seconds = time.perf_counter() - started
    gate = Gate(
        args=args,
        thresholds=thresholds,
        entry=entry,
        model_name=model_name,
        baseline=baseline,
        baseline_report=baseline_report,
    )
    candidate = Candidate(
        run_dir=run_dir,
        params=params,
        labels=labels,
        assembled=assembled,
        inputs_key=inputs_key,
        train_seconds=train_seconds,
        model=model,
        readers=tuple(readers),
        selections=tuple(paths),
        args=args,
    )
    code = _judge_and_publish(gate, candidate)
    # The decisions (a byte an example) are written again if the run is ever resumed.
    shutil.rmtree(run_dir / "data", ignore_errors=True)
    return code


def _judge_and_publish(gate: Gate, candidate: Candidate) -> int:
    """Stage the candidate in its run dir, judge it against the baseline on the held-out set
    and publish it only when blessed: 0 published, EXIT_NOT_BLESSED not."""
    held_out = _held_out_set(candidate)
    context = _report_context(gate, candidate, held_out)
    _remove_half_staged(candidate.run_dir)
    with _staged_candidate(gate, candidate, held_out, context) as (staged, candidate_classes):
        verdict = _judge(gate, candidate.labels, held_out, candidate_classes)
        document = _blessing_document(gate, candidate, context, verdict)
        print(blessing.format_blessing(verdict), flush=True)
        if not verdict.blessed:
            _record_not_blessed(gate, candidate, document, verdict)
            return EXIT_NOT_BLESSED
        if gate.args.stage_to:
            _stage(gate, candidate, document, staged)
            return 0
        pin_stable_before_a_canary(gate.args.config, gate.entry, gate.args.publish, gate.baseline)
        published = _publish_as_next_version(staged, gate.args.export_dir, document)
    _record_published(gate, candidate, document, published)
    return 0


def _held_out_set(candidate: Candidate) -> HeldOut:
    return retrain_data.held_out_set(candidate.model, candidate.readers, candidate.selections)


def _report_context(gate: Gate, candidate: Candidate, held_out: HeldOut) -> dict:
    """What the candidate's evaluation report records besides its metrics."""
    context = runs.report_context(
        candidate.model.base, candidate.run_dir, candidate.params, candidate.train_seconds
    )
    context.update(
        split="held out: the test split and the held-out share of the new data",
        held_out={
            "examples": len(held_out),
            "sha256": candidate.assembled.hashes["held_out"],
            "slices": {name: int(mask.sum()) for name, mask in held_out.slices.items()},
            "reference_rule": sources.REFERENCE_RULE,
        },
    )
    return context


def _remove_half_staged(run_dir: Path) -> None:
    """A candidate a killed run left half-staged (we hold the lock: nobody else stages here)."""
    for leftover in run_dir.glob(publish.STAGING_PREFIX + "*"):
        shutil.rmtree(leftover, ignore_errors=True)


@contextmanager
def _staged_candidate(
    gate: Gate, candidate: Candidate, held_out: HeldOut, context: dict
) -> Iterator[tuple[Path, np.ndarray]]:
    """The candidate staged as a complete version in its run dir (removed when the block ends
    unless published), and its predictions (class ids or values) for the held-out examples
    from that SavedModel."""
    run_dir, model = candidate.run_dir, candidate.model
    predicted: dict[str, np.ndarray] = {}

    def build(staged: Path) -> dict:
        predicted["values"] = held_out.predict(SavedModelPredictor(staged))
        return model.report(held_out.truth, predicted["values"], held_out.groups, **context)

    def plots(extra: Path, report: dict) -> None:
        # The page's plots, as a trained version of the task has them (a regressor's need
        # the values themselves, not only the report's errors).
        write_export_plots(extra, report, str(run_dir), held_out.truth, predicted["values"])

    estimator = model.estimator(
        run_dir, {**candidate.params, "fine_tune_from": None}, candidate.args, None
    )
    warmup = model.warmup_images(held_out)
    with model.staged(
        estimator, run_dir, gate.model_name, build, context["checkpoint"], warmup, plots
    ) as staged:
        yield staged, predicted["values"]


def _judge(
    gate: Gate, labels: tuple[str, ...], held_out: HeldOut, predicted: np.ndarray
) -> blessing.Blessing:
    """The candidate's metrics on the held-out set against the baseline's, by the thresholds."""

    def measured(values: np.ndarray) -> dict[str, float]:
        if gate.thresholds.task == blessing.REGRESSION:
            return blessing.regression_metrics(
                held_out.truth, values, held_out.slices, held_out.groups
            )
        return blessing.metrics(
            _confusions(held_out.truth, values, held_out.slices, labels), labels
        )

    baseline_metrics = None
    if gate.baseline is not None:
        baseline_metrics = measured(_predict_baseline(gate.baseline, held_out))
    return blessing.judge(measured(predicted), baseline_metrics, gate.thresholds)


def _blessing_document(
    gate: Gate, candidate: Candidate, context: dict, verdict: blessing.Blessing
) -> dict:
    """blessing.json, before publishing: no candidate version, no label changes yet."""
    baseline, assembled = gate.baseline, candidate.assembled
    return blessing.blessing_json(
        verdict,
        model=gate.model_name,
        versions={
            "candidate": None,
            "baseline": baseline.version if baseline is not None else None,
            "baseline_chosen_by": baseline.chosen_by if baseline is not None else None,
        },
        candidate_run={
            "run_dir": os.path.abspath(candidate.run_dir),
            "checkpoint": context["checkpoint"],
            "global_step": context["global_step"],
            "warm_start_from": candidate.params["warm_start_from"],
            "train_seconds": round(candidate.train_seconds, 1),
            "inputs_sha256": candidate.inputs_key,
        },
        baseline_run=(
            {k: gate.baseline_report.get(k) for k in ("model_dir", "checkpoint", "global_step")}
            if baseline is not None
            else None
        ),
        data={
            "sources": assembled.sources,
            "train": {
                "examples": assembled.train_count,
                "sha256": assembled.hashes["train"],
            },
            "held_out": context["held_out"],
            "holdout": assembled.holdout,
        },
        publish={
            "mode": gate.args.publish,
            "config": gate.args.config,
            "version": None,
            "label_changes": None,
        },
    )


def _record_not_blessed(
    gate: Gate, candidate: Candidate, document: dict, verdict: blessing.Blessing
) -> None:
    write_json(candidate.run_dir / BLESSING_FILE, document)
    _record_staged_outcome(
        gate.args, gate.model_name, gate.baseline, staging.NOT_BLESSED,
        "; ".join(check.describe() for check in verdict.failed),
    )  # fmt: skip
    print(
        f"Not published: the model repository {gate.args.export_dir} is unchanged; the "
        f"report is {candidate.run_dir / BLESSING_FILE}.",
        flush=True,
    )


def _staged_fields(args, model_name: str, baseline: Baseline | None) -> dict:
    """What staged.json says the candidate was judged for and against."""
    return {
        "model": model_name,
        "export_dir": args.export_dir
        if is_url(args.export_dir)
        else os.path.abspath(args.export_dir),
        "config": args.config,
        "baseline_version": baseline.version if baseline is not None else None,
    }


def _record_staged_outcome(
    args, model_name: str, baseline: Baseline | None, outcome: str, reason: str, **more
) -> None:
    """With --stage-to, a staged.json for a run that stages no candidate."""
    if args.stage_to:
        fields = _staged_fields(args, model_name, baseline)
        staging.record(Path(args.stage_to), outcome, fields, reason, **more)


def _stage(gate: Gate, candidate: Candidate, document: dict, staged: Path) -> None:
    """--stage-to: the blessed candidate with its blessing.json left for the publish step;
    the repository is not written."""
    args, stage_dir = gate.args, Path(gate.args.stage_to)
    document["publish"].update(mode="staged", staged_to=os.path.abspath(stage_dir))
    staging.stage_candidate(
        stage_dir, staged, document, _staged_fields(args, gate.model_name, gate.baseline),
        f"blessed against {_describe_baseline(gate.baseline)}",
    )  # fmt: skip
    write_json(candidate.run_dir / BLESSING_FILE, document)
    config = f" --config {args.config}" if args.config else ""
    print(
        f"Blessed: staged in {stage_dir}; the model repository {args.export_dir} is "
        f"unchanged. Publish it with `python -m training publish --staged {stage_dir} "
        f"--export-dir {args.export_dir}{config}`.",
        flush=True,
    )


def _publish_as_next_version(staged: Path, export_dir: str, document: dict) -> Path:
    """The staged candidate renamed in as the next version, its blessing.json (naming that
    version) written into it before the rename."""

    def name_version(version: int, folder: Path) -> None:
        document["versions"]["candidate"] = version
        document["publish"]["version"] = version
        write_json(folder / ASSETS_EXTRA / BLESSING_FILE, document)

    return publish_staged(staged, export_dir, name_version)


def _record_published(gate: Gate, candidate: Candidate, document: dict, published: Path) -> None:
    """Say so, move --publish's label, and keep blessing.json (with the label's changes) in
    the run dir."""
    print(f"Blessed: published {published}", flush=True)
    version = published_number(published)
    if gate.args.publish != "version":
        changes = move_label(gate.args.config, gate.entry, gate.args.publish, version)
        document["publish"]["label_changes"] = changes
    write_json(candidate.run_dir / BLESSING_FILE, document)


def _confusions(truth, predicted, slices: dict[str, np.ndarray], labels) -> dict[str, np.ndarray]:
    """Confusion matrices [true, predicted] overall and per slice."""
    truth = np.asarray(truth).astype(np.int64)
    predicted = np.asarray(predicted).astype(np.int64)

    def confusion(mask) -> np.ndarray:
        matrix = np.zeros((len(labels), len(labels)), np.int64)
        np.add.at(matrix, (truth[mask], predicted[mask]), 1)
        return matrix

    everything = np.ones(len(truth), bool)
    return {blessing.OVERALL: confusion(everything)} | {
        name: confusion(mask) for name, mask in slices.items()
    }


def _predict_baseline(baseline: Baseline, held_out: HeldOut) -> np.ndarray:
    try:
        predictor = SavedModelPredictor(baseline.path)
    except (OSError, ValueError, KeyError, tf.errors.OpError) as err:
        detail = (getattr(err, "message", None) or str(err)).strip().splitlines()[0]
        raise UsageError(
            f"cannot load the serving version {baseline.version} ({baseline.path}) to compare "
            f"with: {detail}"
        ) from err
    return held_out.predict(predictor)


def _inputs_key(params: dict, assembled: sources.Assembled, from_scratch: bool) -> str:
    """A hash of the data and the options that shape the weights, whatever the run starts
    from: a version trained on the same inputs needs no retrain."""
    kept = {k: v for k, v in params.items() if k not in _NOT_IN_RUN_ID + _START}
    if isinstance(kept.get("data"), dict):
        # Where the base file is does not shape the weights (its content is in the hashes).
        where = kinds.location_keys()
        kept["data"] = {k: v for k, v in kept["data"].items() if k not in where}
    key = {
        "params": kept,
        "from_scratch": from_scratch,
        "data": assembled.hashes,
        "holdout": {k: v for k, v in assembled.holdout.items() if k != "rule"},
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _run_id(inputs_key: str, params: dict) -> str:
    """The inputs and the start: the same command on the same data from the same baseline
    names the same run, which resumes."""
    key = {"inputs": inputs_key, **{k: params[k] for k in _START}}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def _trained_on_the_same_inputs(baseline: Baseline | None, inputs_key: str) -> bool:
    if baseline is None:
        return False
    path = baseline.path / ASSETS_EXTRA / BLESSING_FILE
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    run = recorded.get("candidate_run") if isinstance(recorded, dict) else None
    return isinstance(run, dict) and run.get("inputs_sha256") == inputs_key


def _describe_baseline(baseline: Baseline | None) -> str:
    if baseline is None:
        return "none (no version on disk: only the value thresholds apply)"
    return f"version {baseline.version}, {baseline.chosen_by}"


def _labels(args, baseline: Baseline | None) -> tuple[str, ...]:
    """The baseline's class labels (the service answers and takes feedback with them)."""
    exported = read_labels(baseline.path) if baseline is not None else None
    if exported is None:
        return cli.labels(args)
    if args.labels != "auto" and cli.labels(args) != exported:
        raise UsageError(
            f"--labels {args.labels}: the serving version {baseline.version} answers with "
            f"{', '.join(exported)}; leave --labels out to keep them"
        )
    return exported


def _start_checkpoint(baseline: Baseline, report: dict) -> str:
    """The checkpoint that produced the baseline, read whole; UsageError when it is gone."""
    hint = "restore it, or retrain --from-scratch"
    checkpoint = report.get("checkpoint")
    if not checkpoint and report.get("model_dir") and report.get("global_step") is not None:
        # Versions exported before the report recorded its checkpoint.
        checkpoint = str(Path(report["model_dir"]) / f"model.ckpt-{report['global_step']}")
    if not checkpoint:
        raise UsageError(
            f"the serving version {baseline.version} ({baseline.path}) does not say which "
            f"checkpoint produced it (no evaluation.json, or no checkpoint in it): {hint}"
        )
    if not Path(checkpoint + ".index").is_file():
        raise UsageError(
            f"the serving version {baseline.version} was exported from checkpoint "
            f"{checkpoint}, which is gone: {hint}"
        )
    try:
        return finetune.resolve_checkpoint(
            checkpoint, f"the checkpoint of the serving version {baseline.version}"
        )
    except UsageError as err:
        raise UsageError(f"{err}: {hint}") from err


def _model_kind(args, baseline: Baseline | None, report: dict, model) -> None:
    """--model: the serving version's kind when left out (warm-starting needs the same);
    the data's default kind for a first model."""
    known = kinds.KINDS[model.kind].model_kinds
    recorded = (report.get("params") or {}).get("model") if baseline is not None else None
    if args.model is None:
        args.model = recorded or model.default_model
    if args.model not in known:
        raise UsageError(
            f"--model {args.model} is not a kind for this model's data; use {', '.join(known)}"
        )
    if baseline is not None and not args.from_scratch:
        kind = recorded or "cnn"
        if kind != args.model:
            raise UsageError(
                f"--model {args.model}: the serving version {baseline.version} is a {kind} "
                f"model; warm-starting needs the same kind: use --model {kind}, or "
                "--from-scratch"
            )


def _keep_architecture(args, baseline: Baseline, report: dict) -> None:
    """--hidden-units: the serving version's when left at its default (warm-starting needs
    the same layers); another one given is refused."""
    recorded = (report.get("params") or {}).get("hidden_units")
    if not recorded or args.model not in ("dnn", "dnn_linear") or args.hidden_units == recorded:
        return
    if args.hidden_units == list(DEFAULT_HIDDEN_UNITS):
        args.hidden_units = list(recorded)
        return
    given, kept = (",".join(map(str, units)) for units in (args.hidden_units, recorded))
    raise UsageError(
        f"--hidden-units {given}: the serving version {baseline.version} has {kept}; "
        f"warm-starting needs the same layers: leave --hidden-units out, or --from-scratch"
    )


def _model_labels(args, baseline: Baseline | None, model) -> tuple[str, ...]:
    """The classes of a CSV or image-folder model (its data's, the serving version's when
    it has a labels.txt); the IDX labels were checked against --labels already."""
    if model.kind == "idx":
        return model.labels
    if args.labels != "auto":
        raise UsageError(f"--labels is for MNIST-format images; a {model.kind} model's classes "
                         "come from its data")  # fmt: skip
    exported = read_labels(baseline.path) if baseline is not None else None
    if exported is not None and tuple(model.labels) != exported:
        raise UsageError(
            f"the serving version {baseline.version} answers with {', '.join(exported)}; the "
            f"data's classes are {', '.join(model.labels)}"
        )
    return tuple(model.labels)
