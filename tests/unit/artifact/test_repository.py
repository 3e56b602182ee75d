"""The model repository on disk: which folders are versions, and what a version carries."""

from __future__ import annotations

import json

import pytest

from artifact.contract import DIGIT_LABELS
from artifact.repository import (
    INT64_MAX,
    files_stamp,
    foreign_entries,
    list_versions,
    parse_version,
    read_report,
    resolve_version_path,
    version_labels,
)


@pytest.mark.parametrize(
    "text, version",
    [
        pytest.param("0", 0, id="zero"),
        pytest.param("12", 12, id="twelve"),
        pytest.param("007", 7, id="leading-zeros"),
        pytest.param(str(INT64_MAX), INT64_MAX, id="int64-max"),
        pytest.param(str(INT64_MAX + 1), None, id="past-int64"),
        pytest.param("9" * 40, None, id="huge"),
        pytest.param("²", None, id="superscript"),
        pytest.param("１", None, id="fullwidth"),
        pytest.param("-1", None, id="negative"),
        pytest.param("1.0", None, id="decimal"),
        pytest.param("", None, id="empty"),
        pytest.param(" 1", None, id="space"),
    ],
)
def test_parse_version(text, version):
    assert parse_version(text) == version


def make(base, name, pb=True):
    path = base / name
    path.mkdir()
    if pb:
        (path / "saved_model.pb").write_bytes(b"x")
    return path


def test_listing_keeps_integer_folders_with_a_saved_model(tmp_path):
    for name in ("2", "10", "²", "latest", ".export-1"):
        make(tmp_path, name)
    make(tmp_path, "3", pb=False)  # an empty folder is not a version
    (tmp_path / "README").write_text("x")
    assert [v for v, _ in list_versions(tmp_path)] == [2, 10]
    assert foreign_entries(tmp_path) == ["README", "latest", "²"]
    assert list_versions(tmp_path / "nowhere") == []


def test_resolve_version_path(tmp_path):
    make(tmp_path, "1")
    newest = make(tmp_path, "4")
    assert resolve_version_path(tmp_path) == newest
    assert resolve_version_path(newest) == newest
    with pytest.raises(FileNotFoundError, match="not found"):
        resolve_version_path(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no exported version"):
        resolve_version_path(tmp_path / "empty")


def test_labels_report_and_stamp(tmp_path):
    version = make(tmp_path, "1")
    assert version_labels(version) == DIGIT_LABELS  # none exported: the digits
    assert read_report(version) is None
    extra = version / "assets.extra"
    extra.mkdir()
    (extra / "labels.txt").write_text("\n".join("abcdefghij") + "\n")
    (extra / "evaluation.json").write_text(json.dumps({"accuracy": 0.9}))
    assert version_labels(version) == tuple("abcdefghij")
    assert read_report(version) == {"accuracy": 0.9}
    assert files_stamp(version) > 0
    assert files_stamp(tmp_path / "gone") == 0.0
