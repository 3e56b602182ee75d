"""`python -m training retrain`: its options (training/retrain/arguments.py) made a typed
RetrainConfig at once, then the gated retrain (training/retrain/)."""

from __future__ import annotations

import argparse

from training.retrain import RetrainConfig, add_arguments, retrain

__all__ = ["add_arguments", "run"]


def run(args: argparse.Namespace) -> int:
    """Train a candidate, judge it against the serving version, publish it only if blessed."""
    return retrain(RetrainConfig.from_args(args))
