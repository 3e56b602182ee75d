"""`python -m training retrain`: a gated retrain, safe to run every night unattended.

    python -m training retrain --data-dir D --model-dir runs/fashion_mnist \\
        --export-dir models/fashion_mnist [--extra-data DIR ...] [--feedback-dir FEEDBACK_DIR] \\
        [--config models/models.config --publish canary]

1. Data (training/sources.py): the base test split (held out), the base train split, the
   `--extra-data` folders and the closed shards of the service's feedback store; an image
   seen before is counted once; the new data is split into trained and held out by a seeded
   hash of each image.
2. Baseline: the version serving now, the model config's `stable` label when it has one,
   else the newest version the config's policy serves (the newest on disk without a config).
3. Training, in a run folder of its own under --model-dir (named by a hash of everything
   that shapes the model: the same command on the same data resumes it after a kill),
   warm-started (tf.estimator.WarmStartSettings) from the checkpoint that produced the
   baseline, which its evaluation.json records; `--from-scratch` starts anew.
4. The candidate is exported into the run folder, never into the repository, and both it and
   the baseline are evaluated through their SavedModels on the same held-out set; the
   blessing (training/blessing.py) is printed and written as blessing.json.
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
from artifact.contract import ASSETS_EXTRA, BLESSING_FILE, NUM_CLASSES, normalize_pixels
from artifact.model_config import ModelEntry
from artifact.repository import read_labels, read_report
from artifact.saved_model import SavedModelPredictor
from artifact.warmup import WARMUP_BATCH_SIZES
from training import (
    blessing,
    cli,
    data,
    feedback_source,
    finetune,
    lock,
    publish,
    runs,
    sources,
    staging,
    train,
)
from training.errors import UsageError
from training.estimator import make_estimator, trainable_variable_shapes
from training.evaluation import build_report
from training.plots import write_export_plots
from training.runs import EVAL_BATCH_SIZE
from training.staging import EXIT_LOCKED, EXIT_NOT_BLESSED
from training.versions import (
    PUBLISH_MODES,
    Baseline,
    config_entry,
    move_label,
    pin_stable_before_a_canary,
    publish_staged,
    serving_baseline,
    write_json,
)

# A warm-started candidate needs fewer passes than a first model (train's default is 10).
DEFAULT_EPOCHS = 2
DEFAULT_HOLDOUT_FRACTION = 0.2
RUN_PREFIX = "retrain-"
# Params that do not change the trained weights: a rerun that differs only in these resumes.
_NOT_IN_RUN_ID = ("hooks", "check_numerics", "data_dir")
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
    )
    cli.add_budget_arguments(p, DEFAULT_EPOCHS)
    train.add_model_arguments(p, seed=0)
    train.add_schedule_arguments(p)
    train.add_hook_arguments(p)
    new = p.add_argument_group("new data")
    new.add_argument(
        "--extra-data",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of MNIST-format files (train- and/or t10k- images and labels) to add; "
        "repeat for several",
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
        help="share of the new images held out (never trained on) and added to the test "
        "split to judge the candidate (default: %(default)s)",
    )
    new.add_argument(
        "--holdout-seed",
        type=int,
        default=0,
        help="seed of the held-out split; an image stays on its side from run to run as long "
        "as the seed and fraction stay (default: %(default)s)",
    )
    start = p.add_argument_group("start")
    start.add_argument(
        "--from-scratch",
        action="store_true",
        help="train anew instead of warm-starting from the checkpoint of the serving version",
    )
    gate = p.add_argument_group("blessing (TFX's Evaluator thresholds)")
    gate.add_argument(
        "--min-accuracy",
        type=unit_fraction,
        default=None,
        help="value threshold: the candidate's accuracy on the held-out set at least this",
    )
    gate.add_argument(
        "--max-accuracy-drop",
        type=unit_fraction,
        default=0.0,
        help="change threshold: the candidate's accuracy, overall and on the test split, at "
        "most this below the serving version's (default: %(default)s, not worse)",
    )
    gate.add_argument(
        "--max-class-recall-drop",
        type=unit_fraction,
        default=None,
        help="change threshold: each class's recall at most this below the serving "
        "version's (default: not checked)",
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


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """The held-out set both models are judged on."""

    images: np.ndarray  # normalized, as the SavedModels take them
    labels: np.ndarray
    slices: dict[str, np.ndarray]  # slice name -> mask over the images


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
    thresholds = blessing.Thresholds(
        args.min_accuracy, args.max_accuracy_drop, args.max_class_recall_drop
    )
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
            repository = Path(args.export_dir).absolute().parent
            if args.stage_to:
                _hold_staging_area(args, repository, held)
            else:
                try:
                    held.enter_context(lock.hold_directory(repository, args.wait_for_lock))
                except OSError as err:
                    raise UsageError(
                        f"--export-dir {args.export_dir}: cannot open its folder: {err.strerror}"
                    ) from err
            return _retrain(args, thresholds, hooks, model_dir)
    except lock.LockHeld as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_LOCKED


def _hold_staging_area(args, repository: Path, held: ExitStack) -> None:
    """--stage-to's folder, made, locked for the run (not the repository: a staged retrain
    writes nothing there) and emptied of what an earlier retrain staged."""
    stage_dir = staging.make_area(args.stage_to, repository)
    held.enter_context(lock.hold_directory(stage_dir, args.wait_for_lock))
    staging.clear(stage_dir)


def _retrain(args, thresholds, hooks, model_dir: Path) -> int:
    export_dir = Path(args.export_dir)
    entry = config_entry(args.config, export_dir) if args.config else None
    model_name = entry.name if entry is not None else export_dir.name
    baseline = serving_baseline(entry, export_dir)
    labels = _labels(args, baseline)
    assembled = sources.assemble(
        _read_sources(args, model_name), args.holdout_fraction, args.holdout_seed
    )
    if len(assembled.train_images) == 0:
        raise data.DataError(f"{args.data_dir}: no image left to train on")
    baseline_report = (read_report(baseline.path) or {}) if baseline is not None else {}
    start = None
    if baseline is not None and not args.from_scratch:
        start = _start_checkpoint(baseline, baseline_report)
        _check_kind(args, baseline, baseline_report)
    steps_per_epoch = math.ceil(len(assembled.train_images) / args.batch_size)
    max_steps = cli.budget_steps(args, DEFAULT_EPOCHS, steps_per_epoch)
    base_params = baseline_report.get("params") or {}
    if start is not None and "pixel_mean" in base_params:
        # The linear and dnn normalizers are graph constants: keep the ones the weights know.
        stats = (base_params["pixel_mean"], base_params["pixel_std"])
    else:
        stats = train.pixel_stats(assembled.train_images)
    params = train.model_params(args, args.model, max_steps, stats)
    params.update(
        data_dir=str(args.data_dir),
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
                published_version=int(published.name),
            )  # fmt: skip
            if args.publish != "version":
                move_label(args.config, entry, args.publish, int(published.name))
            return 0
    run_dir.mkdir(parents=True, exist_ok=True)
    runs.check_resumable(run_dir, params)
    runs.write_params(run_dir, params)
    data_dir = run_dir / "data"
    train_split = data.write_idx(
        data_dir, "train", assembled.train_images, assembled.train_labels, compress=False
    )
    held_split = data.write_idx(
        data_dir, "test", assembled.held_out_images, assembled.held_out_labels, compress=False
    )
    started = time.perf_counter()
    if step < max_steps:
        estimator = _estimator(run_dir, params, args, start if step == 0 else None)
        print(
            f"Training on {train_split.count:,} images ({steps_per_epoch} steps/epoch) to step "
            f"{max_steps}" + (f", resuming at step {step}" if step else ""),
            flush=True,
        )
        train._train_and_evaluate(
            estimator, args, train_split, held_split, max_steps, run_dir, None
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
    )
    code = _judge_and_publish(gate, candidate)
    # The data's copy (the size of the data set) is written again if the run is ever resumed.
    shutil.rmtree(data_dir, ignore_errors=True)
    return code


def _judge_and_publish(gate: Gate, candidate: Candidate) -> int:
    """Stage the candidate in its run dir, judge it against the baseline on the held-out set
    and publish it only when blessed: 0 published, EXIT_NOT_BLESSED not."""
    held_out = _held_out_set(candidate.assembled)
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


def _held_out_set(assembled: sources.Assembled) -> HeldOut:
    return HeldOut(
        images=normalize_pixels(assembled.held_out_images),
        labels=assembled.held_out_labels,
        slices={
            **{
                name: assembled.held_out_slices == name
                for name in (blessing.TEST_SLICE, blessing.NEW_SLICE)
            },
            blessing.REFERENCE_SLICE: assembled.reference,
        },
    )


def _report_context(gate: Gate, candidate: Candidate, held_out: HeldOut) -> dict:
    """What the candidate's evaluation report records besides its metrics."""
    context = runs.report_context(
        gate.args.data_dir, candidate.run_dir, candidate.params, candidate.train_seconds
    )
    context.update(
        split="held out: the test split and the held-out share of the new data",
        held_out={
            "examples": len(held_out.labels),
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
    unless published), and its classes for the held-out images from that SavedModel."""
    run_dir = candidate.run_dir
    predicted: dict[str, np.ndarray] = {}

    def build(staged: Path) -> dict:
        classes, _ = SavedModelPredictor(staged).predict_batched(held_out.images, EVAL_BATCH_SIZE)
        predicted["classes"] = classes
        return build_report(held_out.labels, classes, candidate.labels, **context)

    estimator = make_estimator(str(run_dir), {**candidate.params, "fine_tune_from": None})
    warmup = normalize_pixels(candidate.assembled.held_out_images[: max(WARMUP_BATCH_SIZES)])
    with publish.staged_version(
        estimator, run_dir, gate.model_name, candidate.labels, build, context["checkpoint"],
        warmup,
        # The page's plots, as a trained version has them.
        write_extras=lambda extra, report: write_export_plots(extra, report, str(run_dir)),
    ) as staged:  # fmt: skip
        yield staged, predicted["classes"]


def _judge(
    gate: Gate, labels: tuple[str, ...], held_out: HeldOut, candidate_classes: np.ndarray
) -> blessing.Blessing:
    """The candidate's metrics on the held-out set against the baseline's, by the thresholds."""
    candidate = blessing.metrics(
        _confusions(held_out.labels, candidate_classes, held_out.slices), labels
    )
    baseline_metrics = None
    if gate.baseline is not None:
        baseline_classes = _predict_baseline(gate.baseline, held_out.images)
        baseline_metrics = blessing.metrics(
            _confusions(held_out.labels, baseline_classes, held_out.slices), labels
        )
    return blessing.judge(candidate, baseline_metrics, gate.thresholds)


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
                "examples": len(assembled.train_labels),
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
        "export_dir": os.path.abspath(args.export_dir),
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
    version = int(published.name)
    if gate.args.publish != "version":
        changes = move_label(gate.args.config, gate.entry, gate.args.publish, version)
        document["publish"]["label_changes"] = changes
    write_json(candidate.run_dir / BLESSING_FILE, document)


def _confusions(truth, predicted, slices: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Confusion matrices [true, predicted] overall and per slice."""

    def confusion(mask) -> np.ndarray:
        matrix = np.zeros((NUM_CLASSES, NUM_CLASSES), np.int64)
        np.add.at(matrix, (np.asarray(truth)[mask].astype(np.int64), predicted[mask]), 1)
        return matrix

    everything = np.ones(len(truth), bool)
    return {blessing.OVERALL: confusion(everything)} | {
        name: confusion(mask) for name, mask in slices.items()
    }


def _predict_baseline(baseline: Baseline, images: np.ndarray) -> np.ndarray:
    try:
        predictor = SavedModelPredictor(baseline.path)
    except (OSError, ValueError, KeyError, tf.errors.OpError) as err:
        detail = (getattr(err, "message", None) or str(err)).strip().splitlines()[0]
        raise UsageError(
            f"cannot load the serving version {baseline.version} ({baseline.path}) to compare "
            f"with: {detail}"
        ) from err
    classes, _ = predictor.predict_batched(images, EVAL_BATCH_SIZE)
    return classes


def _estimator(run_dir: Path, params: dict, args, start: str | None):
    warm_start = None
    if start is not None:
        shapes = trainable_variable_shapes(make_estimator(str(run_dir), params))
        warm_start = finetune.warm_start_settings(start, ".*", shapes)
    return make_estimator(
        str(run_dir),
        params,
        seed=args.seed,
        save_checkpoints_steps=args.checkpoint_steps,
        warm_start_from=warm_start,
    )


def _inputs_key(params: dict, assembled: sources.Assembled, from_scratch: bool) -> str:
    """A hash of the data and the options that shape the weights, whatever the run starts
    from: a version trained on the same inputs needs no retrain."""
    key = {
        "params": {k: v for k, v in params.items() if k not in _NOT_IN_RUN_ID + _START},
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


def _check_kind(args, baseline: Baseline, report: dict) -> None:
    kind = (report.get("params") or {}).get("model", "cnn")
    if kind != args.model:
        raise UsageError(
            f"--model {args.model}: the serving version {baseline.version} is a {kind} model; "
            f"warm-starting needs the same kind: use --model {kind}, or --from-scratch"
        )


def _read_sources(args, model_name: str) -> list[sources.Source]:
    """Every source of labeled images, in priority order (training/sources.py)."""
    _, test_images, test_labels = data.load_split(args.data_dir, "test")
    _, train_images, train_labels = data.load_split(args.data_dir, "train")
    base = str(args.data_dir)
    found = [
        sources.Source("test split", base, test_images, test_labels, sources.HELD_OUT),
        sources.Source("train split", base, train_images, train_labels, sources.TRAINED),
    ]
    for folder in args.extra_data:
        if not Path(folder).is_dir():
            raise data.DataError(f"--extra-data {folder}: folder not found")
        splits = [split for split in data.SPLITS if data.has_split(folder, split)]
        if not splits:
            raise data.DataError(
                f"--extra-data {folder}: holds no MNIST-format train- or t10k- images file"
            )
        parts = [data.load_split(folder, split)[1:] for split in splits]
        found.append(
            sources.Source(
                "extra data",
                str(folder),
                np.concatenate([p[0] for p in parts]),
                np.concatenate([p[1] for p in parts]),
                sources.NEW,
                {"splits": splits},
            )
        )
    if args.feedback_dir:
        root = Path(args.feedback_dir)
        if not root.is_dir():
            raise data.DataError(f"--feedback-dir {root}: folder not found")
        max_age = args.feedback_max_age_days
        found.append(
            feedback_source.read_feedback(
                feedback.store_dir(root, model_name),
                args.max_feedback_per_sender,
                tuple(args.exclude_sender),
                None if max_age is None else dt.timedelta(days=max_age),
            )
        )
    return found
