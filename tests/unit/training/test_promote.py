"""`python -m training promote`: labels and policies edited in the model config, atomically,
within TF Serving's label rule as far as the files can tell. No TensorFlow: fast."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from artifact.model_config import Policy, parse_config
from training import promote
from training.commands import promote as promote_command
from training.errors import UsageError

CONFIG = """# Served by TF Serving and the service.
model_config_list {
  config {
    name: "fashion_mnist"
    base_path: "fashion_mnist"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 versions: 2 } }
    version_labels { key: "stable" value: 1 }
  }
}
"""


@pytest.fixture
def config(tmp_path):
    for version in (1, 2, 3):
        path = tmp_path / "fashion_mnist" / str(version)
        path.mkdir(parents=True)
        (path / "saved_model.pb").write_bytes(b"x")
    path = tmp_path / "models.config"
    path.write_text(CONFIG)
    return path


def run(config, *argv) -> int:
    parser = argparse.ArgumentParser()
    promote_command.add_arguments(parser)
    args = parser.parse_args(["--config", str(config), "--model", "fashion_mnist", *map(str, argv)])
    return promote_command.run(args)


def model(config):
    (entry,) = parse_config(config.read_text(), config)
    return entry


def test_move_the_stable_label_and_roll_back(config, capsys):
    assert run(config, "--label", "stable", "--version", 2) == 0
    assert model(config).labels == {"stable": 2}
    out = capsys.readouterr().out
    assert "fashion_mnist: label stable 1 -> 2" in out and f"Wrote {config}" in out
    assert config.read_text().startswith("# Served by TF Serving and the service.\n")
    assert run(config, "--label", "stable", "--version", 1) == 0  # rolling back
    assert model(config).labels == {"stable": 1}
    assert [p.name for p in config.parent.iterdir() if p.name.startswith(".")] == []


def test_a_new_label_and_a_policy(config, capsys):
    assert run(config, "--label", "canary", "--version", 2, "--policy", "latest:2") == 0
    entry = model(config)
    assert entry.labels == {"stable": 1, "canary": 2}
    assert entry.policy.describe() == "latest 2"
    assert "policy specific 1, 2 -> latest 2" in capsys.readouterr().out


def test_no_change_leaves_the_file_untouched(config, capsys):
    before = config.stat().st_mtime_ns
    assert run(config, "--label", "stable", "--version", 1) == 0
    assert "no change" in capsys.readouterr().out
    assert config.stat().st_mtime_ns == before


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(["--label", "stable", "--version", 9], "--version 9: not in", id="not-on-disk"),
        pytest.param(["--label", "stable", "--version", 3], "the config does not serve it (policy specific 1, 2)", id="not-served"),
        pytest.param(["--label", "stable"], "--label and --version go together", id="label-without-version"),
        pytest.param([], "nothing to do", id="nothing"),
        pytest.param(["--policy", "newest"], "expected latest, latest:N", id="bad-policy"),
        pytest.param(["--policy", "specific:1,7"], "version(s) 7 not in", id="policy-missing-version"),
        pytest.param(["--label", "st-able", "--version", 2], "letters, digits and underscores", id="label-characters"),
    ],
)  # fmt: skip
def test_refusals_change_nothing(config, argv, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run(config, *argv)
    assert config.read_text() == CONFIG


def test_an_unknown_model_or_a_broken_config(config, tmp_path):
    with pytest.raises(UsageError, match="lists no such model"):
        promote.promote(config, "digits", "stable", 1)
    broken = tmp_path / "broken.config"
    broken.write_text("model_config_list {")
    with pytest.raises(Exception, match="not a ModelServerConfig"):
        promote.promote(broken, "fashion_mnist", "stable", 1)


def test_the_command_line_becomes_a_typed_frozen_config():
    parser = argparse.ArgumentParser()
    promote_command.add_arguments(parser)
    argv = ["--config", "m.config", "--model", "m", "--label", "stable", "--version", "3"]
    args = parser.parse_args([*argv, "--policy", "latest:2"])
    config = promote_command.PromoteConfig.from_args(args)
    assert config == promote_command.PromoteConfig(
        "m.config", "m", "stable", 3, Policy.parse("latest:2")
    )
    assert config.policy.describe() == "latest 2"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.label = "canary"  # type: ignore[misc]
