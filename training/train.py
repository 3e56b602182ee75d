"""`python -m training train`: train one model kind, evaluate, export a new version.

Runs alone, on one host's GPUs (`--num-gpus`), or as one task of a TF_CONFIG cluster
(training/distributed.py): the same command on every host.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from pathlib import Path

import tensorflow as tf

from artifact.contract import normalize_pixels
from artifact.storage import location
from training import cli, data, determinism, distributed, finetune, runs
from training.configs import ModelOptions, TrainConfig
from training.errors import NumericsError, UsageError
from training.estimator import (
    DEFAULT_HIDDEN_UNITS,
    MODEL_KINDS,
    make_estimator,
    trainable_variable_shapes,
)
from training.evaluation import format_report
from training.hooks import DEFAULT_HOOKS, HOOKS, ProgressHook
from training.image_folder import CHANNELS, DEFAULT_CHANNELS, DEFAULT_IMAGE_SIZE
from training.model import DATA_FORMATS
from training.publish import export_evaluated
from training.runs import EVAL_BATCH_SIZE
from training.tabular import RECEIVERS, TABULAR_KINDS
from training.tabular_schema import (
    DEFAULT_MAX_VOCABULARY,
    HOLDOUT_EVERY,
    MAX_INTEGER_CLASSES,
    TASKS,
)
from training.versions import published_report

# Measured here (README): 10 epochs of batch 100, Adam 1e-3 with cosine decay: 0.93 in ~3.5 min.
DEFAULT_EPOCHS = 10
DEFAULT_BATCH_SIZE = 100
DEFAULT_LEARNING_RATE = 1e-3
DEFAULT_EVAL_EVERY_SECS = 120
DEFAULT_CHECKPOINT_STEPS = 1000
_FINE_TUNING_KEYS = ("warm_start_from", "warm_start_vars", "fine_tune_from", "fine_tune_scopes")
# check_numerics' message: "<tensor name> : Tensor had NaN values".
_NUMERICS_FAILURE = re.compile(r"(\S+) : Tensor had (NaN|Inf|Inf and NaN) values")


def add_model_arguments(p: argparse.ArgumentParser, seed: int | None = None) -> None:
    """The options that shape a kind's model and its training (shared with `compare`)."""
    p.add_argument(
        "--batch-size",
        type=cli.positive_int,
        default=DEFAULT_BATCH_SIZE,
        help="examples per step (per replica with --num-gpus) (default: %(default)s)",
    )
    p.add_argument(
        "--learning-rate",
        type=cli.positive_float,
        default=DEFAULT_LEARNING_RATE,
        help="Adam's initial learning rate, cosine-decayed to 0 by the last step "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--constant-learning-rate",
        action="store_true",
        help="keep the learning rate constant instead of decaying it",
    )
    p.add_argument(
        "--data-format",
        choices=DATA_FORMATS,
        default="channels_last",
        help="tensor layout inside the CNNs (cnn, keras): channels_last (CPU) or "
        "channels_first (faster on GPU) (default: %(default)s)",
    )
    p.add_argument(
        "--hidden-units",
        type=cli.int_list,
        default=list(DEFAULT_HIDDEN_UNITS),
        help="dnn: sizes of the hidden layers, comma-separated (default: "
        f"{','.join(map(str, DEFAULT_HIDDEN_UNITS))})",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=seed,
        help="seed for weights and shuffling (default: "
        + ("random; 0 with --deterministic)" if seed is None else "%(default)s)"),
    )
    determinism.add_argument(p)


def add_run_arguments(
    p: argparse.ArgumentParser,
    model_dir_help: str = "checkpoints and TensorBoard events; an existing run resumes",
    *,
    any_data: bool = False,
) -> None:
    """--model, --model-dir and --export-dir (shared with `retrain`).

    any_data: `train`'s form, which also takes --csv and --image-folder: the tabular kind
    dnn_linear too, and defaults that follow the data (resolved by cmd_train).
    """
    if any_data:
        p.add_argument(
            "--model",
            choices=(*MODEL_KINDS, *(k for k in TABULAR_KINDS if k not in MODEL_KINDS)),
            default=None,
            help="IDX data: cnn: the custom CNN Estimator; linear / dnn: the pre-made "
            "LinearClassifier / DNNClassifier over a numeric feature column; keras: the CNN as "
            "a Keras model through model_to_estimator (default: cnn). --csv: linear, dnn or "
            "dnn_linear: the pre-made Linear, DNN or DNNLinearCombined Classifier or Regressor "
            "on feature columns (default: linear). --image-folder: cnn, a small CNN for the "
            "folder's image size (the default), or keras: the same CNN as a Keras model "
            "through model_to_estimator",
        )
        p.add_argument(
            "--model-dir",
            default=None,
            help=f"{model_dir_help} (default: {cli.DEFAULT_MODEL_DIR}; with --csv or "
            "--image-folder runs/NAME, NAME the file's stem or the folder's name)",
        )
        p.add_argument(
            "--export-dir",
            default=None,
            help="model repository folder that receives a new integer version (default: "
            f"{cli.DEFAULT_EXPORT_DIR}; with --csv or --image-folder models/NAME)",
        )
        return
    p.add_argument(
        "--model",
        choices=MODEL_KINDS,
        default="cnn",
        help="cnn: the custom CNN Estimator; linear / dnn: the pre-made LinearClassifier / "
        "DNNClassifier over a numeric feature column; keras: the CNN as a Keras model through "
        "model_to_estimator (default: %(default)s)",
    )
    p.add_argument(
        "--model-dir",
        default=cli.DEFAULT_MODEL_DIR,
        help=f"{model_dir_help} (default: %(default)s)",
    )
    p.add_argument(
        "--export-dir",
        default=cli.DEFAULT_EXPORT_DIR,
        help="model repository folder that receives a new integer version (default: %(default)s)",
    )


def add_any_data_arguments(p: argparse.ArgumentParser) -> None:
    """--csv / --image-folder and their options: training on other data than IDX files."""
    group = p.add_argument_group(
        "CSV files and image folders",
        "Instead of --data-dir's IDX files: a CSV file with a header (pre-made Estimators on "
        "feature columns), or a folder with one subfolder of PNG/JPEG images per class. Every "
        f"{HOLDOUT_EVERY}th row (or image of a class) is held out for evaluation; the export's "
        "assets.extra/evaluation.json reports on it. `python -m training sample-data --out "
        "DIR` writes a small example of each.",
    )
    source = group.add_mutually_exclusive_group()
    source.add_argument(
        "--csv",
        metavar="FILE",
        help="train on a CSV file: numeric columns become normalized numeric feature "
        "columns (int64 inputs where the values are integers), string columns vocabulary "
        "(or, past --max-vocabulary values, hashed) categorical columns",
    )
    source.add_argument(
        "--image-folder",
        metavar="DIR",
        help="train on DIR/<class>/*.png|jpg: images of any size, resized to --image-size",
    )
    group.add_argument("--label", metavar="COLUMN", help="--csv: the label column (default: label)")
    group.add_argument(
        "--task",
        choices=TASKS,
        help="--csv: force the task; by default strings or integers 0-"
        f"{MAX_INTEGER_CLASSES - 1} in the label column are classes (string labels through "
        "label_vocabulary), other numbers a regression target",
    )
    group.add_argument(
        "--max-vocabulary",
        type=cli.positive_int,
        metavar="N",
        help="--csv: string columns with more distinct training values are hashed "
        f"(categorical_column_with_hash_bucket) (default: {DEFAULT_MAX_VOCABULARY})",
    )
    group.add_argument(
        "--receiver",
        choices=RECEIVERS,
        help="--csv: the export's serving input: raw (one input per feature, TF's `predict` "
        "signature) or parsing (serialized tf.Examples in `examples`: also TF Serving's "
        "`classification` / `regression` signatures) (default: raw)",
    )
    group.add_argument(
        "--image-size",
        type=cli.positive_int,
        metavar="N",
        help=f"--image-folder: images are resized to N x N (default: {DEFAULT_IMAGE_SIZE})",
    )
    group.add_argument(
        "--channels",
        type=int,
        choices=CHANNELS,
        help=f"--image-folder: 1 (grayscale) or 3 (RGB) (default: {DEFAULT_CHANNELS})",
    )


def add_schedule_arguments(p: argparse.ArgumentParser) -> None:
    """--eval-every-secs and --checkpoint-steps (shared with `retrain`)."""
    p.add_argument(
        "--eval-every-secs",
        type=cli.positive_int,
        default=DEFAULT_EVAL_EVERY_SECS,
        help="evaluate on the test set at most this often while training (default: %(default)s)",
    )
    p.add_argument(
        "--checkpoint-steps",
        type=cli.positive_int,
        default=DEFAULT_CHECKPOINT_STEPS,
        help="save a checkpoint every N steps, the point a killed run resumes from "
        "(default: %(default)s)",
    )


def add_hook_arguments(p: argparse.ArgumentParser) -> None:
    """--hooks and --check-numerics (shared with `retrain`)."""
    p.add_argument(
        "--hooks",
        type=cli.name_list,
        default=list(DEFAULT_HOOKS),
        help=f"session hooks attached in training, evaluation and prediction, comma-separated "
        f"({'; '.join(f'{name}: {entry.description}' for name, entry in HOOKS.items())}; "
        f"'none' for none) (default: {','.join(DEFAULT_HOOKS)})",
    )
    p.add_argument(
        "--check-numerics",
        action="store_true",
        help="check the logits and the loss for NaN/Inf at every step; the first one stops "
        "training with the tensor's name (the last checkpoint stays good)",
    )


def add_arguments(train: argparse.ArgumentParser) -> None:
    """The `train` subcommand's options."""
    cli.add_data_arguments(train)
    add_run_arguments(train, any_data=True)
    cli.add_budget_arguments(train, DEFAULT_EPOCHS)
    add_model_arguments(train)
    add_schedule_arguments(train)
    train.add_argument(
        "--no-export", action="store_true", help="train and evaluate only; export nothing"
    )
    add_hook_arguments(train)
    tune = train.add_mutually_exclusive_group()
    tune.add_argument(
        "--warm-start-from",
        metavar="CKPT_OR_DIR",
        help="start a new run from a checkpoint's variables (tf.estimator.WarmStartSettings); "
        "a directory means its latest checkpoint",
    )
    tune.add_argument(
        "--fine-tune-from",
        metavar="CKPT",
        help="start a new run restoring only --fine-tune-scopes from a checkpoint (a "
        "Scaffold init_fn); a directory means its latest checkpoint",
    )
    train.add_argument(
        "--warm-start-vars",
        metavar="REGEX",
        default=".*",
        help="with --warm-start-from: the trainable variables to warm-start, matched from the "
        "start of their names, e.g. 'cnn/conv.*' (cnn) or 'keras/conv.*' (keras) (default: all)",
    )
    train.add_argument(
        "--fine-tune-scopes",
        type=cli.name_list,
        default=None,
        metavar="SCOPES",
        help="with --fine-tune-from: comma-separated scopes to restore, e.g. conv1,conv2 "
        "(the CNNs' layers: conv1, conv2, dense1, logits)",
    )
    train.add_argument(
        "--max-worker-delay-secs",
        type=cli.non_negative_int,
        default=None,
        metavar="SECS",
        help="TF_CONFIG workers: the longest a worker waits before training (TensorFlow "
        "staggers worker i by (i + 1) x 5 s so the chief's first steps settle)",
    )
    train.add_argument(
        "--num-gpus",
        type=cli.positive_int,
        default=None,
        help="train with MirroredStrategy over this many GPUs of this host (falls back to the "
        "CPU, and says so, when there is none); not with TF_CONFIG",
    )
    add_any_data_arguments(train)


def model_params(
    options: ModelOptions, kind: str, max_steps: int, pixel_stats: tuple[float, float]
) -> dict:
    """The params of one run: what make_estimator builds and params.json records."""
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


def numerics_failure(err) -> str | None:
    """'logits : Tensor had NaN values' from a check_numerics failure, else None."""
    found = _NUMERICS_FAILURE.search(getattr(err, "message", str(err)))
    return found.group(0) if found else None


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
    max_steps = cli.budget_steps(config, DEFAULT_EPOCHS, steps_per_epoch)
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


def train_and_evaluate(
    estimator,
    train_input,
    eval_input,
    max_steps: int,
    model_dir,
    batch_size: int,
    eval_every_secs: int,
    label: str = "train",
) -> None:
    """tf.estimator.train_and_evaluate to max_steps with the progress display, evaluating on
    eval_input at most every eval_every_secs; a NaN turned into NumericsError.

    Raises:
        NumericsError: --check-numerics stopped a step, or the loss became NaN (the message
            says which checkpoint is good).
    """
    try:
        tf.estimator.train_and_evaluate(
            estimator,
            tf.estimator.TrainSpec(
                train_input,
                max_steps=max_steps,
                hooks=[ProgressHook(max_steps, batch_size, label=label)],
            ),
            tf.estimator.EvalSpec(
                eval_input,
                steps=None,
                start_delay_secs=0,
                throttle_secs=eval_every_secs,
            ),
        )
    except tf.errors.InvalidArgumentError as err:
        problem = numerics_failure(err)
        if problem is None:
            raise
        raise NumericsError(
            f"--check-numerics stopped training: {problem}; the last checkpoint "
            f"(step {runs.latest_step(model_dir)}) in {model_dir} is kept"
        ) from err
    except tf.estimator.NanLossDuringTrainingError as err:
        # The Estimator's own NanTensorHook looks at the loss only, after the update ran, and
        # after a checkpoint of that very step may have been saved.
        latest, finite = runs.latest_step(model_dir), runs.newest_finite_checkpoint(model_dir)
        state = (
            f"the last checkpoint (step {latest}) in {model_dir} is kept"
            if finite and finite[1] == latest
            else f"the latest checkpoint (step {latest}) in {model_dir} already holds NaN/Inf "
            + (f"weights; the newest finite one is {finite[0]}" if finite else "weights")
        )
        raise NumericsError(
            f"the loss became NaN and training stopped; {state}; --check-numerics names the "
            "first tensor that goes bad and stops the step before its update"
        ) from err


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
