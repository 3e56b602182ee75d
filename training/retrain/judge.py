"""The candidate judged against the serving version on the same held-out set, and what
follows from the verdict: published as the next version, staged for `publish`, or recorded
as not blessed."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import tensorflow as tf

from artifact.contract import ASSETS_EXTRA, BLESSING_FILE
from artifact.model_config import ModelEntry
from artifact.saved_model import SavedModelPredictor
from artifact.storage import is_url
from training import (
    blessing,
    publish,
    runs,
    sources,
    staging,
)
from training.errors import UsageError
from training.kinds.model_data import HeldOut, ModelData, Reader
from training.plots import write_export_plots
from training.retrain.arguments import RetrainConfig
from training.retrain.inputs import held_out_set
from training.retrain.start import _describe_baseline
from training.staging import EXIT_NOT_BLESSED
from training.versions import (
    Baseline,
    move_label,
    pin_stable_before_a_canary,
    publish_staged,
    published_number,
    write_json,
)


@dataclasses.dataclass(frozen=True)
class Gate:
    """What a candidate is judged against, by which thresholds, and where a blessed one goes."""

    config: RetrainConfig  # its --data-dir, --export-dir, --config and --publish
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
    config: RetrainConfig


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
        if gate.config.stage_to:
            _stage(gate, candidate, document, staged, Path(gate.config.stage_to))
            return 0
        pin_stable_before_a_canary(
            gate.config.config, gate.entry, gate.config.publish, gate.baseline
        )
        published = _publish_as_next_version(staged, gate.config.export_dir, document)
    _record_published(gate, candidate, document, published)
    return 0


def _held_out_set(candidate: Candidate) -> HeldOut:
    return held_out_set(candidate.model, candidate.readers, candidate.selections)


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
        run_dir, {**candidate.params, "fine_tune_from": None}, candidate.config, None
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
            "mode": gate.config.publish,
            "config": gate.config.config,
            "version": None,
            "label_changes": None,
        },
    )


def _record_not_blessed(
    gate: Gate, candidate: Candidate, document: dict, verdict: blessing.Blessing
) -> None:
    write_json(candidate.run_dir / BLESSING_FILE, document)
    _record_staged_outcome(
        gate.config, gate.model_name, gate.baseline, staging.NOT_BLESSED,
        "; ".join(check.describe() for check in verdict.failed),
    )  # fmt: skip
    print(
        f"Not published: the model repository {gate.config.export_dir} is unchanged; the "
        f"report is {candidate.run_dir / BLESSING_FILE}.",
        flush=True,
    )


def _staged_fields(config: RetrainConfig, model_name: str, baseline: Baseline | None) -> dict:
    """What staged.json says the candidate was judged for and against."""
    return {
        "model": model_name,
        "export_dir": config.export_dir
        if is_url(config.export_dir)
        else os.path.abspath(config.export_dir),
        "config": config.config,
        "baseline_version": baseline.version if baseline is not None else None,
    }


def _record_staged_outcome(
    config: RetrainConfig,
    model_name: str,
    baseline: Baseline | None,
    outcome: str,
    reason: str,
    **more,
) -> None:
    """With --stage-to, a staged.json for a run that stages no candidate."""
    if config.stage_to:
        fields = _staged_fields(config, model_name, baseline)
        staging.record(Path(config.stage_to), outcome, fields, reason, **more)


def _stage(gate: Gate, candidate: Candidate, document: dict, staged: Path, stage_dir: Path) -> None:
    """--stage-to (`stage_dir`): the blessed candidate with its blessing.json left for the
    publish step; the repository is not written."""
    config = gate.config
    document["publish"].update(mode="staged", staged_to=os.path.abspath(stage_dir))
    staging.stage_candidate(
        stage_dir, staged, document, _staged_fields(config, gate.model_name, gate.baseline),
        f"blessed against {_describe_baseline(gate.baseline)}",
    )  # fmt: skip
    write_json(candidate.run_dir / BLESSING_FILE, document)
    config_option = f" --config {config.config}" if config.config else ""
    print(
        f"Blessed: staged in {stage_dir}; the model repository {config.export_dir} is "
        f"unchanged. Publish it with `python -m training publish --staged {stage_dir} "
        f"--export-dir {config.export_dir}{config_option}`.",
        flush=True,
    )


def _publish_as_next_version(staged: Path, export_dir: str, document: dict) -> Path | str:
    """The staged candidate renamed in as the next version, its blessing.json (naming that
    version) written into it before the rename."""

    def name_version(version: int, folder: Path) -> None:
        document["versions"]["candidate"] = version
        document["publish"]["version"] = version
        write_json(folder / ASSETS_EXTRA / BLESSING_FILE, document)

    return publish_staged(staged, export_dir, name_version)


def _record_published(
    gate: Gate, candidate: Candidate, document: dict, published: Path | str
) -> None:
    """Say so, move --publish's label, and keep blessing.json (with the label's changes) in
    the run dir."""
    print(f"Blessed: published {published}", flush=True)
    version = published_number(published)
    if gate.config.publish != "version":
        changes = move_label(gate.config.config, gate.entry, gate.config.publish, version)
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
