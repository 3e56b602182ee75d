"""`python -m training compare`: its options (training/compare.py) made a CompareConfig at
once, and the comparison of the model kinds of the data the command line names
(training/kinds/)."""

from __future__ import annotations

import argparse

from training import kinds
from training.compare import add_arguments
from training.configs import CompareConfig

__all__ = ["add_arguments", "run"]


def run(args: argparse.Namespace) -> int:
    """Train, export and evaluate each model kind of the data; the table, best first."""
    config = CompareConfig.from_args(args)
    kind = kinds.chosen(config)
    return kind.compare(config, kinds.others(kind))
