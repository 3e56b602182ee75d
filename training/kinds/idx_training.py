"""`python -m training train` on MNIST-format IDX images (the `idx` kind's, training/kinds/idx.py):
train one model kind (resuming from --model-dir), evaluate while it trains, export a new
version.

Runs alone, on one host's GPUs (`--num-gpus`), or as one task of a TF_CONFIG cluster
(training/distributed.py): the same command on every host.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import tensorflow as tf

from artifact.contract import normalize_pixels
from artifact.storage import location
from training import cli, data, determinism, distributed, finetune, runs
from training.configs import ModelOptions, TrainConfig
from training.errors import UsageError
from training.estimator import MODEL_KINDS, make_estimator, trainable_variable_shapes
from training.evaluation_report import format_report
from training.publish import export_evaluated
from training.runs import EVAL_BATCH_SIZE
from training.tabular import TABULAR_KINDS
from training.train_loop import train_and_evaluate
from training.versions import published_report

_FINE_TUNING_KEYS = ("warm_start_from", "warm_start_vars", "fine_tune_from", "fine_tune_scopes")


def model_params(
    options: ModelOptions,
    kind: str,
    max_steps: int,
    pixel_stats: tuple[float | None, float | None],
) -> dict:
    """The params of one run: what make_estimator builds and params.json records (the
    pixel statistics None until a retrain's trained examples give them)."""
    return {
        "model": kind,
        "data_format": options.data_format,
        **cli.schedule_params(options, max_steps),
        "pixel_mean": pixel_stats[0],
        "pixel_std": pixel_stats[1],
    }


def pixel_stats(images) -> tuple[float, float]:
    """Mean and standard deviation of the training pixels in [0, 1] (the baselines' normalizer)."""
    scaled = normalize_pixels(images)
    return round(float(scaled.mean()), 6), round(float(scaled.std()), 6)


def _fine_tuning(config: TrainConfig, estimator, start_step: int, model_dir: Path):
    """Check the fine-tuning options against the checkpoint and the model; what they add.

    Returns:
        (warm start settings or None, params to add).
    Raises:
        UsageError: unreadable checkpoint, scopes or pattern matching nothing, mismatches.
    """
    if config.fine_tune_scopes is not None and not config.fine_tune_from:
        raise UsageError("--fine-tune-scopes needs --fine-tune-from")
    if config.fine_tune_from and not config.fine_tune_scopes:
        raise UsageError("--fine-tune-from needs --fine-tune-scopes, e.g. conv1,conv2")
    if config.warm_start_vars != ".*" and not config.warm_start_from:
        raise UsageError("--warm-start-vars needs --warm-start-from")
    scopes = config.fine_tune_scopes or []
    source = config.warm_start_from or config.fine_tune_from
    if not source:
        return None, {}
    option = "--warm-start-from" if config.warm_start_from else "--fine-tune-from"
    checkpoint = finetune.resolve_checkpoint(source, option)
    shapes = trainable_variable_shapes(estimator)
    if config.warm_start_from:
        settings = finetune.warm_start_settings(checkpoint, config.warm_start_vars, shapes)
        added: dict[str, object] = {
            "warm_start_from": checkpoint,
            "warm_start_vars": config.warm_start_vars,
        }
    else:
        plan = finetune.plan_restore(shapes, finetune.checkpoint_shapes(checkpoint), scopes)
        print(
            f"Fine-tuning: {len(plan)} variables under {','.join(scopes)} "
            f"restored from {checkpoint}; the rest start fresh",
            flush=True,
        )
        settings = None
        added = {"fine_tune_from": checkpoint, "fine_tune_scopes": scopes}
    if start_step:
        # The Estimator restores model_dir's checkpoint and skips warm starts and init_fn.
        print(
            f"note: {model_dir} already holds a checkpoint (step {start_step}): resuming from "
            f"it; {option} applies to a new run only",
            flush=True,
        )
        return None, {}
    return settings, added


def train_idx(config: TrainConfig, others) -> int:
    """Train on IDX images (resuming from --model-dir), evaluate, and export a new version;
    `others` are the other kinds of data (training/kinds/), whose options are refused."""
    for other in others:
        other.refuse_options(config, "--data-dir")
    if config.model in TABULAR_KINDS and config.model not in MODEL_KINDS:
        raise UsageError(f"--model {config.model} is for --csv")
    # The IDX defaults, as they always were.
    model = config.model or "cnn"
    model_dir = Path(config.model_dir or cli.DEFAULT_MODEL_DIR)
    export_dir = config.export_dir or cli.DEFAULT_EXPORT_DIR
    labels = cli.labels(config.labels, config.data_dir)
    task = distributed.read_tf_config()
    if task is not None and config.deterministic:
        raise UsageError(
            "--deterministic with TF_CONFIG: the tasks of a cluster update the variables "
            "asynchronously, in whatever order they come; train on one host to repeat a run"
        )
    if task is not None and config.num_gpus:
        raise UsageError(
            "--num-gpus is MirroredStrategy on one host; with TF_CONFIG every task trains on "
            "its own devices: leave --num-gpus out"
        )
    hooks = cli.hook_names(config.hooks)
    if task is not None and task.task_type == "ps":
        return _run_parameter_server(model, model_dir, task)

    train_split, train_images, _ = data.load_split(config.data_dir, "train")
    test_split, test_images, test_labels = data.load_split(config.data_dir, "test")
    steps_per_epoch = math.ceil(train_split.count / config.batch_size)
    max_steps = cli.budget_steps(config, cli.DEFAULT_EPOCHS, steps_per_epoch)
    previous = runs.previous_params(model_dir) or {}
    # A resumed run keeps its normalizer: those constants live in the graph, not the checkpoint.
    stats = (previous["pixel_mean"], previous["pixel_std"]) if "pixel_mean" in previous else None
    params = model_params(config, model, max_steps, stats or pixel_stats(train_images))
    params.update(
        data_dir=str(config.data_dir),
        labels=list(labels),
        hooks=list(hooks),
        check_numerics=config.check_numerics,
    )
    runs.check_resumable(model_dir, params)
    start_step = runs.latest_step(model_dir)
    strategy = distributed.mirrored_strategy(config.num_gpus) if config.num_gpus else None
    estimator = _estimator(model_dir, params, config)
    warm_start, tuning = _fine_tuning(config, estimator, start_step, model_dir)
    params.update(tuning)
    if warm_start is not None or tuning or strategy is not None:
        estimator = _estimator(model_dir, params, config, warm_start, strategy)
    # Everything is checked: from here on the run writes.
    if task is None or task.is_chief:
        model_dir.mkdir(parents=True, exist_ok=True)
        # A resumed run still records where it was fine-tuned from (but does not restore it).
        origin = {k: v for k, v in previous.items() if k in _FINE_TUNING_KEYS}
        runs.write_params(model_dir, {**origin, **params} if start_step else params)
    where = f"; {task.name} of a TF_CONFIG cluster" if task else ""
    print(
        f"Training on {train_split.count:,} images from {config.data_dir} "
        f"({steps_per_epoch} steps/epoch), model {model}; model dir {model_dir}{where}"
        + (f", resuming at step {start_step}" if start_step else ""),
        flush=True,
    )
    started = time.perf_counter()
    # Workers and evaluators always join: the cluster's step is the chief's business.
    if start_step < max_steps or (task is not None and not task.is_chief):
        _train_and_evaluate(estimator, config, train_split, test_split, max_steps, model_dir, task)
    else:
        print(f"{model_dir} is already at step {start_step} >= {max_steps}: nothing to train.")
        exported = runs.exported_version_of(location(export_dir), model_dir, start_step)
        if exported is not None and not config.no_export:
            print(f"Step {start_step} is already exported as {exported}; not exporting it again.")
            return 0
    train_seconds = time.perf_counter() - started
    if task is not None and not task.is_chief:
        if task.task_type == "evaluator":
            print(f"[{task.name}] done at step {runs.latest_step(model_dir)}.", flush=True)
        else:
            print(
                f"[{task.name}] done: the cluster reached step {max_steps}; the chief writes "
                "the last checkpoint and exports.",
                flush=True,
            )
        return 0
    if config.no_export:
        return 0
    return _export(
        config, model_dir, export_dir, params, labels, test_images, test_labels, train_seconds
    )


def _estimator(model_dir, params, config: TrainConfig, warm_start=None, strategy=None):
    try:
        return make_estimator(
            str(model_dir),
            params,
            seed=config.seed,
            save_checkpoints_steps=config.checkpoint_steps,
            warm_start_from=warm_start,
            train_distribute=strategy,
            max_worker_delay_secs=config.max_worker_delay_secs,
            session_config=determinism.session_config(config.deterministic),
        )
    except ValueError as err:
        # RunConfig rejects a TF_CONFIG it cannot use.
        raise UsageError(str(err)) from err


def _train_and_evaluate(
    estimator, config: TrainConfig, train_split, test_split, max_steps, model_dir, task
):
    seed = config.seed
    if seed is not None and task is not None:
        seed += task.shuffle_offset
    train_and_evaluate(
        estimator,
        lambda: data.train_input_fn(train_split, config.batch_size, seed),
        lambda: data.eval_input_fn(test_split, EVAL_BATCH_SIZE),
        max_steps,
        model_dir,
        config.batch_size,
        config.eval_every_secs,
        label="train" if task is None else task.name,
    )


def _run_parameter_server(model: str, model_dir: Path, task) -> int:
    """A parameter server: serve the cluster's variables until stopped (it never returns)."""
    print(
        f"[{task.name}] parameter server on {task.address}; it never exits on its own: stop it "
        "once the chief has finished",
        flush=True,
    )
    estimator = make_estimator(str(model_dir), {"model": model, "hooks": []})

    def no_input():  # pragma: no cover - a parameter server never reads data
        raise AssertionError("a parameter server reads no input")

    tf.estimator.train_and_evaluate(
        estimator, tf.estimator.TrainSpec(no_input), tf.estimator.EvalSpec(no_input)
    )
    return 0


def _export(
    config: TrainConfig, model_dir, export_dir, params, labels, test_images, test_labels,
    train_seconds,
) -> int:  # fmt: skip
    context = runs.report_context(config.data_dir, model_dir, params, train_seconds)
    # A local Estimator: the export needs no cluster, and none of its devices in the graph.
    with distributed.without_tf_config():
        estimator = make_estimator(
            str(model_dir),
            {**params, "fine_tune_from": None},
            seed=config.seed,
            session_config=determinism.session_config(config.deterministic),
        )
    version = export_evaluated(estimator, export_dir, labels, test_images, test_labels, context)
    report = published_report(version)
    if report is not None:
        print(format_report(report), flush=True)
    print(f"Exported {version} after {train_seconds / 60:.1f} min of training.")
    sys.stdout.flush()
    return 0
