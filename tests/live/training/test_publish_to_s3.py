"""`--export-dir s3://...`: export, the gated retrain and the publish step of a staged retrain
publish a version to a real S3-compatible server (moto's, started here on loopback, checking
credentials), files first and the manifest last, as the service's readers require
(artifact/storage.py); the retrain judges against a downloaded copy of the serving version.
Serving from S3:
tests/live/service/test_object_storage.py."""

from __future__ import annotations

import json
import shutil

import pytest
from support.object_storage import BUCKET, S3Server
from support.training_harness import call_main

from artifact.contract import ASSETS_EXTRA, BLESSING_FILE, LABELS_FILE
from artifact.storage import MANIFEST_FILE, RemoteModel

URL = f"s3://{BUCKET}/models/fashion_mnist"


@pytest.fixture(scope="module")
def s3():
    server = S3Server()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in server.env().items():
            patch.setenv(name, value)
        yield server
    server.stop()


def complete_versions(url: str = URL) -> dict:
    complete, waiting, _ = RemoteModel(url, settle_seconds=0).versions()
    assert waiting == {}, waiting
    return complete


def retrain(data_dir, model_dir, export_dir: str, *more) -> int:
    """A short retrain whose gate blesses any candidate (--max-accuracy-drop 1)."""
    return call_main(
        "retrain",
        "--data-dir", data_dir,
        "--model-dir", model_dir,
        "--export-dir", export_dir,
        *more,
        "--max-steps", 60,
        "--batch-size", 50,
        "--eval-every-secs", 1000,
        "--hooks", "none",
        "--max-accuracy-drop", 1,
    )  # fmt: skip


def test_export_and_retrain_publish_whole_versions_to_s3(
    s3, trained_model, small_data_dir, tmp_path, capsys
):
    run = tmp_path / "run"
    shutil.copytree(trained_model.model_dir, run)
    code = call_main("export", "--model-dir", run, "--data-dir", small_data_dir,
                     "--export-dir", URL)  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and f"as {URL}/1" in out, out
    (found,) = complete_versions().values()
    assert found.has_manifest  # complete by its manifest, at once
    copy = RemoteModel(URL).download(found, tmp_path / "copy" / "1")  # sizes and sha256 checked
    assert (copy / ASSETS_EXTRA / LABELS_FILE).read_text().splitlines()[0] == "T-shirt/top"
    manifest = json.loads((copy / MANIFEST_FILE).read_text())
    assert (
        "saved_model.pb" in manifest["files"] and "variables/variables.index" in manifest["files"]
    )

    # The gated retrain: judged against version 1 downloaded, published as version 2.
    code = retrain(small_data_dir, tmp_path / "runs", URL)
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"Blessed: published {URL}/2" in out, out
    versions = complete_versions()
    assert sorted(versions) == [1, 2]
    copy = RemoteModel(URL).download(versions[2], tmp_path / "copy" / "2")
    blessing = json.loads((copy / ASSETS_EXTRA / BLESSING_FILE).read_text())
    assert blessing["blessed"] is True
    assert blessing["versions"]["candidate"] == 2 and blessing["versions"]["baseline"] == 1
    assert (tmp_path / "runs" / ".baseline" / "1" / "saved_model.pb").is_file()


def test_a_staged_retrain_is_published_to_s3_by_the_publish_step(
    s3, trained_model, small_data_dir, tmp_path, capsys
):
    """The shipped CronJob's split: `retrain --stage-to` reads the bucket only (it downloads
    the serving version to judge against), `publish --staged` uploads what it staged."""
    url = f"s3://{BUCKET}/staged/fashion_mnist"
    run = tmp_path / "run"
    shutil.copytree(trained_model.model_dir, run)
    assert call_main("export", "--model-dir", run, "--data-dir", small_data_dir,
                     "--export-dir", url) == 0  # fmt: skip
    code = retrain(small_data_dir, tmp_path / "runs", url, "--stage-to", tmp_path / "staging")
    out = capsys.readouterr().out
    assert code == 0, out
    assert sorted(complete_versions(url)) == [1]  # the retrain wrote nothing there
    staged = json.loads((tmp_path / "staging" / "staged.json").read_text())
    assert staged["outcome"] == "staged" and staged["export_dir"] == url

    code = call_main("publish", "--staged", tmp_path / "staging", "--export-dir", url)
    out = capsys.readouterr().out
    assert code == 0 and f"Published {url}/2" in out, out
    versions = complete_versions(url)
    assert sorted(versions) == [1, 2]
    copy = RemoteModel(url).download(versions[2], tmp_path / "copy" / "2")  # digests checked
    blessing = json.loads((copy / ASSETS_EXTRA / BLESSING_FILE).read_text())
    assert blessing["blessed"] is True
    assert blessing["versions"]["candidate"] == 2 and blessing["versions"]["baseline"] == 1
    assert blessing["publish"]["staged"]["from"] == str(tmp_path / "staging")
    # Published once: the same staging again uploads nothing.
    assert call_main("publish", "--staged", tmp_path / "staging", "--export-dir", url) == 0
    assert "was published from this very staging already" in capsys.readouterr().out
    assert sorted(complete_versions(url)) == [1, 2]


def test_a_wrong_secret_key_publishes_nothing_and_never_shows_it(
    s3, trained_model, small_data_dir, tmp_path, capsys, monkeypatch
):
    wrong = "wrong-secret-key-Hk3d9Q"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    run = tmp_path / "run"
    shutil.copytree(trained_model.model_dir, run)
    code = call_main("export", "--model-dir", run, "--data-dir", small_data_dir,
                     "--export-dir", f"s3://{BUCKET}/models/other")  # fmt: skip
    captured = capsys.readouterr()
    assert code == 2, captured.out + captured.err
    assert "access denied" in captured.err and "nothing published" in captured.err
    assert wrong not in captured.out + captured.err
    assert s3.secret_key not in captured.out + captured.err
