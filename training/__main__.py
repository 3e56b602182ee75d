"""Command line: `python -m training
{train,evaluate,export,predict,compare,promote,retrain,publish,sample-data,
expire-feedback} --help`."""

from __future__ import annotations

import sys

from artifact.logs import FORMATS, configure_logging, formatter_for, print_as_json_lines
from artifact.quiet import quiet_tensorflow


def log_format_of(argv: list[str]) -> str:
    """--log-format's value wherever it is given (before or after the command), or text. A
    value it does not take is text here: the parser refuses it afterwards."""
    for at, argument in enumerate(argv):
        if argument.startswith("--log-format="):
            value = argument.split("=", 1)[1]
        elif argument == "--log-format" and at + 1 < len(argv):
            value = argv[at + 1]
        else:
            continue
        return value if value in FORMATS else "text"
    return "text"


def set_up_logs(argv: list[str]) -> None:
    """JSON lines when --log-format json asks (every line printed, TensorFlow's log and an
    uncaught exception: one JSON object each); TensorFlow imported quietly either way."""
    log_format = log_format_of(argv)
    if log_format == "json":
        configure_logging("json", "info")
        print_as_json_lines("training")
    verbose = any(a in ("-v", "--verbose") for a in argv)
    quiet_tensorflow(verbose=verbose, formatter=formatter_for(log_format))


# First, before anything imports TensorFlow: its import-time noise is filtered here, and the
# parser's help (model kinds, hooks) comes from modules that import it.
set_up_logs(sys.argv[1:])

import argparse  # noqa: E402

import tensorflow as tf  # noqa: E402

from training import determinism  # noqa: E402
from training.commands import (  # noqa: E402
    compare,
    evaluate,
    expire_feedback,
    export,
    predict,
    promote,
    publish,
    retrain,
    sample_data,
    train,
)
from training.data import DataError  # noqa: E402
from training.errors import NumericsError, UsageError  # noqa: E402

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training",
        description="Train Estimators (the reference CNN and its baselines) on MNIST-format "
        "data, or pre-made Estimators on a CSV file and a CNN on an image folder; export "
        "them, compare them, and predict with an exported version.",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show TensorFlow's INFO log lines too"
    )
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default="text",
        help="text: lines for a person; json: every line one JSON object (time, level, "
        "logger, message), for a log pipeline (a retrain CronJob's) (default: text)",
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
    evaluate.add_arguments(
        sub.add_parser(
            "evaluate",
            help="evaluate a model dir's checkpoint or an exported version (a CSV or image "
            "model on --csv or --image-folder); the task's report",
        )
    )
    export.add_arguments(
        sub.add_parser("export", help="export a model dir's latest checkpoint as a new version")
    )
    predict.add_arguments(
        sub.add_parser(
            "predict",
            help="predict an IDX file, a .npy array, images or a CSV file with an exported "
            "version; JSON lines out",
            description="Batch prediction with an exported version's SavedModel (what the "
            "service serves): one JSON line per image or CSV row with what the service's "
            "friendly answer holds (a classifier's class_id, label and probabilities by label; "
            "a regressor's value) and its index or file name.",
        )
    )
    compare.add_arguments(
        sub.add_parser(
            "compare",
            help="train every model kind on the same data and budget; a table, best first",
            description="The recommended workflow: train each kind (cnn, linear, dnn, keras; "
            "with --csv linear, dnn, dnn_linear; with --image-folder cnn, keras) for the same "
            "steps, batch size, learning rate and seed, export each to WORK_DIR/models/KIND, "
            "and print and save (WORK_DIR/comparison.md and .json) the task's metric "
            "(accuracy and per-class recall; a regressor's RMSE, MAE and largest slice error), "
            "training time, parameter count and export size, best first.",
        )
    )
    promote.add_arguments(
        sub.add_parser(
            "promote",
            help="move a version label (stable, canary) or change the version policy in TF "
            "Serving's model config, atomically",
            description="Edit the model config the service and TF Serving read: point a label "
            "at a version (rolling back is promoting the previous one) and/or set the version "
            "policy. The file is replaced atomically; what changed is printed.",
        )
    )
    retrain.add_arguments(
        sub.add_parser(
            "retrain",
            help="retrain on the data plus new labeled data (folders, the service's feedback), "
            "gated: published only if it is not worse than the serving version",
            description="Train a candidate warm-started from the serving version's checkpoint "
            "on the base data, --extra-data folders and the service's feedback; evaluate it "
            "and the serving version on the same held-out data; publish it as the next version "
            "(and move a label) only if it passes the thresholds. Exit codes: 0 published, "
            "1 crash, 2 bad input, 3 not blessed (nothing changed in the model repository), "
            "75 another retrain holds the lock.",
        )
    )
    publish.add_arguments(
        sub.add_parser(
            "publish",
            help="publish what a retrain with --stage-to left (checked, the next version, a "
            "label moved); loads no model",
            description="The small step with write access to the model repository: check what "
            "a `retrain --stage-to DIR` staged (every file unchanged since, by its sha256; the "
            "blessing says blessed, against the version that still serves), publish it "
            "atomically as the next version and move --publish's label. Exit codes: 0 "
            "published (or nothing to publish), 1 crash, 2 refused (nothing changed), 3 the "
            "retrain did not bless its candidate, 75 another retrain holds the repository.",
        )
    )
    expire_feedback.add_arguments(
        sub.add_parser(
            "expire-feedback",
            help="remove the service's feedback older than some days from its store "
            "(shards removed or compacted, crash-safe)",
            description="Remove the images of a model's feedback store (FEEDBACK_DIR/MODEL) "
            "received more than --max-age-days ago: a shard of only old images is removed, a "
            "shard with some is rewritten without them (a new shard written and fsynced, then "
            "renamed in, then the old one removed: a crash loses nothing). Needs write access "
            "to the store; the service may keep writing meanwhile.",
        )
    )
    sample_data.add_arguments(
        sub.add_parser(
            "sample-data",
            help="write small deterministic example data: a classification CSV, a regression "
            "CSV and an image folder (for train --csv / --image-folder)",
            description="Write, from a fixed seed and without downloading anything: "
            "classification.csv (numeric x1, x2, integer rooms, string color; label "
            "low/mid/high), regression.csv (x1, x2, rooms, city; float price) and shapes/ "
            "(40x30 RGB circles, squares and triangles, one subfolder per class).",
        )
    )
    for command in sub.choices.values():
        # After the command too (`python -m training retrain --log-format json`).
        command.add_argument(
            "--log-format", choices=FORMATS, default=argparse.SUPPRESS, help="as before the command"
        )
    return parser


INTERRUPTED = {
    "train": "the last saved checkpoint is kept; run the same command to resume.",
    "evaluate": "no report written.",
    "export": "no version published.",
    "predict": "no output written.",
    "compare": "the kinds done so far are in the work dir; the table was not written.",
    "promote": "the model config was left as it was.",
    "retrain": "nothing was published; run the same command to resume from its last checkpoint.",
    "publish": "the model repository has the new version whole or not at all; run it again.",
    "sample-data": "the files written so far are in the output folder.",
    "expire-feedback": "every shard is whole: the old one or its compacted copy.",
}
COMMANDS = {
    "train": train.run,
    "evaluate": evaluate.run,
    "export": export.run,
    "predict": predict.run,
    "compare": compare.run,
    "promote": promote.run,
    "retrain": retrain.run,
    "publish": publish.run,
    "sample-data": sample_data.run,
    "expire-feedback": expire_feedback.run,
}


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    # Again for callers that pass argv (tests): -v and --log-format there decide.
    set_up_logs(given)
    args = build_parser().parse_args(argv)
    try:
        # The thread pools and op determinism of --deterministic (train, compare, retrain);
        # each command's config defaults its seed.
        with determinism.applied(getattr(args, "deterministic", False)):
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
