"""`python -m training evaluate PATH`: its options, made an EvaluateConfig at once, then the
evaluation report of a checkpoint or an exported version (training/evaluate.py)."""

from __future__ import annotations

import argparse

from training import cli
from training.configs import EvaluateConfig
from training.evaluate import evaluate

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `evaluate` subcommand's options."""
    p.add_argument(
        "path",
        help="a --model-dir with checkpoints, an exported version (models/NAME/VERSION) "
        "or a model folder (its newest version)",
    )
    cli.add_data_arguments(p)
    p.add_argument(
        "--output",
        default="evaluation.json",
        help="where to write the report (default: %(default)s)",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--csv",
        metavar="FILE",
        help="an exported CSV model: evaluate on every row of FILE (the model's feature "
        "columns and its label column)",
    )
    source.add_argument(
        "--image-folder",
        metavar="DIR",
        help="an exported image model: evaluate on every image of DIR/<class>/ (class "
        "folders named as the model's classes; some may be missing)",
    )
    p.add_argument(
        "--label",
        metavar="COLUMN",
        help="--csv: the label column (default: the one the model was trained with)",
    )


def run(args: argparse.Namespace) -> int:
    """Evaluate on the model's kind of data; print the report and write it to --output."""
    return evaluate(EvaluateConfig.from_args(args))
