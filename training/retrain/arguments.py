"""The retrain's command line: its options, their types and defaults."""

from __future__ import annotations

import argparse
import dataclasses
import math

from training import (
    cli,
    feedback_source,
    kinds,
    lock,
)
from training.configs import run_seed
from training.errors import UsageError
from training.versions import (
    PUBLISH_MODES,
)

# In the model dir: the local copy of a serving version on object storage, judged against.
BASELINE_COPY = ".baseline"
# A warm-started candidate needs fewer passes than a first model (train's default is 10).
DEFAULT_EPOCHS = 2
DEFAULT_HOLDOUT_FRACTION = 0.2
RUN_PREFIX = "retrain-"


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
    cli.add_run_arguments(
        p,
        model_dir_help="runs folder: each retrain trains in a folder of its own under it "
        "(retrain-<hash of the data and options>), which a killed retrain resumes; "
        f"{lock.LOCK_FILE} there keeps one retrain at a time",
        any_data=True,
    )
    cli.add_budget_arguments(p, DEFAULT_EPOCHS)
    cli.add_model_arguments(p, seed=0)
    cli.add_schedule_arguments(p)
    cli.add_hook_arguments(p)
    cli.add_any_data_arguments(p)
    new = p.add_argument_group("new data")
    new.add_argument(
        "--extra-data",
        action="append",
        default=[],
        metavar="PATH",
        help="more labeled data of the model's kind to add: a folder of MNIST-format files "
        "(train- and/or t10k- images and labels), a CSV file with the model's columns, or a "
        "folder of class subfolders of images; repeat for several",
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
        help="share of the new examples held out (never trained on) and added to the test "
        "split to judge the candidate (default: %(default)s)",
    )
    new.add_argument(
        "--holdout-seed",
        type=int,
        default=0,
        help="seed of the held-out split; an example stays on its side from run to run as "
        "long as the seed and fraction stay (default: %(default)s)",
    )
    start = p.add_argument_group("start")
    start.add_argument(
        "--from-scratch",
        action="store_true",
        help="train anew instead of warm-starting from the checkpoint of the serving version",
    )
    gate = p.add_argument_group(
        "blessing (TFX's Evaluator thresholds)",
        "A classifier is judged by its accuracy and recalls (higher is better), a regressor by "
        "its RMSE, MAE and largest slice error (lower is better).",
    )
    gate.add_argument(
        "--min-accuracy",
        type=unit_fraction,
        default=None,
        help="classifiers, value threshold: the candidate's accuracy on the held-out set at "
        "least this",
    )
    gate.add_argument(
        "--max-accuracy-drop",
        type=unit_fraction,
        default=None,
        help="classifiers, change threshold: the candidate's accuracy, overall, on the test "
        "split and on the reference slice, at most this below the serving version's "
        "(default: 0, not worse)",
    )
    gate.add_argument(
        "--max-class-recall-drop",
        type=unit_fraction,
        default=None,
        help="classifiers, change threshold: each class's recall at most this below the "
        "serving version's (default: not checked)",
    )
    gate.add_argument(
        "--max-rmse",
        type=non_negative_float,
        default=None,
        help="regressors, value threshold: the candidate's RMSE on the held-out set at most this",
    )
    gate.add_argument(
        "--max-rmse-increase",
        type=non_negative_float,
        default=None,
        help="regressors, change threshold: the candidate's RMSE, overall, on the test split "
        "and on the reference slice, at most this above the serving version's (default: 0, "
        "not worse)",
    )
    gate.add_argument(
        "--max-mae-increase",
        type=non_negative_float,
        default=None,
        help="regressors, change threshold: the candidate's MAE at most this above the "
        "serving version's (default: not checked)",
    )
    gate.add_argument(
        "--max-slice-error-increase",
        type=non_negative_float,
        default=None,
        help="regressors, change threshold: the largest RMSE of a slice (the rows of one value "
        "of a categorical column) at most this above the serving version's (default: not "
        "checked)",
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
class RetrainConfig:
    """Every option of `retrain` (add_arguments above), typed: what the retrain's code
    reads instead of argparse's Namespace. Built by `from_args` at the command line's edge
    (training/commands/retrain.py); docs/retraining.md says what each option does."""

    # The data and where the model lives (--model-dir and --export-dir after their defaults).
    data_dir: str
    labels: str
    model: str | None
    model_dir: str
    export_dir: str
    csv: str | None
    image_folder: str | None
    label: str | None
    task: str | None
    max_vocabulary: int | None
    receiver: str | None
    image_size: int | None
    channels: int | None
    extra_data: list[str]
    # The budget, the model and its schedule: train's options.
    epochs: float | None
    max_steps: int | None
    batch_size: int
    learning_rate: float
    constant_learning_rate: bool
    data_format: str
    hidden_units: list[int]
    seed: int
    deterministic: bool
    eval_every_secs: int
    checkpoint_steps: int
    hooks: list[str]
    check_numerics: bool
    # The feedback store.
    feedback_dir: str | None
    max_feedback_per_sender: int
    exclude_sender: list[str]
    feedback_max_age_days: float | None
    # The held-out set and the start.
    holdout_fraction: float
    holdout_seed: int
    from_scratch: bool
    # The gate (training/blessing.py): a classifier's, a regressor's.
    min_accuracy: float | None
    max_accuracy_drop: float | None
    max_class_recall_drop: float | None
    max_rmse: float | None
    max_rmse_increase: float | None
    max_mae_increase: float | None
    max_slice_error_increase: float | None
    # Where a blessed candidate goes.
    config: str | None
    publish: str
    stage_to: str | None
    wait_for_lock: float

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RetrainConfig:
        """The parsed command line, its options checked together and --model-dir and
        --export-dir defaulted as `train` defaults them (the data's kind says how).

        Raises:
            UsageError: --publish with --stage-to, or a label to move without --config.
        """
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
        kind = kinds.chosen(args)
        model_dir, export_dir = kind.default_folders(kind.source(args))
        given = {field.name: getattr(args, field.name) for field in dataclasses.fields(cls)}
        given["model_dir"] = args.model_dir or model_dir
        given["export_dir"] = args.export_dir or export_dir
        given["seed"] = run_seed(args.seed, args.deterministic)
        return cls(**given)
