"""`python -m training train --csv FILE` and `train --image-folder DIR`: any data, not only IDX.

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
from pathlib import Path

import tensorflow as tf

from artifact.storage import location
from training import cli, determinism, distributed, image_folder, runs, tabular
from training.errors import UsageError
from training.evaluation import format_report
from training.hooks import ProgressHook
from training.runs import EVAL_BATCH_SIZE
from training.tabular_schema import DEFAULT_MAX_VOCABULARY, infer_schema

# Options of one kind of data: option -> args attribute (None when not given).
CSV_ONLY = {
    "--label": "label",
    "--task": "task",
    "--max-vocabulary": "max_vocabulary",
    "--receiver": "receiver",
}
FOLDER_ONLY = {"--image-size": "image_size", "--channels": "channels"}
# Options of the IDX kinds that these runs do not support (yet).
_IDX_ONLY = {
    "--warm-start-from": "warm_start_from",
    "--fine-tune-from": "fine_tune_from",
    "--check-numerics": "check_numerics",
    "--num-gpus": "num_gpus",
}


def data_name(args) -> str:
    """The model's default name: the CSV file's stem or the image folder's name."""
    return Path(args.csv).stem if args.csv else Path(args.image_folder).resolve().name


def refuse_options(args, options: dict[str, str], for_what: str) -> None:
    """UsageError naming the first of `options` given: they are for `for_what` only."""
    for option, attribute in options.items():
        if getattr(args, attribute) is not None:
            raise UsageError(f"{option} is for {for_what}")


def _check_options(args) -> None:
    """Refuse what does not apply to the data; fill in the defaults of what does."""
    source = "--csv" if args.csv else "--image-folder"
    for option, attribute in _IDX_ONLY.items():
        if getattr(args, attribute):
            raise UsageError(f"{option} is for the IDX image kinds; not with {source}")
    if distributed.read_tf_config() is not None:
        raise UsageError(f"TF_CONFIG is set: {source} trains on one host only; unset it")
    if args.csv:
        if args.model not in (None, *tabular.TABULAR_KINDS):
            raise UsageError(
                f"--model {args.model} is not for --csv; use {', '.join(tabular.TABULAR_KINDS)}"
            )
        refuse_options(args, FOLDER_ONLY, "--image-folder")
        args.label = args.label or "label"
        args.max_vocabulary = args.max_vocabulary or DEFAULT_MAX_VOCABULARY
        args.receiver = args.receiver or "raw"
        return
    if args.model not in (None, *image_folder.IMAGE_KINDS):
        raise UsageError(
            f"--model {args.model} is not for --image-folder; use "
            f"{' or '.join(image_folder.IMAGE_KINDS)}"
        )
    # An image folder's classes are its subfolders, and its receiver is raw.
    refuse_options(args, CSV_ONLY, "--csv")
    args.image_size = args.image_size or image_folder.DEFAULT_IMAGE_SIZE
    args.channels = args.channels or image_folder.DEFAULT_CHANNELS
    args.receiver = "raw"


def run_params(args, kind: str, max_steps: int, receiver: str, data: dict) -> dict:
    """The params of a CSV or image-folder run: what its Estimator is built from and
    params.json records (`train`'s, and a retrain's of such a model)."""
    return {
        "model": kind,
        **cli.schedule_params(args, max_steps),
        "receiver": receiver,
        "data": data,
    }


def run_config(args, model_dir: Path) -> tf.estimator.RunConfig:
    """The RunConfig of a CSV or image-folder run (`train`'s, and a retrain's of such a
    model): the seed, checkpoint interval, summaries and --deterministic's sessions."""
    return tf.estimator.RunConfig(
        model_dir=str(model_dir),
        tf_random_seed=args.seed,
        save_checkpoints_steps=args.checkpoint_steps,
        save_summary_steps=100,
        keep_checkpoint_max=3,
        log_step_count_steps=100,
        session_config=determinism.session_config(getattr(args, "deterministic", False)),
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
    """What train_any did: the kind trained, its budget (steps, and the training examples one
    epoch holds), how long it took, and the version it exported with its evaluation report
    (None with --no-export)."""

    kind: str
    model_dir: Path
    max_steps: int
    train_examples: int
    train_seconds: float
    version: Path | str | None
    report: dict | None


def cmd_train_any(args, default_epochs: float) -> int:
    """Train on a CSV file or an image folder; export a new version unless --no-export."""
    run = train_any(args, default_epochs)
    if run.version is not None and run.report is not None:
        print(format_report(run.report), flush=True)
        print(f"Exported {run.version} after {run.train_seconds / 60:.1f} min of training.")
        sys.stdout.flush()
    return 0


def train_any(args, default_epochs: float) -> TrainedRun:
    """Train args.model (or the data's default kind) on args.csv or args.image_folder to the
    budget, evaluating on the held-out rows or images; export unless args.no_export.

    Raises:
        UsageError / DataError: options that do not apply, bad data, a model dir of another
            run; all before anything is written.
    """
    _check_options(args)
    name = data_name(args)
    model_dir = Path(args.model_dir or f"runs/{name}")
    export_dir = location(args.export_dir or f"models/{name}")
    if args.csv:
        schema = infer_schema(args.csv, args.label, args.task, args.max_vocabulary)
        kind, count, data = args.model or "linear", schema.train_rows, schema.to_json()
    else:
        folder = image_folder.scan_image_folder(args.image_folder)
        kind, count, data = args.model or "cnn", len(folder.train), folder.to_json()
        data = {**data, "image_size": args.image_size, "channels": args.channels}
    steps_per_epoch = math.ceil(count / args.batch_size)
    max_steps = cli.budget_steps(args, default_epochs, steps_per_epoch)
    params = run_params(args, kind, max_steps, args.receiver, data)
    _check_resumable(model_dir, params)
    config = run_config(args, model_dir)
    if args.csv:
        estimator = tabular.make_estimator(schema, params, config)

        def train_input():
            return tabular.train_input_fn(schema, args.batch_size, args.seed)

        def eval_input():
            return tabular.eval_input_fn(schema, EVAL_BATCH_SIZE)

        what = f"{count:,} rows of {args.csv} ({schema.task}, label {schema.label!r})"
    else:
        params["num_classes"] = len(folder.classes)
        estimator = image_folder.make_estimator(params, config)
        size, channels = args.image_size, args.channels

        def train_input():
            return image_folder.train_input_fn(folder, size, channels, args.batch_size, args.seed)

        def eval_input():
            return image_folder.eval_input_fn(folder, size, channels, EVAL_BATCH_SIZE)

        what = (
            f"{count:,} images of {len(folder.classes)} classes from {args.image_folder} "
            f"({size}x{size}x{channels})"
        )
    # Everything is checked: from here on the run writes.
    model_dir.mkdir(parents=True, exist_ok=True)
    runs.write_params(model_dir, params)
    start_step = runs.latest_step(model_dir)
    print(
        f"Training on {what}, model {kind}; model dir {model_dir}"
        + (f", resuming at step {start_step}" if start_step else ""),
        flush=True,
    )
    started = time.perf_counter()
    if start_step < max_steps:
        tf.estimator.train_and_evaluate(
            estimator,
            tf.estimator.TrainSpec(
                train_input,
                max_steps=max_steps,
                hooks=[ProgressHook(max_steps, args.batch_size, label="train")],
            ),
            tf.estimator.EvalSpec(
                eval_input, steps=None, start_delay_secs=0, throttle_secs=args.eval_every_secs
            ),
        )
    else:
        print(f"{model_dir} is already at step {start_step} >= {max_steps}: nothing to train.")
    train_seconds = time.perf_counter() - started
    if args.no_export:
        return TrainedRun(kind, model_dir, max_steps, count, train_seconds, None, None)
    source = args.csv or args.image_folder
    context = runs.report_context(source, model_dir, params, train_seconds)
    context["split"] = "holdout"
    if args.csv:
        version, report = tabular.export_tabular(
            estimator, schema, export_dir, args.receiver, context
        )
    else:
        version, report = image_folder.export_image_model(
            estimator, folder, args.image_size, args.channels, export_dir, context
        )
    return TrainedRun(kind, model_dir, max_steps, count, train_seconds, version, report)
