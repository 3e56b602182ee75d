"""`python -m training retrain`'s run: the locks, the sources scanned and assembled, the
candidate trained in its run folder, then judged (training/retrain/judge.py)."""

from __future__ import annotations

import datetime as dt
import math
import os
import shutil
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from artifact import feedback
from artifact.repository import read_report
from artifact.storage import basename, is_url, location
from training import (
    blessing,
    cli,
    data,
    feedback_source,
    kinds,
    lock,
    runs,
    sources,
    staging,
    train_loop,
)
from training.errors import UsageError
from training.retrain.arguments import BASELINE_COPY, DEFAULT_EPOCHS, RUN_PREFIX, RetrainConfig
from training.retrain.inputs import (
    evaluation_input,
    trained_examples,
    training_input,
    write_selections,
)
from training.retrain.judge import Candidate, Gate, _judge_and_publish, _record_staged_outcome
from training.retrain.start import (
    _describe_baseline,
    _inputs_key,
    _keep_architecture,
    _labels,
    _model_kind,
    _model_labels,
    _run_id,
    _start_checkpoint,
    _trained_on_the_same_inputs,
)
from training.staging import EXIT_LOCKED
from training.versions import (
    config_entry,
    move_label,
    published_number,
    serving_baseline,
)


def retrain(config: RetrainConfig) -> int:
    """Train a candidate, judge it against the serving version, publish it only if blessed."""
    hooks = cli.hook_names(config.hooks)
    model_dir = Path(config.model_dir)
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
        lock_file = os.open(model_dir / lock.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        os.close(lock_file)
    except OSError as err:
        raise UsageError(f"--model-dir {model_dir}: cannot write there: {err.strerror}") from err
    try:
        with lock.hold(model_dir / lock.LOCK_FILE, config.wait_for_lock), ExitStack() as held:
            # The repository root, not the model's folder: a first publish makes that one.
            # On object storage there is no folder to lock: the model dir's lock is the one.
            remote = is_url(config.export_dir)
            repository = None if remote else Path(config.export_dir).absolute().parent
            if config.stage_to:
                _hold_staging_area(config.stage_to, config, repository, held)
            elif repository is not None:
                try:
                    held.enter_context(lock.hold_directory(repository, config.wait_for_lock))
                except OSError as err:
                    raise UsageError(
                        f"--export-dir {config.export_dir}: cannot open its folder: {err.strerror}"
                    ) from err
            return _retrain(config, hooks, model_dir, held)
    except lock.LockHeld as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_LOCKED


def _hold_staging_area(
    stage_to: str, config: RetrainConfig, repository: Path | None, held: ExitStack
) -> None:
    """--stage-to's folder, made, locked for the run (not the repository: a staged retrain
    writes nothing there) and emptied of what an earlier retrain staged."""
    stage_dir = staging.make_area(stage_to, repository)
    held.enter_context(lock.hold_directory(stage_dir, config.wait_for_lock))
    staging.clear(stage_dir)


def _thresholds(config: RetrainConfig, task: str) -> blessing.Thresholds:
    """The gate of the model's task; the other task's options are refused."""
    classifier = {
        "--min-accuracy": config.min_accuracy,
        "--max-accuracy-drop": config.max_accuracy_drop,
        "--max-class-recall-drop": config.max_class_recall_drop,
    }
    regressor = {
        "--max-rmse": config.max_rmse,
        "--max-rmse-increase": config.max_rmse_increase,
        "--max-mae-increase": config.max_mae_increase,
        "--max-slice-error-increase": config.max_slice_error_increase,
    }
    classifies = task == blessing.CLASSIFICATION
    for option, value in (regressor if classifies else classifier).items():
        if value is not None:
            raise UsageError(
                f"{option} is for {'regressors' if classifies else 'classifiers'}: this model "
                f"is a {'classifier' if classifies else 'regressor'}"
            )
    return blessing.Thresholds(
        min_accuracy=config.min_accuracy,
        max_accuracy_drop=config.max_accuracy_drop or 0.0,
        max_class_recall_drop=config.max_class_recall_drop,
        max_rmse=config.max_rmse,
        max_rmse_increase=config.max_rmse_increase or 0.0,
        max_mae_increase=config.max_mae_increase,
        max_slice_error_increase=config.max_slice_error_increase,
        task=task,
    )


def _scan(readers, holdout_seed: int) -> list[sources.Scanned]:
    """Every source read once, one example at a time (training/kinds/model_data.py)."""
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


def _retrain(config: RetrainConfig, hooks, model_dir: Path, held: ExitStack) -> int:
    export_dir = location(config.export_dir)
    entry = config_entry(config.config, export_dir) if config.config else None
    model_name = entry.name if entry is not None else basename(export_dir)
    # A serving version on object storage is judged from a local copy.
    fetch_to = model_dir / BASELINE_COPY if is_url(export_dir) else None
    baseline = serving_baseline(entry, export_dir, fetch_to)
    baseline_report = (read_report(baseline.path) or {}) if baseline is not None else {}
    model = kinds.retrain_data(config, baseline_report, lambda: _labels(config, baseline))
    labels = _model_labels(config, baseline, model)
    config = _model_kind(config, baseline, baseline_report, model)
    thresholds = _thresholds(config, model.task)
    selection = None
    if config.feedback_dir:
        root = Path(config.feedback_dir)
        if not root.is_dir():
            raise data.DataError(f"--feedback-dir {root}: folder not found")
        store = feedback.store_dir(root, model_name)
        # Held until the retrain ends: expiry does not remove shards it streams.
        held.enter_context(feedback.reading(store))
        max_age = config.feedback_max_age_days
        selection = feedback_source.select_feedback(
            store,
            config.max_feedback_per_sender,
            tuple(config.exclude_sender),
            None if max_age is None else dt.timedelta(days=max_age),
        )
    readers = model.readers(config.extra_data, selection)
    scanned = _scan(readers, config.holdout_seed)
    assembled = sources.assemble(scanned, config.holdout_fraction, config.holdout_seed)
    if assembled.train_count == 0:
        raise data.DataError(f"{model.base}: no example left to train on")
    start = None
    if baseline is not None and not config.from_scratch:
        start = _start_checkpoint(baseline, baseline_report)
        config = _keep_architecture(config, baseline, baseline_report)
    steps_per_epoch = math.ceil(assembled.train_count / config.batch_size)
    max_steps = cli.budget_steps(config, DEFAULT_EPOCHS, steps_per_epoch)
    base_params = (baseline_report.get("params") or {}) if start is not None else {}
    model_kind = config.model or model.default_model  # _model_kind has chosen it
    params = model.run_params(config, model_kind, max_steps, base_params)
    params.update(
        data_dir=str(model.base),
        labels=list(labels),
        hooks=list(hooks),
        check_numerics=config.check_numerics,
        warm_start_from=start,
        baseline_version=baseline.version if baseline is not None else None,
    )
    inputs_key = _inputs_key(params, assembled, config.from_scratch)
    run_dir = model_dir / (RUN_PREFIX + _run_id(inputs_key, params))
    print(blessing.format_sources(assembled.sources), flush=True)
    for source in assembled.sources:
        if source["source"] == "feedback" and source["senders"]:
            print(feedback_source.format_senders(source), flush=True)
    if baseline is not None and _trained_on_the_same_inputs(baseline, inputs_key):
        print(
            f"The serving version {baseline.version} was retrained on these very data with "
            "these options (its blessing.json says so): nothing new to train on."
        )
        _record_staged_outcome(
            config, model_name, baseline, staging.UNCHANGED,
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
                config, model_name, baseline, staging.PUBLISHED,
                f"{run_dir} at step {step} was published earlier",
                published_version=published_number(published),
            )  # fmt: skip
            if config.publish != "version":
                move_label(config.config, entry, config.publish, published_number(published))
            return 0
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = write_selections(run_dir, readers, assembled.selections)
    trained = [int((selection == sources.TRAIN).sum()) for selection in assembled.selections]
    model.finish_params(params, lambda: trained_examples(readers, paths))
    runs.check_resumable(run_dir, params)
    runs.write_params(run_dir, params)
    started = time.perf_counter()
    if step < max_steps:
        warm_start = model.warm_start(start, params, run_dir) if start and step == 0 else None
        estimator = model.estimator(run_dir, params, config, warm_start)
        print(
            f"Training on {assembled.train_count:,} examples ({steps_per_epoch} steps/epoch) "
            f"to step {max_steps}" + (f", resuming at step {step}" if step else ""),
            flush=True,
        )
        train_loop.train_and_evaluate(
            estimator,
            lambda: training_input(model, readers, paths, trained, config.batch_size, config.seed),
            lambda: evaluation_input(model, readers, paths),
            max_steps,
            run_dir,
            config.batch_size,
            config.eval_every_secs,
        )
    else:
        print(f"{run_dir} is already at step {step} >= {max_steps}: nothing to train.")
    train_seconds = time.perf_counter() - started
    gate = Gate(
        config=config,
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
        config=config,
    )
    code = _judge_and_publish(gate, candidate)
    # The decisions (a byte an example) are written again if the run is ever resumed.
    shutil.rmtree(run_dir / "data", ignore_errors=True)
    return code
