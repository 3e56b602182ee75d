"""training/versions.py: the serving version, and a version renamed in as the next number
even when another writer takes that number first. No TensorFlow: fast."""

from __future__ import annotations

import pytest

from artifact.model_config import parse_config
from training import versions
from training.errors import UsageError


def test_a_number_taken_between_the_listing_and_the_rename_is_skipped(tmp_path):
    base = tmp_path / "fashion_mnist"
    (base / "1").mkdir(parents=True)
    staged = tmp_path / "staged"
    staged.mkdir()
    tried = []

    def another_writer_first(version, folder):
        tried.append(version)
        if len(tried) == 1:  # another export renames its version in first
            (base / str(version)).mkdir()
            (base / str(version) / "saved_model.pb").write_bytes(b"theirs")

    published = versions.publish_next(staged, base, another_writer_first)
    assert (tried, published) == ([2, 3], base / "3")
    assert not staged.exists()
    assert (base / "2" / "saved_model.pb").read_bytes() == b"theirs"


def config_entry(tmp_path, policy: str, labels: str = ""):
    text = (
        'model_config_list { config { name: "m" base_path: "m" model_platform: "tensorflow" '
        f"model_version_policy {{ {policy} }} {labels} }} }}"
    )
    (entry,) = parse_config(text, tmp_path / "models.config")
    return entry


@pytest.mark.parametrize(
    "policy, labels, expected",
    [
        pytest.param("latest { num_versions: 1 }", 'version_labels { key: "stable" value: 1 }', (1, "the stable label"), id="stable-label"),
        pytest.param("specific { versions: 2 }", "", (2, "the newest version the policy (specific 2) serves"), id="policy"),
        pytest.param("latest { num_versions: 2 }", "", (3, "the newest version the policy (latest 2) serves"), id="latest"),
    ],
)  # fmt: skip
def test_the_serving_version_is_the_stable_label_else_the_policys_newest(
    tmp_path, policy, labels, expected
):
    for version in (1, 2, 3):
        (tmp_path / "m" / str(version)).mkdir(parents=True)
        (tmp_path / "m" / str(version) / "saved_model.pb").write_bytes(b"x")
    entry = config_entry(tmp_path, policy, labels)
    baseline = versions.serving_baseline(entry, tmp_path / "m")
    assert (baseline.version, baseline.chosen_by) == expected
    assert versions.serving_baseline(None, tmp_path / "m").version == 3
    assert versions.serving_baseline(entry, tmp_path / "none") is None


def test_a_stable_label_on_a_version_not_on_disk_is_an_error(tmp_path):
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "saved_model.pb").write_bytes(b"x")
    entry = config_entry(tmp_path, "all {}", 'version_labels { key: "stable" value: 7 }')
    with pytest.raises(UsageError, match="the stable label names version 7, which is not in"):
        versions.serving_baseline(entry, tmp_path / "m")


def test_moving_a_label_without_configs_entry_says_to_give_config(tmp_path):
    baseline = versions.Baseline(1, tmp_path / "m" / "1", "the stable label")
    message = "--publish canary moves a label in the model config: give --config"
    with pytest.raises(UsageError, match=message):
        versions.move_label(tmp_path / "models.config", None, "canary", 2)
    with pytest.raises(UsageError, match=message):
        versions.pin_stable_before_a_canary(tmp_path / "models.config", None, "canary", baseline)
    # Nothing to pin for another label, or with no version serving: no entry needed.
    versions.pin_stable_before_a_canary(tmp_path / "models.config", None, "stable", baseline)
    versions.pin_stable_before_a_canary(tmp_path / "models.config", None, "canary", None)
