"""`python -m service`'s command line: `--help` lists the settings; nothing else is taken yet.

The settings are environment variables (service/settings.py). The parser is built from
`Settings`' fields, so each one's name, default and description are said in one place. A flag
that sets a setting (TensorFlow Serving's `--port`, `--model_name`...) is to be an option of
this parser whose `dest` is the setting's environment variable: `parse` returns it in
`CommandLine.environment`, which `main` puts in the environment before it reads `Settings`
(so the workers it starts inherit it too).
"""

from __future__ import annotations

import argparse
import textwrap
import typing
from dataclasses import dataclass
from typing import NoReturn

from pydantic.fields import FieldInfo

from service.settings import Settings

PROG = "python -m service"
DESCRIPTION = (
    "Serve the SavedModels of a model repository (TensorFlow Serving's layout) over TF "
    "Serving's REST and gRPC APIs, the Open Inference Protocol and /predict. Every setting "
    "is an environment variable, named as in the tensorflow/serving image where it has one; "
    "docs/operations.md says more."
)
WIDTH = 92


class UsageError(Exception):
    """The command line cannot be used: one line saying why (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    # argparse prints the usage and exits on an error; the service says one line instead.
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


@dataclass(frozen=True)
class CommandLine:
    """What the command line asked for."""

    help: bool  # print the help and exit
    environment: dict[str, str]  # settings given as flags, by environment variable (none yet)


def build_parser() -> argparse.ArgumentParser:
    """The command line: `-h`/`--help`, which prints every setting and exits."""
    parser = _Parser(
        prog=PROG,
        description=textwrap.fill(DESCRIPTION, width=WIDTH),
        epilog=settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
        allow_abbrev=False,
    )
    parser.add_argument(
        "-h", "--help", action="store_true", help="print the settings with their defaults and exit"
    )
    return parser


def parse(argv: list[str]) -> CommandLine:
    """Read the command line.

    Raises:
        UsageError: an argument the service does not take, or one used wrongly.
    """
    namespace, unknown = build_parser().parse_known_args(argv)
    if unknown:
        raise UsageError(
            f"unknown argument{'s' if len(unknown) > 1 else ''}: {' '.join(unknown)} (the "
            "settings are environment variables: python -m service --help lists them)"
        )
    given = vars(namespace)
    return CommandLine(
        help=given.pop("help"),
        environment={name: str(value) for name, value in given.items() if value is not None},
    )


def settings_help() -> str:
    """Every setting: its environment variable, default and description, in the order
    service/settings.py declares them."""
    lines = ["settings (environment variables, with their defaults):"]
    for name, field in Settings.model_fields.items():
        lines.append(f"  {name.upper()}{default_text(field)}{choices_text(field)}")
        lines.append(
            textwrap.fill(
                field.description or "",
                width=WIDTH,
                initial_indent=" " * 6,
                subsequent_indent=" " * 6,
            )
        )
    return "\n".join(lines)


def default_text(field: FieldInfo) -> str:
    """`=DEFAULT` as the default would be written in the environment; ` (unset)` when there
    is none, ` (empty)` for an empty text."""
    value = field.default
    if value is None:
        return " (unset)"
    if value == "":
        return " (empty)"
    if isinstance(value, bool):
        return f"={str(value).lower()}"
    if isinstance(value, float) and value.is_integer():
        return f"={int(value)}"
    return f"={value}"


def choices_text(field: FieldInfo) -> str:
    """`  (one of: a, b)` for a setting that takes one of a few words."""
    if typing.get_origin(field.annotation) is not typing.Literal:
        return ""
    return f"  (one of: {', '.join(map(str, typing.get_args(field.annotation)))})"
