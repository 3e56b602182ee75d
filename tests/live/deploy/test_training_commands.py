"""The training commands the rendered manifests run parse with the training CLI's own parser.

Live: that parser's module imports TensorFlow 2.15, so it runs in the training side's
interpreter (support/sides.py). The manifests' other promises are checked fast, in
tests/unit/deploy/test_manifests.py.
"""

from __future__ import annotations

import json

import pytest
from support.manifest_harness import Pod, all_objects, pods, training_commands
from support.sides import on_the_training_side

# Each command line parsed by the CLI's parser; the ones it refuses printed as a JSON list.
PARSE_EACH = """
import contextlib, io, json, sys
from training.__main__ import build_parser
refused = []
for argv in json.load(sys.stdin):
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit:
        refused.append(argv)
print(json.dumps(refused))
"""


@pytest.fixture(scope="module")
def all_pods() -> list[tuple[str, Pod]]:
    return [(where, pod) for where, obj in all_objects() for pod in pods(obj)]


def refused_by_the_parser(commands: list[list[str]]) -> list[list[str]]:
    done = on_the_training_side(PARSE_EACH, commands)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_training_commands_parse_with_the_training_cli(all_pods):
    """The retrain CronJob's two steps, the feedback expiry, the first training and promote."""
    commands = training_commands(all_pods)
    assert {args[0] for _, args, _, _ in commands} == {
        "train", "retrain", "publish", "promote", "expire-feedback"
    }  # fmt: skip
    refused = refused_by_the_parser([args for _, args, _, _ in commands])
    labels = {tuple(args): label for label, args, _, _ in commands}
    assert refused == [], "the training CLI refuses:\n" + "\n".join(
        f"{labels[tuple(args)]}: python -m training {' '.join(args)}" for args in refused
    )


def test_the_check_sees_a_refused_command():
    assert refused_by_the_parser([["train", "--no-such-option"], ["promote", "--help-me"]]) == [
        ["train", "--no-such-option"],
        ["promote", "--help-me"],
    ]
