"""`python -m service`'s command line: `--help` lists every setting from `Settings` itself, and
an argument that is not one of TF Serving's flags is refused by name (service/cli.py; the flags
themselves: test_tf_serving_flags.py)."""

from __future__ import annotations

import re
from typing import Literal

import pytest
from pydantic import Field
from pydantic.fields import FieldInfo

from service import cli
from service.settings import Settings


def squeezed(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def help_text() -> str:
    return cli.build_parser().format_help()


def test_help_names_every_setting_with_its_default_and_description(help_text):
    entries = re.findall(r"^  ([A-Z][A-Z0-9_]+)(=\S*| \(unset\)| \(empty\))", help_text, re.M)
    names = [name for name, _ in entries]
    # Every field, in the order settings.py declares them (its groups stay together).
    assert names == [name.upper() for name in Settings.model_fields]
    assert len(names) > 40
    defaults = dict(entries)
    assert defaults["MODEL_NAME"] == "=fashion_mnist"
    assert defaults["PORT"] == "=8000"
    assert defaults["MODEL_CONFIG_FILE"] == " (unset)"
    assert defaults["ALLOWED_HOSTS"] == " (empty)"
    assert defaults["ALLOW_SIGNATURE_CHANGES"] == "=false"
    assert defaults["MODEL_POLL_SECONDS"] == "=2"
    for name, field in Settings.model_fields.items():
        assert field.description, f"{name} has no description to print"
        assert squeezed(field.description) in squeezed(help_text), name


def test_help_says_the_words_a_setting_takes(help_text):
    (line,) = [line for line in help_text.splitlines() if line.startswith("  DEVICE=")]
    assert line == "  DEVICE=auto  (one of: auto, cpu, gpu)"


def test_help_lines_fit_a_terminal(help_text):
    # Descriptions are wrapped; only a setting's own line may be longer (its name and default).
    long = [line for line in help_text.splitlines() if len(line) > cli.WIDTH]
    assert all(re.match(r"  [A-Z]", line) for line in long), long


@pytest.mark.parametrize(
    "field, text",
    [
        pytest.param(Field(None), " (unset)", id="none"),
        pytest.param(Field(""), " (empty)", id="empty"),
        pytest.param(Field(False), "=false", id="false"),
        pytest.param(Field(True), "=true", id="true"),
        pytest.param(Field(2.0), "=2", id="whole-float"),
        pytest.param(Field(0.5), "=0.5", id="float"),
        pytest.param(Field(8 * 1024 * 1024), "=8388608", id="int"),
        pytest.param(Field("tfserving:8500"), "=tfserving:8500", id="text"),
    ],
)
def test_a_default_is_written_as_the_environment_would_give_it(field: FieldInfo, text):
    assert cli.default_text(field) == text


def test_only_a_choice_of_words_gets_its_choices():
    words = FieldInfo(annotation=Literal["a", "b"], default="a")
    assert cli.choices_text(words) == "  (one of: a, b)"
    assert cli.choices_text(FieldInfo(annotation=int, default=1)) == ""


@pytest.mark.parametrize(
    "argv, wants_help",
    [
        pytest.param([], False, id="none"),
        pytest.param(["--help"], True, id="help"),
        pytest.param(["-h"], True, id="h"),
    ],
)
def test_the_arguments_it_takes(argv, wants_help):
    assert cli.parse(argv) == cli.CommandLine(help=wants_help, environment={})


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(["--grpc_port", "9000"], "unknown arguments: --grpc_port 9000 (", id="a-flag"),
        pytest.param(["--model=x"], "unknown argument: --model=x (", id="not-tf-serving"),
        pytest.param(["-port=1"], "unknown argument: -port=1 (", id="one-dash"),
        pytest.param(["serve"], "unknown argument: serve (", id="positional"),
        pytest.param(["--he"], "unknown argument: --he (", id="no-abbreviation"),
        pytest.param(["--rest_api"], "unknown argument: --rest_api (", id="no-flag-prefix"),
        pytest.param(
            ["--help=yes"],
            "argument -h/--help: ignored explicit argument 'yes'",
            id="help-with-a-value",
        ),
    ],
)
def test_any_other_argument_is_refused_by_name(argv, message):
    with pytest.raises(cli.UsageError) as refused:
        cli.parse(argv)
    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)
