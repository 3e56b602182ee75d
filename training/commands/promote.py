"""`python -m training promote`: the command line (training/promote.py says what it does)."""

from __future__ import annotations

import argparse
import dataclasses

from artifact.model_config import ConfigError, Policy
from training.errors import UsageError
from training.promote import promote, version_number


@dataclasses.dataclass(frozen=True)
class PromoteConfig:
    """What `promote` was asked: a label moved to a version, a new policy, or both."""

    config: str  # TF Serving's model config file
    model: str  # the model's name in it
    label: str | None  # with version: the label to move
    version: int | None
    policy: Policy | None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PromoteConfig:
        """The command line's options, checked together.

        Raises:
            UsageError: --label without --version (or the reverse), nothing to do, or a
                --policy that does not parse.
        """
        if (args.label is None) != (args.version is None):
            raise UsageError("--label and --version go together: the label names that version")
        if args.label is None and args.policy is None:
            raise UsageError("nothing to do: give --label with --version, or --policy, or both")
        try:
            policy = Policy.parse(args.policy) if args.policy is not None else None
        except ConfigError as err:
            raise UsageError(str(err)) from err
        return cls(args.config, args.model, args.label, args.version, policy)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `promote` subcommand's options."""
    p.add_argument(
        "--config", required=True, help="TF Serving's model config file (ModelServerConfig text)"
    )
    p.add_argument("--model", required=True, help="the model's name in the config")
    p.add_argument("--label", help="the version label to set, e.g. stable or canary")
    p.add_argument("--version", type=version_number, help="the version the label names")
    p.add_argument(
        "--policy",
        help="a new version policy: latest, latest:N, all, or specific:V1,V2,...",
    )


def run(args: argparse.Namespace) -> int:
    """Edit the config; print what changed."""
    config = PromoteConfig.from_args(args)
    try:
        changes = promote(config.config, config.model, config.label, config.version, config.policy)
    except ConfigError as err:
        raise UsageError(str(err)) from err
    for line in changes or [f"{config.model}: no change; {config.config} left as it was"]:
        print(line)
    if changes:
        print(f"Wrote {config.config}")
    return 0
