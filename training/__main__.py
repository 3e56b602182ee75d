"""Command line: `python -m training {train,evaluate,export,predict,compare} --help`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from training import cli, compare, predict, runs, train
from training.cli import DEFAULT_EXPORT_DIR, DEFAULT_MODEL_DIR
from training.data import DataError
from training.errors import NumericsError, UsageError
from training.runs import EVAL_BATCH_SIZE

__all__ = ["DEFAULT_EXPORT_DIR", "DEFAULT_MODEL_DIR", "UsageError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training",
        description="Train Estimators (the reference CNN and its baselines) on MNIST-format "
        "data, export them, compare them, and predict with an exported version.",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show TensorFlow's INFO log lines too"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    train.add_arguments(
        sub.add_parser(
            "train",
            help="train (resuming from --model-dir), evaluate, export",
            description="Train one model kind, evaluate it on the test split while it trains, "
            "and export a new version. With TF_CONFIG set, this process is one task of a "
            "cluster (chief, worker, ps or evaluator): run the same command on every task "
            "with a --model-dir they all reach; the chief exports when training is done.",
        )
    )

    evaluate = sub.add_parser(
        "evaluate", help="evaluate a model dir's checkpoint or an exported version"
    )
    evaluate.add_argument(
        "path",
        help="a --model-dir with checkpoints, an exported version (models/NAME/VERSION) "
        "or a model folder (its newest version)",
    )
    cli.add_data_arguments(evaluate)
    evaluate.add_argument(
        "--output",
        default="evaluation.json",
        help="where to write the report (default: %(default)s)",
    )

    export = sub.add_parser(
        "export", help="export a model dir's latest checkpoint as a new version"
    )
    cli.add_data_arguments(export)
    export.add_argument("--model-dir", default=DEFAULT_MODEL_DIR, help="default: %(default)s")
    export.add_argument("--export-dir", default=DEFAULT_EXPORT_DIR, help="default: %(default)s")

    predict.add_arguments(
        sub.add_parser(
            "predict",
            help="classify an IDX file, a .npy array or a folder of images with an exported "
            "version; JSON lines out",
            description="Batch prediction with an exported version's SavedModel (what the "
            "service serves): one JSON line per image with the service's /predict answer "
            "(class_id, label, probabilities by label) and its index or file name.",
        )
    )
    compare.add_arguments(
        sub.add_parser(
            "compare",
            help="train every model kind on the same data and budget; a table, best first",
            description="The recommended workflow: train each kind (cnn, linear, dnn, keras) "
            "for the same steps, batch size, learning rate and seed, export each to "
            "WORK_DIR/models/KIND, and print and save (WORK_DIR/comparison.md and .json) "
            "test accuracy, per-class recall, training time, parameter count and export "
            "size, best first.",
        )
    )
    return parser


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
        labels = read_labels_file(version_path) or cli.labels(args)
        source = {"saved_model": str(version_path)}
    else:
        import numpy as np

        from training.estimator import make_estimator

        params = runs.load_params(path)
        estimator = make_estimator(str(path), params)
        if runs.latest_step(path) == 0:
            raise UsageError(f"{path}: holds no checkpoint")
        predictions = estimator.predict(
            lambda: data.predict_input_fn(test_images, EVAL_BATCH_SIZE), predict_keys=["classes"]
        )
        classes = np.fromiter((p["classes"] for p in predictions), np.int64, len(test_images))
        labels = tuple(params.get("labels") or cli.labels(args))
        source = {"model_dir": str(path), "global_step": runs.latest_step(path)}
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

    model_dir = Path(args.model_dir)
    params = runs.load_params(model_dir)
    step = runs.latest_step(model_dir)
    if step == 0:
        raise UsageError(f"{model_dir}: holds no checkpoint to export")
    labels = tuple(params.get("labels") or cli.labels(args))
    _, test_images, test_labels = data.load_split(args.data_dir, "test")
    estimator = make_estimator(str(model_dir), params)
    context = {
        "data_dir": str(args.data_dir),
        "split": "test",
        "global_step": step,
        "model_dir": str(model_dir),
        "params": {k: v for k, v in params.items() if k != "labels"},
    }
    version = runs.export_evaluated(
        estimator, args.export_dir, labels, test_images, test_labels, context
    )
    print(f"Exported step {step} of {model_dir} as {version}")
    return 0


INTERRUPTED = {
    "train": "the last saved checkpoint is kept; run the same command to resume.",
    "evaluate": "no report written.",
    "export": "no version published.",
    "predict": "no output written.",
    "compare": "the kinds done so far are in the work dir; the table was not written.",
}
COMMANDS = {
    "train": train.cmd_train,
    "evaluate": cmd_evaluate,
    "export": cmd_export,
    "predict": predict.cmd_predict,
    "compare": compare.cmd_compare,
}


def main(argv: list[str] | None = None) -> int:
    from training.quiet import quiet_tensorflow

    # Before the parser: its help lists the model kinds and hooks, which import TensorFlow.
    given = sys.argv[1:] if argv is None else argv
    quiet_tensorflow(verbose=any(a in ("-v", "--verbose") for a in given))
    args = build_parser().parse_args(argv)
    import tensorflow as tf

    try:
        return COMMANDS[args.command](args)
    except (DataError, UsageError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except NumericsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
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
        print(f"\ninterrupted: {INTERRUPTED[args.command]}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
