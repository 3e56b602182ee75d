"""`python -m training compare`: its options made a CompareConfig at once, and the comparison
of the model kinds of the data the command line names (training/kinds/: IDX images in
training/kinds/idx_comparison.py, a CSV file or an image folder in
training/kinds/prepared_comparison.py).

The recommended workflow: a pre-made baseline first, then the custom Estimator, and keep the
custom model only if it beats the baselines by enough to pay for itself.
"""

from __future__ import annotations

import argparse

from training import cli, kinds
from training.configs import CompareConfig
from training.estimator import MODEL_KINDS
from training.image_folder import IMAGE_KINDS
from training.kinds.idx_comparison import DEFAULT_EPOCHS
from training.tabular import TABULAR_KINDS

__all__ = ["add_arguments", "run"]

DEFAULT_WORK_DIR = "runs/compare"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `compare` subcommand's options."""
    cli.add_data_arguments(p)
    p.add_argument(
        "--models",
        type=cli.name_list,
        default=None,
        help=f"the kinds to compare, comma-separated (default: {','.join(MODEL_KINDS)}; with "
        f"--csv {','.join(TABULAR_KINDS)}; with --image-folder {','.join(IMAGE_KINDS)})",
    )
    p.add_argument(
        "--work-dir",
        default=DEFAULT_WORK_DIR,
        help="new or empty folder for each kind's model dir, the exports and the table "
        "(default: %(default)s)",
    )
    # The same budget for every kind.
    cli.add_budget_arguments(
        p,
        DEFAULT_EPOCHS,
        f"{DEFAULT_EPOCHS:g}; with --csv or --image-folder {cli.DEFAULT_EPOCHS:g}",
    )
    cli.add_model_arguments(p, seed=0)  # one seed for every kind unless told otherwise
    cli.add_any_data_arguments(p)


def run(args: argparse.Namespace) -> int:
    """Train, export and evaluate each model kind of the data; the table, best first."""
    config = CompareConfig.from_args(args)
    kind = kinds.chosen(config)
    return kind.compare(config, kinds.others(kind))
