"""Pieces the subcommands of `python -m training` share: argument types, data options, labels."""

from __future__ import annotations

import argparse
import math

from artifact.contract import LABEL_PRESETS, resolve_labels
from training.configs import ModelOptions
from training.data import DEFAULT_DATA_DIR
from training.errors import UsageError
from training.hooks import check_hook_names

DEFAULT_MODEL_DIR = "runs/fashion_mnist"
DEFAULT_EXPORT_DIR = "models/fashion_mnist"


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
