"""`python -m training train`: its options (its own, and training/cli.py's groups it shares
with `compare` and `retrain`) made a TrainConfig at once, and the run on the kind of data the
command line names (training/kinds/: IDX images, a CSV file, an image folder).

Runs alone, on one host's GPUs (`--num-gpus`), or as one task of a TF_CONFIG cluster
(training/distributed.py): the same command on every host.
"""

from __future__ import annotations

import argparse

from training import cli, kinds
from training.configs import TrainConfig

__all__ = ["add_arguments", "run"]


def add_arguments(train: argparse.ArgumentParser) -> None:
    """The `train` subcommand's options."""
    cli.add_data_arguments(train)
    cli.add_run_arguments(train, any_data=True)
    cli.add_budget_arguments(train, cli.DEFAULT_EPOCHS)
    cli.add_model_arguments(train)
    cli.add_schedule_arguments(train)
    train.add_argument(
        "--no-export", action="store_true", help="train and evaluate only; export nothing"
    )
    cli.add_hook_arguments(train)
    tune = train.add_mutually_exclusive_group()
    tune.add_argument(
        "--warm-start-from",
        metavar="CKPT_OR_DIR",
        help="start a new run from a checkpoint's variables (tf.estimator.WarmStartSettings); "
        "a directory means its latest checkpoint",
    )
    tune.add_argument(
        "--fine-tune-from",
        metavar="CKPT",
        help="start a new run restoring only --fine-tune-scopes from a checkpoint (a "
        "Scaffold init_fn); a directory means its latest checkpoint",
    )
    train.add_argument(
        "--warm-start-vars",
        metavar="REGEX",
        default=".*",
        help="with --warm-start-from: the trainable variables to warm-start, matched from the "
        "start of their names, e.g. 'cnn/conv.*' (cnn) or 'keras/conv.*' (keras) (default: all)",
    )
    train.add_argument(
        "--fine-tune-scopes",
        type=cli.name_list,
        default=None,
        metavar="SCOPES",
        help="with --fine-tune-from: comma-separated scopes to restore, e.g. conv1,conv2 "
        "(the CNNs' layers: conv1, conv2, dense1, logits)",
    )
    train.add_argument(
        "--max-worker-delay-secs",
        type=cli.non_negative_int,
        default=None,
        metavar="SECS",
        help="TF_CONFIG workers: the longest a worker waits before training (TensorFlow "
        "staggers worker i by (i + 1) x 5 s so the chief's first steps settle)",
    )
    train.add_argument(
        "--num-gpus",
        type=cli.positive_int,
        default=None,
        help="train with MirroredStrategy over this many GPUs of this host (falls back to the "
        "CPU, and says so, when there is none); not with TF_CONFIG",
    )
    cli.add_any_data_arguments(train)


def run(args: argparse.Namespace) -> int:
    """Train on the kind of data the command line names; evaluate; export a new version."""
    config = TrainConfig.from_args(args)
    kind = kinds.chosen(config)
    return kind.train(config, kinds.others(kind))
