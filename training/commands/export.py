"""`python -m training export`: its options, made an ExportConfig at once, then a model dir's
latest checkpoint exported as a new version (training/export.py)."""

from __future__ import annotations

import argparse

from training import cli
from training.configs import ExportConfig
from training.export import export

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `export` subcommand's options."""
    cli.add_data_arguments(p)
    p.add_argument("--model-dir", default=cli.DEFAULT_MODEL_DIR, help="default: %(default)s")
    p.add_argument("--export-dir", default=cli.DEFAULT_EXPORT_DIR, help="default: %(default)s")


def run(args: argparse.Namespace) -> int:
    """Export the latest checkpoint, evaluated on the test split, as the next version."""
    return export(ExportConfig.from_args(args))
