"""Models on object storage, end to end: a real `python -m service` serving
MODEL_BASE_PATH=s3://... from a real S3-compatible server (moto's, started here on loopback,
checking credentials), the versions published as `python -m training` publishes them
(artifact/storage.py: files, then the manifest last).

One server for the module, one service through the story: a version published is served, a
partial upload never is (and is once complete), a deleted version is unloaded by the policy,
the storage going away leaves the loaded version serving from memory and the polls resume
when it comes back; the secret key never appears in the log or an answer. Wrong credentials
and a missing bucket stop the start with one line.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from support.object_storage import BUCKET, S3Server
from support.servers import run_service, start_server

from artifact import storage
from artifact.storage import MANIFEST_FILE, RemoteModel

MODEL = "fashion_mnist"
BASE = f"s3://{BUCKET}/models"
URL = f"{BASE}/{MODEL}"
WAIT_SECONDS = 60.0


@pytest.fixture(scope="module")
def s3():
    server = S3Server()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in server.env().items():
            patch.setenv(name, value)  # this process publishes the versions
        yield server
    server.stop()


def wait_for(condition, what: str, server=None):
    """Poll until condition() is true (bounded; the service's log in the failure)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            log = server.log() if server is not None else ""
            pytest.fail(f"not within {WAIT_SECONDS:.0f} s: {what}\n{log}")
        time.sleep(0.2)


def versions(server) -> dict[int, str]:
    body = httpx.get(f"{server.url}/v1/models/{MODEL}", timeout=10).json()
    return {int(s["version"]): s["state"] for s in body.get("model_version_status", [])}


def predict(server) -> httpx.Response:
    image = np.zeros((28, 28), np.float32).tolist()
    return httpx.post(
        f"{server.url}/v1/models/{MODEL}:predict", json={"instances": [image]}, timeout=30
    )


def upload(version_dir: Path, number: int, rels) -> None:
    """Some files of a version, as an interrupted or slow publish leaves them."""
    fs, root = storage.filesystem(URL)
    for rel in rels:
        fs.put_file(str(version_dir / rel), f"{root}/{number}/{rel}")


def files_of(version_dir: Path) -> list[str]:
    return sorted(p.relative_to(version_dir).as_posix() for p in version_dir.rglob("*")
                  if p.is_file())  # fmt: skip


def test_a_model_on_s3_through_publish_partial_upload_deletion_and_an_outage(
    s3, trained_model, tmp_path
):
    version = trained_model.version_path
    remote = RemoteModel(URL)
    assert remote.publish(version) == f"{URL}/1"
    server = start_server(
        tmp_path / "service.log",
        MODEL_BASE_PATH=BASE,
        MODEL_CACHE_DIR=str(tmp_path / "cache"),
        MODEL_POLL_SECONDS="0.5",
        **s3.env(),
    )
    try:
        assert versions(server) == {1: "AVAILABLE"}
        assert predict(server).status_code == 200
        cached = list((tmp_path / "cache").glob(f"*/*/{1}/saved_model.pb"))
        assert len(cached) == 1, "version 1 is loaded from its copy in MODEL_CACHE_DIR"

        # A partial upload: the assets and the variables index, no shard, no graph.
        partial = [r for r in files_of(version) if not r.startswith("variables/variables.data")
                   and r != "saved_model.pb"]  # fmt: skip
        upload(version, 2, partial)
        wait_for(lambda: "version 2 is not complete yet" in server.log(), "v2 seen partial", server)
        assert versions(server) == {1: "AVAILABLE"}
        # The rest, then the manifest: complete, it serves.
        upload(version, 2, [r for r in files_of(version) if r not in partial])
        manifest = json.dumps(storage.build_manifest(version)).encode()
        fs, root = storage.filesystem(URL)
        fs.pipe_file(f"{root}/2/{MANIFEST_FILE}", manifest)
        wait_for(lambda: versions(server).get(2) == "AVAILABLE", "version 2 serving", server)
        wait_for(lambda: versions(server).get(1) == "END", "version 1 unloaded", server)
        assert predict(server).json()["model_version"] == "2"

        # Deleted on the storage: unloaded, and the policy's next newest serves again.
        fs.rm(f"{root}/2", recursive=True)
        wait_for(lambda: versions(server).get(1) == "AVAILABLE", "version 1 back", server)
        wait_for(lambda: versions(server).get(2) == "END", "version 2 unloaded", server)
        assert predict(server).json()["model_version"] == "1"

        # The storage goes away: polls fail (said once), version 1 keeps serving from memory.
        s3.stop()
        try:
            wait_for(lambda: "cannot list the versions" in server.log(), "failure logged", server)
            assert predict(server).status_code == 200
            assert httpx.get(f"{server.url}/readyz", timeout=10).status_code == 200
            assert versions(server) == {1: "AVAILABLE", 2: "END"}
        finally:
            s3.start()
        # Back: a new version is picked up again.
        assert remote.publish(version).endswith("/2")
        wait_for(lambda: versions(server).get(2) == "AVAILABLE", "version 2 after", server)
        assert "listed again after" in server.log()
        assert server.log().count("cannot list the versions") == 1  # rate-limited

        answers = httpx.get(f"{server.url}/readyz", timeout=10).text + json.dumps(
            httpx.get(f"{server.url}/v1/models/{MODEL}", timeout=10).json()
        )
    finally:
        server.stop()
    assert s3.secret_key not in server.log() + answers
    # Only what was loaded was in the cache, and the cache folder went with the process.
    assert list((tmp_path / "cache").glob("*/*/*")) == []


@pytest.mark.parametrize(
    "base, secret, words",
    [
        pytest.param(BASE, "wrong-secret-key-Zq9F2", "access denied", id="bad-credentials"),
        pytest.param("s3://no-such-bucket/models", None, "not found", id="missing-bucket"),
    ],
)
def test_a_start_that_cannot_list_is_one_line_naming_model_base_path(s3, tmp_path, base, secret,
                                                                      words):  # fmt: skip
    result = run_service(
        timeout=120,
        MODEL_BASE_PATH=base,
        MODEL_CACHE_DIR=str(tmp_path / "cache"),
        **s3.env(secret),
    )
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: MODEL_BASE_PATH: "), result.stderr
    assert words in lines[0]
    for value in (secret, s3.secret_key):
        if value:
            assert value not in result.stdout + result.stderr
