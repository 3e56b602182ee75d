"""`python -m training expire-feedback`: its options, made an ExpireFeedbackConfig at once,
then the old examples of a feedback store removed (training/feedback_source.py)."""

from __future__ import annotations

import argparse

from training.configs import ExpireFeedbackConfig
from training.feedback_source import expire_feedback, positive_days

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `expire-feedback` subcommand's options."""
    p.add_argument(
        "--feedback-dir", required=True, metavar="DIR", help="the service's FEEDBACK_DIR"
    )
    p.add_argument(
        "--model",
        required=True,
        metavar="NAME",
        help="the model whose store (DIR/NAME) is expired",
    )
    p.add_argument(
        "--max-age-days",
        type=positive_days,
        required=True,
        metavar="DAYS",
        help="remove the examples received more than DAYS ago",
    )


def run(args: argparse.Namespace) -> int:
    """Remove or compact the shards of examples older than --max-age-days."""
    return expire_feedback(ExpireFeedbackConfig.from_args(args))
