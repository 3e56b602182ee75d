"""Pieces the subcommands of `python -m training` share: argument types, the option groups of
`train`, `compare` and `retrain` (data, budget, model, schedule, hooks; training/commands/
adds each command's own) with their defaults, labels, a run's schedule and budget."""

from __future__ import annotations

import argparse
import math

from artifact.contract import LABEL_PRESETS, resolve_labels
from training import determinism
from training.configs import ModelOptions
from training.data import DEFAULT_DATA_DIR
from training.errors import UsageError
from training.estimator import DEFAULT_HIDDEN_UNITS, MODEL_KINDS
from training.hooks import DEFAULT_HOOKS, HOOKS, check_hook_names
from training.image_folder import CHANNELS, DEFAULT_CHANNELS, DEFAULT_IMAGE_SIZE
from training.model import DATA_FORMATS
from training.tabular import RECEIVERS, TABULAR_KINDS
from training.tabular_schema import (
    DEFAULT_MAX_VOCABULARY,
    HOLDOUT_EVERY,
    MAX_INTEGER_CLASSES,
    TASKS,
)

DEFAULT_MODEL_DIR = "runs/fashion_mnist"
DEFAULT_EXPORT_DIR = "models/fashion_mnist"
# train's (and the CSV and image kinds' compare's) budget and schedule.
# Measured here (README): 10 epochs of batch 100, Adam 1e-3 with cosine decay: 0.93 in ~3.5 min.
DEFAULT_EPOCHS = 10
DEFAULT_BATCH_SIZE = 100
DEFAULT_LEARNING_RATE = 1e-3
DEFAULT_EVAL_EVERY_SECS = 120
DEFAULT_CHECKPOINT_STEPS = 1000


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def int_list(text: str) -> list[int]:
    """'256,128' -> [256, 128], each a positive integer."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"must be comma-separated positive integers, got {text!r}")
    return values


def name_list(text: str) -> list[str]:
    """'a,b' -> ['a', 'b']; 'none' or '' -> []."""
    if text.strip().lower() in ("", "none"):
        return []
    names = [part.strip() for part in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"empty name in {text!r}")
    return names


# argparse names the type in "invalid <name> value: 'ten'".
positive_int.__name__ = "positive integer"
positive_float.__name__ = "positive number"
non_negative_int.__name__ = "non-negative integer"
int_list.__name__ = "integer list"
name_list.__name__ = "name list"


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """--data-dir and --labels."""
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


def labels(names: str, data_dir: str) -> tuple[str, ...]:
    """The class labels --labels names (`names`, of the data in data_dir); UsageError when it
    is not a valid list."""
    try:
        return resolve_labels(names, data_dir)
    except ValueError as err:
        raise UsageError(str(err)) from err


def hook_names(names) -> tuple[str, ...]:
    """The hook names, checked against the registry; UsageError listing the known ones."""
    try:
        return check_hook_names(names)
    except ValueError as err:
        raise UsageError(f"--hooks: {err}") from err


def add_budget_arguments(
    parser: argparse.ArgumentParser, default_epochs: float, default_text: str | None = None
) -> None:
    """--epochs or --max-steps: how long to train (one of the two; epochs by default).

    default_text: how --help shows the default (default: default_epochs).
    """
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument(
        "--epochs",
        type=positive_float,
        default=None,
        help=f"passes over the training set (default: {default_text or f'{default_epochs:g}'})",
    )
    budget.add_argument(
        "--max-steps", type=positive_int, help="train to this global step instead of --epochs"
    )


def schedule_params(options: ModelOptions, max_steps: int) -> dict:
    """What every kind's run records of its schedule and layers (params.json): the hidden
    units, Adam's learning rate and its decay, the batch, the last step, the seed."""
    return {
        "hidden_units": list(options.hidden_units),
        "learning_rate": options.learning_rate,
        "decay_steps": None if options.constant_learning_rate else max_steps,
        "batch_size": options.batch_size,
        "max_steps": max_steps,
        "seed": options.seed,
    }


def budget_steps(options: ModelOptions, default_epochs: float, steps_per_epoch: int) -> int:
    """The global step that --max-steps or --epochs (or the default epochs) stops at."""
    return options.max_steps or math.ceil((options.epochs or default_epochs) * steps_per_epoch)


def add_model_arguments(p: argparse.ArgumentParser, seed: int | None = None) -> None:
    """The options that shape a kind's model and its training (shared with `compare`)."""
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=DEFAULT_BATCH_SIZE,
        help="examples per step (per replica with --num-gpus) (default: %(default)s)",
    )
    p.add_argument(
        "--learning-rate",
        type=positive_float,
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
        type=int_list,
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
    dnn_linear too, and defaults that follow the data (resolved by its kind, training/kinds/).
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
            help=f"{model_dir_help} (default: {DEFAULT_MODEL_DIR}; with --csv or "
            "--image-folder runs/NAME, NAME the file's stem or the folder's name)",
        )
        p.add_argument(
            "--export-dir",
            default=None,
            help="model repository folder that receives a new integer version (default: "
            f"{DEFAULT_EXPORT_DIR}; with --csv or --image-folder models/NAME)",
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
        default=DEFAULT_MODEL_DIR,
        help=f"{model_dir_help} (default: %(default)s)",
    )
    p.add_argument(
        "--export-dir",
        default=DEFAULT_EXPORT_DIR,
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
        type=positive_int,
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
        type=positive_int,
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
        type=positive_int,
        default=DEFAULT_EVAL_EVERY_SECS,
        help="evaluate on the test set at most this often while training (default: %(default)s)",
    )
    p.add_argument(
        "--checkpoint-steps",
        type=positive_int,
        default=DEFAULT_CHECKPOINT_STEPS,
        help="save a checkpoint every N steps, the point a killed run resumes from "
        "(default: %(default)s)",
    )


def add_hook_arguments(p: argparse.ArgumentParser) -> None:
    """--hooks and --check-numerics (shared with `retrain`)."""
    p.add_argument(
        "--hooks",
        type=name_list,
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
