"""TF Serving's model config: parsed with its own protos, checked against the disk, edited."""

from __future__ import annotations

import re

import pytest

from artifact.model_config import (
    ConfigError,
    ModelEntry,
    Policy,
    check_on_disk,
    edit_config,
    parse_config,
    read_config,
    write_config,
)

TWO_MODELS = """
# The repository's config, read by TF Serving and the service.
model_config_list {
  config {
    name: "fashion"
    base_path: "fashion"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 versions: 2 } }
    version_labels { key: "stable" value: 1 }
    version_labels { key: "canary" value: 2 }
  }
  config {
    name: "digits"
    base_path: "/abs/digits"
    model_version_policy { latest { num_versions: 3 } }
  }
}
"""


def version(base, name, number):
    path = base / name / str(number)
    path.mkdir(parents=True)
    (path / "saved_model.pb").write_bytes(b"x")


def test_a_config_with_policies_labels_and_relative_paths(tmp_path):
    fashion, digits = parse_config(TWO_MODELS, tmp_path / "models.config")
    assert fashion == ModelEntry(
        "fashion",
        tmp_path / "fashion",
        Policy("specific", versions=(1, 2)),
        {"stable": 1, "canary": 2},
    )
    assert digits.base_path.as_posix() == "/abs/digits"
    assert digits.policy == Policy("latest", 3)


@pytest.mark.parametrize(
    "policy, on_disk, aspired",
    [
        pytest.param(Policy(), [3, 1, 2], {3}, id="latest-one"),
        pytest.param(Policy("latest", 2), [1, 2, 3], {2, 3}, id="latest-two"),
        pytest.param(Policy("all"), [1, 2], {1, 2}, id="all"),
        pytest.param(Policy("specific", versions=(2, 9)), [1, 2, 3], {2}, id="specific"),
        pytest.param(Policy("latest", 0), [1, 2], {2}, id="latest-zero-means-one"),
    ],
)
def test_policies_pick_versions_as_tf_serving(policy, on_disk, aspired):
    assert policy.aspired(on_disk) == aspired


def test_labeled_versions_are_aspired_besides_the_policy():
    entry = ModelEntry("m", "/x", Policy("latest", 1), {"stable": 2})
    assert entry.aspired([1, 2, 3]) == {2, 3}


@pytest.mark.parametrize(
    "text, message",
    [
        pytest.param("model_config_list {", "not a ModelServerConfig in text format", id="syntax"),
        pytest.param("bogus_field: 1", "not a ModelServerConfig in text format", id="unknown-field"),
        pytest.param("", "lists no model", id="empty"),
        pytest.param('model_config_list { config { name: "a" base_path: "/a" } config { name: "a" base_path: "/b" } }',
                     "Illegal to list model a multiple times in config list", id="duplicate-name"),
        pytest.param('model_config_list { config { name: "a" base_path: "/a" model_platform: "pytorch" } }',
                     "model_platform must be 'tensorflow'", id="platform"),
        pytest.param('model_config_list { config { name: "a" } }', "base_path is empty", id="no-base-path"),
        pytest.param('model_config_list { config { name: "" base_path: "/a" } }', "plain, non-empty name", id="no-name"),
        pytest.param('model_config_list { config { name: "a" base_path: "/a" version_labels { key: "st able" value: 1 } } }',
                     "label 'st able' must be letters, digits and underscores", id="label-characters"),
        pytest.param('model_config_list { config { name: "a" base_path: "/a" model_version_policy { specific { } } } }',
                     "a specific policy needs one or more versions", id="specific-empty"),
        pytest.param('custom_model_config { }', "custom_model_config is not supported", id="custom"),
    ],
)  # fmt: skip
def test_bad_configs_are_refused_in_one_line(text, message):
    with pytest.raises(ConfigError) as excinfo:
        parse_config(text, "models.config")
    assert str(excinfo.value).startswith("models.config: ")
    assert message in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


@pytest.mark.parametrize(
    "policy, labels, message",
    [
        pytest.param(Policy("specific", versions=(1, 7)), {}, "policy specific asks for version(s) 7, not in", id="specific-missing"),
        pytest.param(Policy(), {"stable": 5}, "label 'stable' points to version 5, not in", id="label-missing"),
    ],
)  # fmt: skip
def test_the_disk_must_hold_what_the_config_names(tmp_path, policy, labels, message):
    version(tmp_path, "m", 1)
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_on_disk([ModelEntry("m", tmp_path / "m", policy, labels)], "models.config")


def test_a_base_path_that_does_not_exist_or_holds_no_version(tmp_path):
    with pytest.raises(ConfigError, match=f"base_path {tmp_path / 'nowhere'} does not exist"):
        check_on_disk([ModelEntry("m", tmp_path / "nowhere")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="policy latest 1 matches no version"):
        check_on_disk([ModelEntry("m", tmp_path / "empty")])


def test_edit_sets_labels_and_policy_keeps_the_header_and_round_trips(tmp_path):
    edited = edit_config(TWO_MODELS, "fashion", labels={"stable": 2}, policy=Policy("latest", 2))
    assert edited.startswith("# The repository's config, read by TF Serving and the service.\n")
    fashion, digits = parse_config(edited, tmp_path / "models.config")
    assert fashion.labels == {"stable": 2, "canary": 2}
    assert fashion.policy == Policy("latest", 2)
    assert digits.policy == Policy("latest", 3)
    with pytest.raises(ConfigError, match="lists no model 'other'"):
        edit_config(TWO_MODELS, "other", labels={"stable": 1})


def test_write_replaces_the_file_whole_and_read_checks_it(tmp_path):
    version(tmp_path, "fashion", 1)
    version(tmp_path, "fashion", 2)
    path = tmp_path / "models.config"
    path.write_text("old")
    text = TWO_MODELS.replace('base_path: "/abs/digits"', 'base_path: "fashion"')
    write_config(path, text)
    assert path.read_text() == text
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert [entry.name for entry in read_config(path)] == ["fashion", "digits"]
    with pytest.raises(ConfigError, match="cannot read the model config"):
        read_config(tmp_path / "missing.config")


@pytest.mark.parametrize(
    "text, policy",
    [
        pytest.param("latest", Policy("latest", 1), id="latest"),
        pytest.param("latest:3", Policy("latest", 3), id="latest-3"),
        pytest.param("all", Policy("all"), id="all"),
        pytest.param("specific:4,2,4", Policy("specific", versions=(2, 4)), id="specific"),
    ],
)
def test_policies_from_the_command_line(text, policy):
    assert Policy.parse(text) == policy


@pytest.mark.parametrize(
    "text", ["latest:0", "latest:x", "all:1", "specific:", "specific:-1", "newest"]
)
def test_bad_policies_from_the_command_line(text):
    with pytest.raises(ConfigError, match="expected latest, latest:N"):
        Policy.parse(text)
