"""`python -m training predict`: its options, made a PredictConfig at once, then batch
prediction with an exported version (training/predict.py)."""

from __future__ import annotations

import argparse

from artifact.images import INVERT_MODES
from training import cli
from training.configs import PredictConfig
from training.predict import DEFAULT_BATCH_SIZE, IMAGE_SUFFIXES, predict

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `predict` subcommand's options."""
    p.add_argument(
        "--model",
        default=cli.DEFAULT_EXPORT_DIR,
        help="an exported version (models/NAME/VERSION) or a model folder (its newest "
        "version) (default: %(default)s)",
    )
    p.add_argument(
        "--input",
        required=True,
        metavar="FILE_OR_DIR",
        help="a 28x28 model: an IDX images file, a .npy array, an image file, or a folder of "
        f"image files ({', '.join(IMAGE_SUFFIXES)}); a CSV model: a CSV file of its feature "
        "columns; another image model: an image file or a folder (its subfolders too)",
    )
    p.add_argument(
        "--output", required=True, help="the JSON-lines file to write (replaced when complete)"
    )
    p.add_argument(
        "--batch-size",
        type=cli.positive_int,
        default=DEFAULT_BATCH_SIZE,
        help="images per model call (default: %(default)s)",
    )
    p.add_argument(
        "--invert",
        choices=INVERT_MODES,
        default="auto",
        help="image files: make them light-on-dark like Fashion-MNIST; auto inverts when the "
        "border is light, as the service does (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    """Predict every image (or CSV row) of --input with an exported version; write --output."""
    return predict(PredictConfig.from_args(args))
