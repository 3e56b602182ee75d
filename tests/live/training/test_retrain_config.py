"""training/retrain/arguments.py's RetrainConfig: `retrain`'s command line as the typed config
the retrain's code reads (training/commands/retrain.py builds it)."""

from __future__ import annotations

import dataclasses

import pytest

from training.__main__ import build_parser
from training.errors import UsageError
from training.retrain import RetrainConfig


def parsed(*argv: str):
    return build_parser().parse_args(["retrain", *argv])


def test_every_option_of_retrain_is_a_field_of_its_config():
    """An option the config lacks would be lost at the command line's edge (the program's
    own, before any command, are read by training/__main__.py)."""
    options = set(vars(parsed())) - {"command", "verbose", "log_format"}
    assert len(options) > 40
    assert options == {field.name for field in dataclasses.fields(RetrainConfig)}


def test_the_config_holds_the_options_typed_and_frozen():
    config = RetrainConfig.from_args(
        parsed("--extra-data", "a", "--extra-data", "b", "--hidden-units", "64,32", "--seed", "7")
    )
    assert config.extra_data == ["a", "b"]
    assert config.hidden_units == [64, 32]
    assert config.seed == 7 and config.publish == "version" and config.feedback_dir is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model = "dnn"  # type: ignore[misc]


@pytest.mark.parametrize(
    "argv, folders",
    [
        pytest.param([], ("runs/fashion_mnist", "models/fashion_mnist"), id="idx"),
        pytest.param(["--csv", "data/houses.csv"], ("runs/houses", "models/houses"), id="csv"),
        pytest.param(["--image-folder", "data/shapes"], ("runs/shapes", "models/shapes"), id="images"),
        pytest.param(["--csv", "h.csv", "--model-dir", "r", "--export-dir", "e"], ("r", "e"), id="given"),
    ],
)  # fmt: skip
def test_the_folders_default_as_train_defaults_them_for_the_kind_of_data(argv, folders):
    config = RetrainConfig.from_args(parsed(*argv))
    assert (config.model_dir, config.export_dir) == folders


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(["--publish", "canary"], "--publish canary moves a label in the model config: give --config", id="label-without-config"),
        pytest.param(["--publish", "stable", "--config", "m.config", "--stage-to", "s"], "--publish stable with --stage-to", id="label-with-staging"),
    ],
)  # fmt: skip
def test_options_that_contradict_each_other_are_refused(argv, message):
    with pytest.raises(UsageError, match=message):
        RetrainConfig.from_args(parsed(*argv))
