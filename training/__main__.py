"""Command line: `python -m training {train,evaluate,export} --help`."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from training.contract import LABEL_PRESETS, resolve_labels
from training.data import DEFAULT_DATA_DIR, DataError

DEFAULT_MODEL_DIR = "runs/fashion_mnist"
DEFAULT_EXPORT_DIR = "models/fashion_mnist"
PARAMS_FILE = "params.json"
# Measured here (README): 10 epochs of batch 100, Adam 1e-3 with cosine decay: 0.93 in ~3.5 min.
DEFAULT_EPOCHS = 10
DEFAULT_BATCH_SIZE = 100
DEFAULT_LEARNING_RATE = 1e-3
EVAL_BATCH_SIZE = 500


class UsageError(Exception):
    """A user's mistake: printed as one line, exit code 2."""


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


# argparse names the type in "invalid <name> value: 'ten'".
_positive_int.__name__ = "positive integer"
_positive_float.__name__ = "positive number"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training",
        description="Train the reference CNN Estimator on MNIST-format data and export it.",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show TensorFlow's INFO log lines too"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add_data(p):
        p.add_argument(
            "--data-dir",
            default=DEFAULT_DATA_DIR,
            help="MNIST-format directory with train-/t10k- images and labels IDX files, "
            "gzipped or not (default: %(default)s, Debian's dataset-fashion-mnist)",
        )
        p.add_argument(
            "--labels",
            default="auto",
            help=f"class names: a preset ({', '.join(LABEL_PRESETS)}), 10 comma-separated "
            "names, or 'auto' (fashion when the data dir's path says fashion, else digits)",
        )

    train = sub.add_parser("train", help="train (resuming from --model-dir), evaluate, export")
    add_data(train)
    train.add_argument(
        "--model-dir",
        default=DEFAULT_MODEL_DIR,
        help="checkpoints and TensorBoard events; an existing run resumes (default: %(default)s)",
    )
    train.add_argument(
        "--export-dir",
        default=DEFAULT_EXPORT_DIR,
        help="model repository folder that receives a new integer version (default: %(default)s)",
    )
    steps = train.add_mutually_exclusive_group()
    steps.add_argument(
        "--epochs",
        type=_positive_float,
        default=None,
        help=f"passes over the training set (default: {DEFAULT_EPOCHS})",
    )
    steps.add_argument(
        "--max-steps", type=_positive_int, help="train to this global step instead of --epochs"
    )
    train.add_argument(
        "--batch-size",
        type=_positive_int,
        default=DEFAULT_BATCH_SIZE,
        help="examples per step (default: %(default)s)",
    )
    train.add_argument(
        "--learning-rate",
        type=_positive_float,
        default=DEFAULT_LEARNING_RATE,
        help="Adam's initial learning rate, cosine-decayed to 0 by the last step "
        "(default: %(default)s)",
    )
    train.add_argument(
        "--constant-learning-rate",
        action="store_true",
        help="keep the learning rate constant instead of decaying it",
    )
    train.add_argument(
        "--data-format",
        choices=("channels_last", "channels_first"),
        default="channels_last",
        help="tensor layout inside the CNN: channels_last (CPU) or channels_first (faster on "
        "GPU) (default: %(default)s)",
    )
    train.add_argument(
        "--seed", type=int, default=None, help="seed for weights and shuffling (default: random)"
    )
    train.add_argument(
        "--eval-every-secs",
        type=_positive_int,
        default=120,
        help="evaluate on the test set at most this often while training (default: %(default)s)",
    )
    train.add_argument(
        "--checkpoint-steps",
        type=_positive_int,
        default=1000,
        help="save a checkpoint every N steps, the point a killed run resumes from "
        "(default: %(default)s)",
    )
    train.add_argument(
        "--no-export", action="store_true", help="train and evaluate only; export nothing"
    )

    evaluate = sub.add_parser(
        "evaluate", help="evaluate a model dir's checkpoint or an exported version"
    )
    evaluate.add_argument(
        "path",
        help="a --model-dir with checkpoints, an exported version (models/NAME/VERSION) "
        "or a model folder (its newest version)",
    )
    add_data(evaluate)
    evaluate.add_argument(
        "--output",
        default="evaluation.json",
        help="where to write the report (default: %(default)s)",
    )

    export = sub.add_parser(
        "export", help="export a model dir's latest checkpoint as a new version"
    )
    add_data(export)
    export.add_argument("--model-dir", default=DEFAULT_MODEL_DIR, help="default: %(default)s")
    export.add_argument("--export-dir", default=DEFAULT_EXPORT_DIR, help="default: %(default)s")
    return parser


def _labels(args) -> tuple[str, ...]:
    try:
        return resolve_labels(args.labels, args.data_dir)
    except ValueError as err:
        raise UsageError(str(err)) from err


def _load_params(model_dir: Path) -> dict:
    path = model_dir / PARAMS_FILE
    if not path.is_file():
        raise UsageError(f"{model_dir}: not a model dir of this tool (no {PARAMS_FILE})")
    return json.loads(path.read_text())


def _check_resumable(model_dir: Path, data_format: str) -> None:
    """Refuse to resume a run whose layout differs: the weights load but mean something else."""
    path = model_dir / PARAMS_FILE
    if path.is_file():
        previous = json.loads(path.read_text()).get("data_format")
        if previous and previous != data_format:
            raise UsageError(
                f"{model_dir}: was trained with --data-format {previous}, not {data_format}; "
                "use a new --model-dir"
            )


def _latest_step(model_dir: Path) -> int:
    import tensorflow as tf

    checkpoint = tf.train.latest_checkpoint(str(model_dir))
    if checkpoint is None:
        return 0
    return int(tf.train.load_variable(checkpoint, "global_step"))


def _exported_version_of(export_dir: Path, model_dir: Path, step: int) -> Path | None:
    """The newest version exported from this model dir at this step, if any."""
    from training.saved_model import read_report, version_dirs

    for _, path in reversed(version_dirs(export_dir)):
        report = read_report(path) or {}
        if report.get("model_dir") == str(model_dir) and report.get("global_step") == step:
            return path
    return None


def _report_builder(test_images, test_labels, labels, context):
    """A build_report callback evaluating the staged SavedModel itself on the test split."""
    from training.contract import normalize_pixels
    from training.evaluation import build_report
    from training.saved_model import SavedModelPredictor

    def build(version_path: Path) -> dict:
        predictor = SavedModelPredictor(version_path)
        classes, _ = predictor.predict_batched(normalize_pixels(test_images), EVAL_BATCH_SIZE)
        return build_report(test_labels, classes, labels, **context)

    return build


def cmd_train(args) -> int:
    import tensorflow as tf

    from training import data
    from training.estimator import make_estimator
    from training.evaluation import format_report
    from training.export import export_model
    from training.hooks import ProgressHook, train_accuracy_hook

    labels = _labels(args)
    train_split = data.validate_split(args.data_dir, "train")
    test_split, test_images, test_labels = data.load_split(args.data_dir, "test")
    steps_per_epoch = math.ceil(train_split.count / args.batch_size)
    max_steps = args.max_steps or math.ceil((args.epochs or DEFAULT_EPOCHS) * steps_per_epoch)

    model_dir = Path(args.model_dir)
    _check_resumable(model_dir, args.data_format)
    model_dir.mkdir(parents=True, exist_ok=True)
    params = {
        "model": "cnn",
        "data_format": args.data_format,
        "learning_rate": args.learning_rate,
        "decay_steps": None if args.constant_learning_rate else max_steps,
        "batch_size": args.batch_size,
        "max_steps": max_steps,
        "seed": args.seed,
        "data_dir": str(args.data_dir),
        "labels": list(labels),
    }
    start_step = _latest_step(model_dir)
    (model_dir / PARAMS_FILE).write_text(json.dumps(params, indent=2) + "\n")
    print(
        f"Training on {train_split.count:,} images from {args.data_dir} "
        f"({steps_per_epoch} steps/epoch); model dir {model_dir}"
        + (f", resuming at step {start_step}" if start_step else ""),
        flush=True,
    )
    estimator = make_estimator(
        str(model_dir),
        data_format=args.data_format,
        learning_rate=args.learning_rate,
        decay_steps=params["decay_steps"],
        seed=args.seed,
        save_checkpoints_steps=args.checkpoint_steps,
    )
    started = time.perf_counter()
    if start_step < max_steps:
        tf.estimator.train_and_evaluate(
            estimator,
            tf.estimator.TrainSpec(
                lambda: data.train_input_fn(train_split, args.batch_size, args.seed),
                max_steps=max_steps,
                hooks=[ProgressHook(max_steps, args.batch_size), train_accuracy_hook(100)],
            ),
            tf.estimator.EvalSpec(
                lambda: data.eval_input_fn(test_split, EVAL_BATCH_SIZE),
                steps=None,
                start_delay_secs=0,
                throttle_secs=args.eval_every_secs,
            ),
        )
    else:
        print(f"{model_dir} is already at step {start_step} >= {max_steps}: nothing to train.")
        exported = _exported_version_of(Path(args.export_dir), model_dir, start_step)
        if exported is not None and not args.no_export:
            print(f"Step {start_step} is already exported as {exported}; not exporting it again.")
            return 0
    train_seconds = time.perf_counter() - started
    if args.no_export:
        return 0
    context = {
        "data_dir": str(args.data_dir),
        "split": "test",
        "global_step": _latest_step(model_dir),
        "train_seconds": round(train_seconds, 1),
        "model_dir": str(model_dir),
        "params": {k: v for k, v in params.items() if k != "labels"},
    }
    version = export_model(
        estimator,
        args.export_dir,
        labels,
        _report_builder(test_images, test_labels, labels, context),
    )
    from training.saved_model import read_report

    print(format_report(read_report(version)), flush=True)
    print(f"Exported {version} after {train_seconds / 60:.1f} min of training.")
    return 0


def cmd_evaluate(args) -> int:
    from training import data
    from training.evaluation import build_report, format_report
    from training.saved_model import version_dirs

    path = Path(args.path)
    _, test_images, test_labels = data.load_split(args.data_dir, "test")
    if not path.exists():
        raise UsageError(f"{path}: not found")
    versions = version_dirs(path)
    if (path / "saved_model.pb").is_file() or versions:
        from training.contract import normalize_pixels
        from training.saved_model import SavedModelPredictor, read_labels_file

        version_path = path if (path / "saved_model.pb").is_file() else versions[-1][1]
        predictor = SavedModelPredictor(version_path)
        classes, _ = predictor.predict_batched(normalize_pixels(test_images), EVAL_BATCH_SIZE)
        labels = read_labels_file(version_path) or _labels(args)
        source = {"saved_model": str(version_path)}
    else:
        import numpy as np

        from training.estimator import make_estimator

        params = _load_params(path)
        estimator = make_estimator(str(path), data_format=params["data_format"])
        if _latest_step(path) == 0:
            raise UsageError(f"{path}: holds no checkpoint")
        predictions = estimator.predict(
            lambda: data.predict_input_fn(test_images, EVAL_BATCH_SIZE), predict_keys=["classes"]
        )
        classes = np.fromiter((p["classes"] for p in predictions), np.int64, len(test_images))
        labels = tuple(params.get("labels") or _labels(args))
        source = {"model_dir": str(path), "global_step": _latest_step(path)}
    report = build_report(
        test_labels, classes, labels, data_dir=str(args.data_dir), split="test", **source
    )
    print(format_report(report))
    Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    print(f"Wrote {args.output}")
    return 0


def cmd_export(args) -> int:
    from training import data
    from training.estimator import make_estimator
    from training.export import export_model

    model_dir = Path(args.model_dir)
    params = _load_params(model_dir)
    step = _latest_step(model_dir)
    if step == 0:
        raise UsageError(f"{model_dir}: holds no checkpoint to export")
    labels = tuple(params.get("labels") or _labels(args))
    _, test_images, test_labels = data.load_split(args.data_dir, "test")
    estimator = make_estimator(str(model_dir), data_format=params["data_format"])
    context = {
        "data_dir": str(args.data_dir),
        "split": "test",
        "global_step": step,
        "model_dir": str(model_dir),
        "params": {k: v for k, v in params.items() if k != "labels"},
    }
    version = export_model(
        estimator,
        args.export_dir,
        labels,
        _report_builder(test_images, test_labels, labels, context),
    )
    print(f"Exported step {step} of {model_dir} as {version}")
    return 0


COMMANDS = {"train": cmd_train, "evaluate": cmd_evaluate, "export": cmd_export}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from training.quiet import quiet_tensorflow

    quiet_tensorflow(verbose=args.verbose)
    import tensorflow as tf

    try:
        return COMMANDS[args.command](args)
    except (DataError, UsageError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError) as err:
        # Restoring a checkpoint written by a different model lands here.
        if "checkpoint" not in str(err).lower():
            raise
        print(
            f"error: cannot restore the checkpoint in the model dir: {err.message.splitlines()[0]}",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print(
            "\ninterrupted: the last saved checkpoint is kept; run the same command to resume.",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
