"""`python -m training compare`: its options (training/compare.py), and the comparison of the
model kinds of the data the command line names (training/kinds/)."""

from __future__ import annotations

import argparse

from training import kinds
from training.compare import add_arguments

__all__ = ["add_arguments", "run"]


def run(args: argparse.Namespace) -> int:
    """Train, export and evaluate each model kind of the data; the table, best first."""
    kind = kinds.of_args(args)
    return kind.compare(args, kinds.others(kind))
