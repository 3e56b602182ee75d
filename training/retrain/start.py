"""What a retrain starts from and keeps: the run's id (a hash of its inputs), the serving
version's checkpoint, model kind, layers and labels."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from artifact.contract import ASSETS_EXTRA, BLESSING_FILE
from artifact.repository import read_labels
from artifact.storage import is_url
from training import (
    cli,
    finetune,
    kinds,
    sources,
)
from training.errors import UsageError
from training.estimator import DEFAULT_HIDDEN_UNITS
from training.retrain.arguments import RetrainConfig
from training.versions import (
    Baseline,
)

# Params that do not change the trained weights (or follow from the data and the start,
# which the run id holds: the pixel statistics of a first IDX model): a rerun that differs
# only in these resumes.
_NOT_IN_RUN_ID = ("hooks", "check_numerics", "data_dir", "pixel_mean", "pixel_std")
# What the run starts from, on top of the inputs.
_START = ("baseline_version", "warm_start_from")


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


def _trained_on_the_same_inputs(baseline: Baseline, inputs_key: str) -> bool:
    if is_url(baseline.path):
        return False  # its blessing.json is not read from object storage: the run goes on
    path = Path(baseline.path) / ASSETS_EXTRA / BLESSING_FILE
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


def _labels(config: RetrainConfig, baseline: Baseline | None) -> tuple[str, ...]:
    """The baseline's class labels (the service answers and takes feedback with them)."""
    exported = read_labels(baseline.path) if baseline is not None else None
    if baseline is None or exported is None:
        return cli.labels(config.labels, config.data_dir)
    if config.labels != "auto" and cli.labels(config.labels, config.data_dir) != exported:
        raise UsageError(
            f"--labels {config.labels}: the serving version {baseline.version} answers with "
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


def _model_kind(
    config: RetrainConfig, baseline: Baseline | None, report: dict, model
) -> RetrainConfig:
    """--model: the serving version's kind when left out (warm-starting needs the same);
    the data's default kind for a first model. Returns the config with it."""
    known = kinds.KINDS[model.kind].model_kinds
    recorded = (report.get("params") or {}).get("model") if baseline is not None else None
    if config.model is None:
        config = dataclasses.replace(config, model=recorded or model.default_model)
    if config.model not in known:
        raise UsageError(
            f"--model {config.model} is not a kind for this model's data; use {', '.join(known)}"
        )
    if baseline is not None and not config.from_scratch:
        kind = recorded or "cnn"
        if kind != config.model:
            raise UsageError(
                f"--model {config.model}: the serving version {baseline.version} is a {kind} "
                f"model; warm-starting needs the same kind: use --model {kind}, or "
                "--from-scratch"
            )
    return config


def _keep_architecture(config: RetrainConfig, baseline: Baseline, report: dict) -> RetrainConfig:
    """--hidden-units: the serving version's when left at its default (warm-starting needs
    the same layers); another one given is refused. Returns the config with them."""
    recorded = (report.get("params") or {}).get("hidden_units")
    if not recorded or config.model not in ("dnn", "dnn_linear") or config.hidden_units == recorded:
        return config
    if config.hidden_units == list(DEFAULT_HIDDEN_UNITS):
        return dataclasses.replace(config, hidden_units=list(recorded))
    given, kept = (",".join(map(str, units)) for units in (config.hidden_units, recorded))
    raise UsageError(
        f"--hidden-units {given}: the serving version {baseline.version} has {kept}; "
        f"warm-starting needs the same layers: leave --hidden-units out, or --from-scratch"
    )


def _model_labels(config: RetrainConfig, baseline: Baseline | None, model) -> tuple[str, ...]:
    """The classes of a CSV or image-folder model (its data's, the serving version's when
    it has a labels.txt); the IDX labels were checked against --labels already."""
    if model.kind == "idx":
        return model.labels
    if config.labels != "auto":
        raise UsageError(f"--labels is for MNIST-format images; a {model.kind} model's classes "
                         "come from its data")  # fmt: skip
    exported = read_labels(baseline.path) if baseline is not None else None
    if baseline is not None and exported is not None and tuple(model.labels) != exported:
        raise UsageError(
            f"the serving version {baseline.version} answers with {', '.join(exported)}; the "
            f"data's classes are {', '.join(model.labels)}"
        )
    return tuple(model.labels)
