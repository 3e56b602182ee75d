"""The training commands the rendered manifests run parse with the training CLI's own parser.

Live: that parser's module imports TensorFlow. The manifests' other promises are checked fast,
in tests/unit/deploy/test_manifests.py.
"""

from __future__ import annotations

import pytest
from support.manifest_harness import Pod, all_objects, pods, training_commands


@pytest.fixture(scope="module")
def all_pods() -> list[tuple[str, Pod]]:
    return [(where, pod) for where, obj in all_objects() for pod in pods(obj)]


def test_training_commands_parse_with_the_training_cli(all_pods):
    """The retrain CronJob's two steps, the feedback expiry, the first training and promote."""
    from training.__main__ import build_parser

    commands = training_commands(all_pods)
    assert {args[0] for _, args, _, _ in commands} == {
        "train", "retrain", "publish", "promote", "expire-feedback"
    }  # fmt: skip
    refused = []
    for label, args, _, _ in commands:
        try:
            build_parser().parse_args(args)
        except SystemExit:
            refused.append(f"{label}: python -m training {' '.join(args)}")
    assert refused == [], "the training CLI refuses:\n" + "\n".join(refused)
