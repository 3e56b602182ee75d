"""`python -m training train`: its options (training/train.py) made a TrainConfig at once,
and the run on the kind of data the command line names (training/kinds/: IDX images, a CSV
file, an image folder)."""

from __future__ import annotations

import argparse

from training import kinds
from training.configs import TrainConfig
from training.train import add_arguments

__all__ = ["add_arguments", "run"]


def run(args: argparse.Namespace) -> int:
    """Train on the kind of data the command line names; evaluate; export a new version."""
    config = TrainConfig.from_args(args)
    kind = kinds.chosen(config)
    return kind.train(config, kinds.others(kind))
