"""`python -m training sample-data`: its options, made a SampleDataConfig at once, then small
deterministic example data written (training/sample_data.py)."""

from __future__ import annotations

import argparse

from training import cli
from training.configs import SampleDataConfig
from training.sample_data import DEFAULT_IMAGES_PER_CLASS, DEFAULT_ROWS, sample_data

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `sample-data` subcommand's options."""
    p.add_argument("--out", required=True, help="folder to write the sample data into")
    p.add_argument(
        "--rows",
        type=cli.positive_int,
        default=DEFAULT_ROWS,
        help="rows of each CSV file (default: %(default)s)",
    )
    p.add_argument(
        "--images-per-class",
        type=cli.positive_int,
        default=DEFAULT_IMAGES_PER_CLASS,
        help="images in each class folder (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    """Write the sample data and print how to train on each."""
    return sample_data(SampleDataConfig.from_args(args))
