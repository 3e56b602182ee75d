"""The review's proof, against a real service: a SavedModel whose signature reads the file a
client names answered `/etc/passwd` and the tokens file to a predict client, and one whose
signature writes a file did so during its warmup at load. Now both versions end in state END
before anything of them runs, saying which ops and the setting; ALLOW_FILE_SYSTEM_OPS=true
serves them as before (artifact/file_ops.py; where the ops hide: tests/live/artifact)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from support.servers import serve_models, wait_for


def save_reader(version: Path) -> None:
    """Answers the contents of the file each instance names."""
    import tensorflow as tf

    def read(path):  # the warmup's empty path reads nothing
        return tf.cond(path == "", lambda: tf.constant(""), lambda: tf.io.read_file(path))

    class Reader(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="path")])
        def serve(self, path):
            return {"contents": tf.map_fn(read, path)}

    module = Reader()
    tf.saved_model.save(module, str(version), signatures={"serving_default": module.serve})


def save_writer(version: Path, marker: Path) -> None:
    """Writes `marker` on every call: the warmup's included."""
    import tensorflow as tf

    class Writer(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def serve(self, text):
            written = tf.io.write_file(str(marker), tf.strings.reduce_join(text))
            with tf.control_dependencies([written]):
                return {"length": tf.strings.length(text)}

    module = Writer()
    tf.saved_model.save(module, str(version), signatures={"serving_default": module.serve})


@pytest.fixture
def repository(tmp_path) -> tuple[dict[str, Path], Path, Path]:
    """({model: folder}, the secret file, the marker the writer writes)."""
    secret, marker = tmp_path / "secret", tmp_path / "written-at-load"
    secret.write_text("the tokens file's contents\n")
    models = {"reader": tmp_path / "models" / "reader", "writer": tmp_path / "models" / "writer"}
    save_reader(models["reader"] / "1")
    save_writer(models["writer"] / "1", marker)
    return models, secret, marker


def status(server, name: str) -> dict | None:
    answer = httpx.get(f"{server.url}/v1/models/{name}", timeout=30).json()
    entries = answer.get("model_version_status", [])
    return entries[0] if entries and entries[0]["state"] in ("END", "AVAILABLE") else None


def test_a_model_that_reads_or_writes_files_is_refused_at_load(repository, tmp_path):
    models, secret, marker = repository
    # Nothing is ready: wait for the process, then for each model's verdict.
    server = serve_models(models, tmp_path, wait_for="/healthz")
    try:
        for name, op in (("reader", "ReadFile"), ("writer", "WriteFile")):
            entry = wait_for(lambda n=name: status(server, n), f"{name} loaded or refused", server)
            assert entry["state"] == "END", entry
            message = entry["status"]["error_message"]
            assert f"{op} (" in message and "ALLOW_FILE_SYSTEM_OPS=true" in message, message
        assert not marker.exists(), "the writer ran at load"
        refused = httpx.post(
            f"{server.url}/v1/models/reader:predict",
            json={"instances": [str(secret)]},
            timeout=30,
        )
        assert refused.status_code in (404, 503) and "tokens" not in refused.text
    finally:
        server.stop()


def test_allow_file_system_ops_serves_them_as_before(repository, tmp_path):
    models, secret, marker = repository
    server = serve_models(models, tmp_path, ALLOW_FILE_SYSTEM_OPS="true")
    try:
        for name in models:
            entry = wait_for(lambda n=name: status(server, n), f"{name} loaded", server)
            assert entry["state"] == "AVAILABLE", entry
        assert marker.exists(), "the warmup runs the writer"
        answer = httpx.post(
            f"{server.url}/v1/models/reader:predict",
            json={"instances": [str(secret)]},
            timeout=30,
        )
        assert answer.json()["predictions"] == ["the tokens file's contents\n"]
    finally:
        server.stop()
