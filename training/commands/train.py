"""`python -m training train`: its options (training/train.py), and the run on the kind of data
the command line names (training/kinds/: IDX images, a CSV file, an image folder)."""

from __future__ import annotations

import argparse

from training import kinds
from training.train import add_arguments

__all__ = ["add_arguments", "run"]


def run(args: argparse.Namespace) -> int:
    """Train on the kind of data the command line names; evaluate; export a new version."""
    kind = kinds.of_args(args)
    return kind.train(args, kinds.others(kind))
