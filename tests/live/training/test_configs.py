"""training/configs.py: each command's options as the typed config its code reads, built at
the command line's edge (training/commands/)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from training.__main__ import build_parser
from training.commands.promote import PromoteConfig
from training.configs import (
    DEFAULT_SEED,
    CompareConfig,
    EvaluateConfig,
    ExpireFeedbackConfig,
    ExportConfig,
    PredictConfig,
    PublishConfig,
    SampleDataConfig,
    TrainConfig,
)
from training.retrain import RetrainConfig

CONFIGS = {
    "train": TrainConfig,
    "evaluate": EvaluateConfig,
    "export": ExportConfig,
    "predict": PredictConfig,
    "compare": CompareConfig,
    "promote": PromoteConfig,
    "retrain": RetrainConfig,
    "publish": PublishConfig,
    "sample-data": SampleDataConfig,
    "expire-feedback": ExpireFeedbackConfig,
}


def commands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_command_has_a_config():
    assert set(commands()) == set(CONFIGS)


@pytest.mark.parametrize("command", sorted(CONFIGS))
def test_every_option_of_a_command_is_a_field_of_its_config(command):
    """An option the config lacks would be lost at the command line's edge (the program's
    own, before any command, are read by training/__main__.py)."""
    parser = commands()[command]
    options = {
        action.dest for action in parser._actions if action.dest not in ("help", "log_format")
    }
    assert options == {field.name for field in dataclasses.fields(CONFIGS[command])}
    assert CONFIGS[command].__dataclass_params__.frozen  # type: ignore[attr-defined]


def parsed(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_the_train_config_holds_the_options_typed_and_frozen():
    config = TrainConfig.from_args(
        parsed("train", "--csv", "h.csv", "--hidden-units", "64,32", "--hooks", "none")
    )
    assert config.csv == "h.csv" and config.hidden_units == [64, 32] and config.hooks == []
    assert config.model is None and config.model_dir is None  # defaulted by the kind of data
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model = "dnn"  # type: ignore[misc]


@pytest.mark.parametrize(
    "argv, seed",
    [
        pytest.param(["train"], None, id="train-random"),
        pytest.param(["train", "--deterministic"], DEFAULT_SEED, id="train-deterministic"),
        pytest.param(["train", "--deterministic", "--seed", "7"], 7, id="train-given"),
        pytest.param(["compare"], 0, id="compare"),
        pytest.param(["retrain", "--deterministic"], 0, id="retrain"),
    ],
)
def test_deterministic_without_a_seed_takes_the_default_seed(argv, seed):
    config_class = CONFIGS[argv[0]]
    assert config_class.from_args(parsed(*argv)).seed == seed  # type: ignore[attr-defined]
