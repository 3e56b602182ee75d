"""The staging area and `python -m training publish` (training/staging.py), on staged versions
made of plain files: the publish step loads no model, so none is needed. No TensorFlow: fast.

Each refusal exits non-zero with one `error:` line and leaves the repository as it was, not a
timestamp changed; the same checks on a real retrain's staging are in
tests/live/training/test_publish.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from support.helpers import assert_one_error_line, tree

from artifact import storage
from artifact.contract import ASSETS_EXTRA, BLESSING_FILE
from artifact.model_config import parse_config
from artifact.storage import RemoteModel
from training import lock, staging
from training.commands import publish as publish_command
from training.errors import UsageError

MODEL = "fashion_mnist"
CONFIG = f"""model_config_list {{
  config {{
    name: "{MODEL}"
    base_path: "{MODEL}"
    model_platform: "tensorflow"
    model_version_policy {{ latest {{ num_versions: 2 }} }}
  }}
}}
"""
# A version as the publish step sees it: files. What they hold does not matter to it.
VERSION_FILES = {
    "saved_model.pb": b"graph" * 100,
    "variables/variables.index": b"index",
    "variables/variables.data-00000-of-00001": bytes(range(256)) * 40,
    f"{ASSETS_EXTRA}/labels.txt": b"T-shirt/top\nTrouser\n",
    f"{ASSETS_EXTRA}/evaluation.json": b'{"accuracy": 0.5}\n',
}


def write_version(folder, blessing: dict | None = None):
    for rel, content in VERSION_FILES.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(content)
    if blessing is not None:
        (folder / ASSETS_EXTRA / BLESSING_FILE).write_text(json.dumps(blessing))
    return folder


def blessing_json(baseline=1, blessed=True) -> dict:
    return {
        "format": 1,
        "blessed": blessed,
        "model": MODEL,
        "failed": [] if blessed else ["accuracy: change -0.0100 < -0.0000"],
        "versions": {"candidate": None, "baseline": baseline, "baseline_chosen_by": "policy"},
        "publish": {"mode": "staged", "config": None, "version": None, "label_changes": None},
    }


@pytest.fixture
def repository(tmp_path):
    """models/ with version 1 (trained, no blessing) and a config that serves the newest 2."""
    root = tmp_path / "models"
    write_version(root / MODEL / "1")
    (root / "models.config").write_text(CONFIG)
    return root


def fields(repository, baseline=1) -> dict:
    return {
        "model": MODEL,
        "export_dir": os.path.abspath(repository / MODEL),
        "config": str(repository / "models.config"),
        "baseline_version": baseline,
    }


def stage(tmp_path, repository, blessing=None, baseline=1):
    """A blessed candidate staged as a retrain with --stage-to leaves it."""
    stage_dir = staging.make_area(tmp_path / "staging", repository)
    staging.clear(stage_dir)
    candidate = write_version(tmp_path / "run" / ".export-x" / "1700000000")
    blessing = blessing if blessing is not None else blessing_json(baseline)
    staging.stage_candidate(stage_dir, candidate, blessing, fields(repository, baseline), "ok")
    return stage_dir


@pytest.fixture
def staged(tmp_path, repository):
    return stage(tmp_path, repository)


def publish(stage_dir, repository, *argv, config=True) -> int:
    """`python -m training publish` as main() runs it: a UsageError is one line, exit 2."""
    parser = argparse.ArgumentParser()
    publish_command.add_arguments(parser)
    given = ["--staged", stage_dir, "--export-dir", repository / MODEL, *argv]
    if config:
        given += ["--config", repository / "models.config"]
    try:
        return publish_command.run(parser.parse_args([str(a) for a in given]))
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def labels(repository) -> dict:
    (entry,) = parse_config((repository / "models.config").read_text(), "models.config")
    return dict(entry.labels)


def versions(repository) -> list[str]:
    return sorted(p.name for p in (repository / MODEL).iterdir())


# --- publishing ----------------------------------------------------------------------------


def test_publish_puts_the_staged_version_in_place_and_moves_the_label(staged, repository, capsys):
    assert publish(staged, repository, "--publish", "canary") == 0
    out = capsys.readouterr().out
    assert f"Published {repository / MODEL / '2'}" in out
    assert versions(repository) == ["1", "2"]  # no staging folder left behind
    for rel, content in VERSION_FILES.items():
        assert (repository / MODEL / "2" / rel).read_bytes() == content, rel
    # stable pinned to the version the candidate beat first, then the canary moved
    assert labels(repository) == {"stable": 1, "canary": 2}
    blessing = json.loads((repository / MODEL / "2" / ASSETS_EXTRA / BLESSING_FILE).read_text())
    assert blessing["versions"]["candidate"] == 2 and blessing["publish"]["version"] == 2
    assert blessing["publish"]["mode"] == "canary"
    assert blessing["publish"]["staged"]["from"] == os.path.abspath(staged)
    # The staging area is only read.
    assert (staged / staging.VERSION_DIR / "saved_model.pb").is_file()


def test_publishing_the_same_staging_again_publishes_nothing_new(staged, repository, capsys):
    assert publish(staged, repository, "--publish", "canary") == 0
    capsys.readouterr()
    before = tree(repository)
    assert publish(staged, repository, "--publish", "canary") == 0
    assert "was published from this very staging already" in capsys.readouterr().out
    assert tree(repository) == before


def test_publish_without_a_label_needs_no_config(staged, repository):
    before = (repository / "models.config").read_text()
    assert publish(staged, repository, config=False) == 0
    assert versions(repository) == ["1", "2"]
    assert (repository / "models.config").read_text() == before


def test_the_first_model_is_published_into_an_empty_repository(tmp_path):
    repository = tmp_path / "models"
    repository.mkdir()
    stage_dir = stage(tmp_path, repository, baseline=None)
    assert publish(stage_dir, repository, config=False) == 0
    assert versions(repository) == ["1"]


# --- refusals: one line, exit 2, nothing changed ------------------------------------------


def refused(stage_dir, repository, capsys, *fragments, argv=("--publish", "canary"), code=2):
    before = tree(repository)
    assert publish(stage_dir, repository, *argv) == code
    captured = capsys.readouterr()
    line = assert_one_error_line(captured.err, *fragments)
    assert tree(repository) == before, line
    return line


def change_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_file_changed_since_staging_is_refused(staged, repository, capsys):
    change_byte(staged / "version" / "variables" / "variables.data-00000-of-00001")
    refused(
        staged, repository, capsys,
        "version/variables/variables.data-00000-of-00001: not the bytes that were staged",
        "nothing published",
    )  # fmt: skip


def test_a_file_cut_short_or_removed_or_added_is_refused(staged, repository, capsys):
    data = staged / "version" / "saved_model.pb"
    original = data.read_bytes()
    data.write_bytes(original[:10])
    refused(staged, repository, capsys, "saved_model.pb: 10 bytes, staged with 500")
    data.unlink()
    refused(staged, repository, capsys, "version/saved_model.pb: staged, but not there")
    data.write_bytes(original)
    (staged / "version" / "extra.py").write_text("import os")
    refused(staged, repository, capsys, "version/extra.py: not staged (added since)")


def test_a_link_is_refused_even_to_the_same_bytes(staged, repository, capsys, tmp_path):
    """Followed, the link would pass every digest: it must not be followed."""
    index = staged / "version" / "variables" / "variables.index"
    elsewhere = tmp_path / "same-bytes"
    elsewhere.write_bytes(index.read_bytes())
    index.unlink()
    index.symlink_to(elsewhere)
    refused(staged, repository, capsys, "variables/variables.index: a symbolic link")


def test_a_fifo_is_refused_without_waiting_on_it(staged, repository, capsys):
    index = staged / "version" / "variables" / "variables.index"
    index.unlink()
    os.mkfifo(index)
    refused(staged, repository, capsys, "variables/variables.index: not a regular file")


def test_a_half_written_staging_is_refused(staged, repository, capsys):
    """The retrain writes staged.json last: without it nothing counts as staged."""
    (staged / staging.MANIFEST_FILE).unlink()
    refused(staged, repository, capsys, "no staged.json", "stopped before it finished")
    refused(staged.parent / "nowhere", repository, capsys, "no such folder")


def test_a_blessing_that_is_not_blessed_is_refused(tmp_path, repository, capsys):
    """Its digests agree: only the verdict refuses it."""
    stage_dir = stage(tmp_path, repository, blessing=blessing_json(blessed=False))
    refused(stage_dir, repository, capsys, "the candidate is not blessed", "accuracy: change")


def test_a_stale_baseline_is_refused(staged, repository, capsys):
    """The candidate beat version 1; version 2 serves now (the newest the policy serves)."""
    write_version(repository / MODEL / "2")
    refused(
        staged, repository, capsys,
        "judged against version 1, but version 2 serves now (the newest version the policy",
        "retrain against it",
    )  # fmt: skip


def test_a_staging_for_another_model_or_repository_is_refused(tmp_path, repository, capsys):
    other = tmp_path / "other" / "models"
    write_version(other / MODEL / "1")
    stage_dir = stage(tmp_path, other)
    refused(stage_dir, repository, capsys, "was judged against the versions in", "not --export-dir")
    manifest = json.loads((stage_dir / staging.MANIFEST_FILE).read_text())
    manifest |= {"model": "digits", "export_dir": str(repository / MODEL)}
    (stage_dir / staging.MANIFEST_FILE).write_text(json.dumps(manifest))
    refused(stage_dir, repository, capsys, "staged for the model digits, not fashion_mnist")


@pytest.mark.parametrize(
    "change, message",
    [
        pytest.param({"format": 2}, "format 2: this publish reads format 1", id="format"),
        pytest.param({"outcome": "maybe"}, "outcome 'maybe': expected one of", id="outcome"),
        pytest.param({"baseline_version": "1"}, "baseline_version: expected a version", id="baseline"),
        pytest.param({"files": {"saved_model.pb": {"bytes": 1, "sha256": "x"}}}, "files: saved_model.pb: expected bytes and a sha256", id="digest"),
        pytest.param({"files": {"saved_model.pb": {"bytes": 1, "sha256": "0" * 64}}}, "files: no version/variables/variables.index: not a complete version", id="incomplete"),
    ],
)  # fmt: skip
def test_a_malformed_staged_json_is_refused(staged, repository, capsys, change, message):
    path = staged / staging.MANIFEST_FILE
    path.write_text(json.dumps(json.loads(path.read_text()) | change))
    refused(staged, repository, capsys, message)


def test_a_publish_while_another_holds_the_repository_exits_75(staged, repository, capsys):
    with lock.hold_directory(repository):
        refused(staged, repository, capsys, "another retrain is publishing into", code=75)


def test_a_label_needs_the_config(staged, repository, capsys):
    assert publish(staged, repository, "--publish", "canary", config=False) == 2
    assert_one_error_line(capsys.readouterr().err, "--publish canary moves a label", "--config")


# --- what the retrain recorded when it staged no candidate --------------------------------


def record(tmp_path, repository, outcome, reason, **more):
    stage_dir = staging.make_area(tmp_path / "staging", repository)
    staging.clear(stage_dir)
    staging.record(stage_dir, outcome, fields(repository), reason, **more)
    return stage_dir


def test_not_blessed_exits_3_and_nothing_new_exits_0(tmp_path, repository, capsys):
    stage_dir = record(tmp_path, repository, staging.NOT_BLESSED, "accuracy: change -0.01")
    refused(stage_dir, repository, capsys, "did not bless its candidate (accuracy", code=3)
    stage_dir = record(tmp_path, repository, staging.UNCHANGED, "trained on these inputs")
    before = tree(repository)
    assert publish(stage_dir, repository, "--publish", "canary") == 0
    assert "Nothing to publish: trained on these inputs" in capsys.readouterr().out
    assert tree(repository) == before


def test_a_version_published_earlier_gets_its_label(tmp_path, repository, capsys):
    """A publish that stopped between the rename and the label: the rerun moves the label."""
    reason = "run at step 40 was published earlier"
    stage_dir = record(tmp_path, repository, staging.PUBLISHED, reason, published_version=1)
    refused(stage_dir, repository, capsys, "no such version blessed by a retrain")
    write_version(repository / MODEL / "2", blessing_json() | {"versions": {"candidate": 2}})
    stage_dir = record(tmp_path, repository, staging.PUBLISHED, reason, published_version=2)
    assert publish(stage_dir, repository, "--publish", "canary") == 0
    assert labels(repository) == {"canary": 2}


# --- the retrain's side ---------------------------------------------------------------------


def test_the_staging_area_may_not_be_inside_the_repository(repository):
    with pytest.raises(UsageError, match="inside the model repository"):
        staging.make_area(repository / "staging", repository)


def test_clearing_removes_the_manifest_first_and_then_the_version(staged):
    staging.clear(staged)
    assert list(staged.iterdir()) == []


def test_the_recorded_digests_cover_every_staged_file(staged):
    manifest = json.loads((staged / staging.MANIFEST_FILE).read_text())
    assert manifest["outcome"] == staging.STAGED and manifest["baseline_version"] == 1
    assert set(manifest["files"]) == {*VERSION_FILES, f"{ASSETS_EXTRA}/{BLESSING_FILE}"}
    size = manifest["files"]["saved_model.pb"]["bytes"]
    assert size == len(VERSION_FILES["saved_model.pb"])


# --- on object storage: the same step, uploading (fsspec's in-memory filesystem) ------------
# The same against a real S3-compatible server: tests/live/training/test_publish_to_s3.py.


@pytest.fixture
def bucket(tmp_path):
    """memory://.../fashion_mnist holding version 1 as a publish leaves it (with a manifest)."""
    url = f"memory://bucket-{uuid.uuid4().hex[:8]}/models/{MODEL}"
    RemoteModel(url).publish(write_version(tmp_path / "v1"))
    yield url
    fs = fsspec.filesystem("memory")
    fs.rm(url.removeprefix("memory:/").rsplit("/models", 1)[0], recursive=True)


def stage_for(tmp_path, url, blessing=None, outcome=None, **more):
    stage_dir = staging.make_area(tmp_path / "staging", None)
    staging.clear(stage_dir)
    where = {"model": MODEL, "export_dir": url, "config": None, "baseline_version": 1}
    if outcome is not None:
        staging.record(stage_dir, outcome, where, "ok", **more)
        return stage_dir
    candidate = write_version(tmp_path / "run" / ".export-x" / "1700000000")
    blessing = blessing if blessing is not None else blessing_json()
    staging.stage_candidate(stage_dir, candidate, blessing, where, "ok")
    return stage_dir


def publish_to(stage_dir, url) -> int:
    parser = argparse.ArgumentParser()
    publish_command.add_arguments(parser)
    try:
        return publish_command.run(
            parser.parse_args(["--staged", str(stage_dir), "--export-dir", url])
        )
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def bucket_tree(url) -> dict[str, bytes]:
    fs, root = storage.filesystem(url)
    return {p.removeprefix(root + "/"): fs.cat_file(p) for p in fs.find(root)}


def test_a_staging_is_published_to_object_storage_as_the_next_version(tmp_path, bucket, capsys):
    stage_dir = stage_for(tmp_path, bucket)
    assert publish_to(stage_dir, bucket) == 0
    assert f"Published {bucket}/2" in capsys.readouterr().out
    complete, waiting, _ = RemoteModel(bucket, settle_seconds=0).versions()
    assert sorted(complete) == [1, 2] and not waiting
    files = bucket_tree(bucket)
    for rel, content in VERSION_FILES.items():
        assert files[f"2/{rel}"] == content, rel
    # The manifest, uploaded last, lists every file with its digest, the blessing included.
    manifest = json.loads(files[f"2/{storage.MANIFEST_FILE}"])
    assert set(manifest["files"]) == {*VERSION_FILES, f"{ASSETS_EXTRA}/{BLESSING_FILE}"}
    blessing = json.loads(files[f"2/{ASSETS_EXTRA}/{BLESSING_FILE}"])
    assert blessing["versions"]["candidate"] == 2 and blessing["publish"]["version"] == 2
    assert blessing["publish"]["staged"]["from"] == os.path.abspath(stage_dir)
    # Again: found by the staging's digest, nothing uploaded.
    before = bucket_tree(bucket)
    assert publish_to(stage_dir, bucket) == 0
    assert f"{bucket}/2 was published from this very staging already" in capsys.readouterr().out
    assert bucket_tree(bucket) == before


@pytest.mark.parametrize(
    "spoil, fragments",
    [
        pytest.param(lambda s, url: change_byte(s / "version" / "saved_model.pb"), ["saved_model.pb: not the bytes that were staged"], id="changed"),
        pytest.param(lambda s, url: (s / "version" / "extra.py").write_text("import os"), ["version/extra.py: not staged (added since)"], id="added"),
        pytest.param(lambda s, url: RemoteModel(url).publish(write_version(s.parent / "v2")), ["judged against version 1, but version 2 serves now"], id="stale baseline"),
    ],
)  # fmt: skip
def test_a_refused_upload_writes_nothing_to_the_bucket(tmp_path, bucket, capsys, spoil, fragments):
    stage_dir = stage_for(tmp_path, bucket)
    spoil(stage_dir, bucket)
    before = bucket_tree(bucket)
    assert publish_to(stage_dir, bucket) == 2
    assert_one_error_line(capsys.readouterr().err, *fragments, "nothing published")
    assert bucket_tree(bucket) == before


def test_a_staging_judged_against_another_bucket_is_refused(tmp_path, bucket, capsys):
    stage_dir = stage_for(tmp_path, bucket)
    other = bucket.replace("/models/", "/elsewhere/")
    assert publish_to(stage_dir, other) == 2
    assert_one_error_line(
        capsys.readouterr().err,
        f"judged against the versions in {bucket}, not --export-dir {other}",
    )
    assert publish_to(stage_dir, str(tmp_path / "models" / MODEL)) == 2
    assert_one_error_line(capsys.readouterr().err, "not --export-dir")


def test_a_version_the_retrain_published_to_the_bucket_is_checked_there(tmp_path, bucket, capsys):
    stage_dir = stage_for(tmp_path, bucket, outcome=staging.PUBLISHED, published_version=1)
    assert publish_to(stage_dir, bucket) == 2  # version 1 was not published through the gate
    assert_one_error_line(capsys.readouterr().err, "no such version blessed by a retrain")
    blessed = blessing_json() | {"versions": {"candidate": 2}}
    RemoteModel(bucket).publish(write_version(tmp_path / "v2", blessed))
    stage_dir = stage_for(tmp_path, bucket, outcome=staging.PUBLISHED, published_version=2)
    assert publish_to(stage_dir, bucket) == 0
    assert f"{bucket}/2 is published already" in capsys.readouterr().out


def test_an_upload_the_storage_did_not_take_exits_75_and_leaves_nothing(
    tmp_path, bucket, capsys, monkeypatch
):
    """75 (try again later): the CronJob retries it; 2 would fail the Job as a refusal."""
    stage_dir = stage_for(tmp_path, bucket)
    before = bucket_tree(bucket)

    def unreachable(self, path, value, **kwargs):
        raise ConnectionError("Could not connect to the endpoint URL")

    monkeypatch.setattr(MemoryFileSystem, "pipe_file", unreachable)  # the manifest, last
    assert publish_to(stage_dir, bucket) == 75
    assert_one_error_line(
        capsys.readouterr().err, "nothing published", "cannot reach the storage", "try again later"
    )
    monkeypatch.undo()
    assert bucket_tree(bucket) == before  # what was uploaded of version 2 is removed


def test_one_publish_of_a_staging_at_a_time(tmp_path, bucket, capsys):
    """A bucket has no folder to lock: the staging area's lock is held (a retrain staging
    into it holds it too)."""
    stage_dir = stage_for(tmp_path, bucket)
    before = bucket_tree(bucket)
    with lock.hold_directory(stage_dir):
        assert publish_to(stage_dir, bucket) == 75
    assert_one_error_line(capsys.readouterr().err, "try again later")
    assert bucket_tree(bucket) == before


def test_a_staging_changed_while_it_is_copied_is_refused(tmp_path, bucket, capsys, monkeypatch):
    """What is uploaded is the copy, checked again: a file changed after the first check."""
    stage_dir = stage_for(tmp_path, bucket)
    checked = staging._staged_blessing

    def then_changed(*args):
        blessing = checked(*args)
        change_byte(stage_dir / "version" / "variables" / "variables.index")
        return blessing

    monkeypatch.setattr(staging, "_staged_blessing", then_changed)
    before = bucket_tree(bucket)
    assert publish_to(stage_dir, bucket) == 2
    assert_one_error_line(
        capsys.readouterr().err, "variables.index: not the bytes that were staged"
    )
    assert bucket_tree(bucket) == before


def test_credentials_in_the_url_are_never_shown(tmp_path, capsys):
    url = f"memory://key:s3cr3t@bucket-{uuid.uuid4().hex[:8]}/models/{MODEL}"
    RemoteModel(url).publish(write_version(tmp_path / "v1"))
    stage_dir = stage_for(tmp_path, url)
    assert publish_to(stage_dir, url) == 0
    assert publish_to(stage_dir, url) == 0
    assert publish_to(stage_dir, url.replace("/models/", "/other/")) == 2
    captured = capsys.readouterr()
    assert "Published memory://***@bucket-" in captured.out
    assert "s3cr3t" not in captured.out + captured.err


@pytest.mark.parametrize("content", [b"\xff\xfe not UTF-8", b"[1]", b'{"publish": "x"}'])
def test_a_blessing_of_another_tool_in_an_old_version_counts_as_none(
    tmp_path, bucket, repository, content, capsys
):
    """Both repositories read it the same way: the publish goes on."""
    fs, root = storage.filesystem(bucket)
    fs.pipe_file(f"{root}/1/{ASSETS_EXTRA}/{BLESSING_FILE}", content)
    (repository / MODEL / "1" / ASSETS_EXTRA / BLESSING_FILE).write_bytes(content)
    assert publish_to(stage_for(tmp_path / "a", bucket), bucket) == 0
    assert publish(stage(tmp_path / "b", repository), repository, config=False) == 0
    assert "Published" in capsys.readouterr().out
