"""`python -m training publish`: its options, made a PublishConfig at once, then what a
`retrain --stage-to` staged checked and published (training/staging.py)."""

from __future__ import annotations

import argparse

from training.configs import PublishConfig
from training.staging import publish
from training.versions import PUBLISH_MODES

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `publish` subcommand's options."""
    p.add_argument(
        "--staged",
        required=True,
        metavar="DIR",
        help="the staging area a retrain wrote (its --stage-to)",
    )
    p.add_argument(
        "--export-dir",
        required=True,
        help="the model's folder in the repository, or its URL on object storage "
        "(s3://..., gs://...; the retrain's --export-dir): the candidate becomes its next "
        "version",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="TF Serving's model config that lists --export-dir: its stable label names the "
        "serving version, and --publish canary|stable edit it",
    )
    p.add_argument(
        "--publish",
        choices=PUBLISH_MODES,
        default="version",
        help="version = the next version only; canary = and label it canary (pinning stable "
        "to the serving version first when no label is set); stable = and label it stable "
        "(default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    """Check the staging area and publish what it holds; 0 published (or nothing to publish),
    2 refused, 3 not blessed, 75 another publisher holds the repository."""
    return publish(PublishConfig.from_args(args))
