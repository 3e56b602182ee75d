"""The version registry over a model on object storage (service/backends/sources.py), on
fsspec's in-memory filesystem with the fake loader: versions copied into the cache before
they load, partial uploads left alone, deletions unloaded, a storage that fails keeps what
serves. The same against a real S3 server: tests/live/service/test_object_storage.py."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import fsspec
import pytest
from support.entry import run_main_in_process
from support.fakes import FakeLoader
from support.servers import free_port

from artifact import storage
from artifact.model_config import ModelEntry
from artifact.storage import MANIFEST_FILE, RemoteModel, StorageError
from service.backends.registry import VersionRegistry
from service.backends.sources import Sources
from service.types import VersionState

NAME = "m"
FILES = {
    "saved_model.pb": b"good",
    "variables/variables.index": b"index",
    "variables/variables.data-00000-of-00001": b"shard",
    "assets.extra/labels.txt": b"a\nb\n",
}


@pytest.fixture
def url():
    bucket = f"bucket-{uuid.uuid4().hex[:8]}"
    yield f"memory://{bucket}/models/{NAME}"
    fs = fsspec.filesystem("memory")
    if fs.exists(f"/{bucket}"):
        fs.rm(f"/{bucket}", recursive=True)


@pytest.fixture
def sources(tmp_path):
    made = Sources(tmp_path / "cache", settle_seconds=0)
    yield made
    made.close()


def publish(url: str, tmp_path: Path, files=FILES) -> int:
    """A version published as `python -m training` publishes one (manifest last)."""
    folder = tmp_path / f"staged-{uuid.uuid4().hex[:6]}"
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return int(RemoteModel(url).publish(folder).rsplit("/", 1)[1])


def put(url: str, rel: str, data: bytes) -> None:
    fs, root = storage.filesystem(url)
    fs.pipe_file(f"{root}/{rel}", data)


def remove(url: str, rel: str) -> None:
    fs, root = storage.filesystem(url)
    fs.rm(f"{root}/{rel}", recursive=True)


def make(url: str, sources: Sources) -> tuple[VersionRegistry, FakeLoader]:
    loader = FakeLoader()
    return VersionRegistry(ModelEntry(NAME, url), loader, sources=sources), loader


def states(registry) -> dict[int, str]:
    return {s.version: s.state.name for s in registry.statuses()}


def cached(registry) -> list[str]:
    folder = registry.model_dir
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_a_published_version_loads_from_the_cache(url, sources, tmp_path):
    publish(url, tmp_path)
    registry, loader = make(url, sources)
    asyncio.run(registry.refresh())
    assert registry.serving == 1 and loader.loads == [1]
    assert registry.model_dir.is_relative_to(tmp_path / "cache" / str(os.getpid()))
    assert cached(registry) == ["1"]
    assert (registry.model_dir / "1" / "assets.extra" / "labels.txt").read_bytes() == b"a\nb\n"


def test_a_partial_upload_is_never_loaded_and_loads_once_complete(url, sources, tmp_path):
    publish(url, tmp_path)
    registry, loader = make(url, sources)

    async def scenario():
        await registry.refresh()
        # Version 2 as a publish leaves it half-way: its manifest, not all of its files.
        staged = tmp_path / "two"
        for rel, data in FILES.items():
            (staged / rel).parent.mkdir(parents=True, exist_ok=True)
            (staged / rel).write_bytes(data)
        manifest = storage.build_manifest(staged)
        put(url, f"2/{MANIFEST_FILE}", json.dumps(manifest).encode())
        put(url, "2/saved_model.pb", b"good")
        await registry.refresh()
        assert registry.serving == 1 and loader.loads == [1]
        assert "2" not in cached(registry)
        for rel, data in FILES.items():
            put(url, f"2/{rel}", data)
        await registry.refresh()

    asyncio.run(scenario())
    assert registry.serving == 2 and loader.loads == [1, 2]
    assert states(registry) == {2: "AVAILABLE", 1: "END"}
    assert cached(registry) == ["2"]  # the unloaded version left the cache


def test_nothing_complete_yet_is_the_readiness_reason(url, sources):
    put(url, "1/saved_model.pb", b"good")
    registry, _ = make(url, sources)
    asyncio.run(registry.refresh())
    assert registry.serving is None
    assert "no complete version under memory://" in registry.not_ready_reason()
    assert "no variables/variables.index yet" in registry.not_ready_reason()


def test_a_version_deleted_on_the_storage_is_unloaded_by_the_policy(url, sources, tmp_path):
    publish(url, tmp_path)
    publish(url, tmp_path)
    registry, loader = make(url, sources)

    async def scenario():
        await registry.refresh()
        assert registry.serving == 2
        remove(url, "2")
        await registry.refresh()

    asyncio.run(scenario())
    assert registry.serving == 1 and loader.unloads == [2]
    assert cached(registry) == ["1"]


def test_a_storage_that_fails_keeps_what_serves_and_says_so_once(
    url, sources, tmp_path, monkeypatch, caplog
):
    publish(url, tmp_path)
    registry, _ = make(url, sources)
    asyncio.run(registry.refresh())
    real = RemoteModel.listing

    def unreachable(self):
        raise StorageError(f"{self.url}: cannot reach the storage endpoint (refused)", True)

    monkeypatch.setattr(RemoteModel, "listing", unreachable)
    with caplog.at_level(logging.INFO, "service.backends.sources"):
        for _ in range(3):
            asyncio.run(registry.refresh())
        assert registry.serving == 1 and states(registry) == {1: "AVAILABLE"}
        assert cached(registry) == ["1"]
        monkeypatch.setattr(RemoteModel, "listing", real)
        publish(url, tmp_path)
        asyncio.run(registry.refresh())
    assert registry.serving == 2
    failures = [r for r in caplog.records if "cannot list the versions" in r.getMessage()]
    assert len(failures) == 1 and failures[0].levelno == logging.WARNING
    assert any("listed again after 3 failed poll(s)" in r.getMessage() for r in caplog.records)


def test_a_download_the_endpoint_dropped_is_tried_again_at_the_next_poll(
    url, sources, tmp_path, monkeypatch
):
    publish(url, tmp_path)
    registry, loader = make(url, sources)
    real = RemoteModel.download

    def dropped(self, found, target):
        raise StorageError(f"{found.url}: cannot reach the storage endpoint (reset)", True)

    monkeypatch.setattr(RemoteModel, "download", dropped)
    asyncio.run(registry.refresh())
    (status,) = registry.statuses()
    assert registry.serving is None and "cannot reach" in status.error_message
    monkeypatch.setattr(RemoteModel, "download", real)
    asyncio.run(registry.refresh())  # the same files: tried again all the same
    assert registry.serving == 1 and loader.loads == [1]


def test_a_version_that_is_not_what_its_manifest_names_fails_until_it_changes(
    url, sources, tmp_path
):
    publish(url, tmp_path)
    put(url, "1/variables/variables.index", b"INDEX")  # same size, other bytes
    registry, loader = make(url, sources)
    asyncio.run(registry.refresh())
    asyncio.run(registry.refresh())
    (status,) = registry.statuses()
    assert status.state == VersionState.END and "sha256 differs" in status.error_message
    assert loader.loads == [] and cached(registry) == []
    put(url, "1/variables/variables.index", b"index")  # fixed
    asyncio.run(registry.refresh())
    assert registry.serving == 1


def test_each_process_has_a_private_cache_folder_and_gone_ones_are_swept(tmp_path):
    root = tmp_path / "cache"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    (root / dead / "x").mkdir(parents=True)
    (root / "notes").mkdir()  # not a process's folder: left alone
    sources = Sources(root)
    own = sources.process_dir()
    assert own == root / str(os.getpid()) and (own.stat().st_mode & 0o777) == 0o700
    assert sorted(p.name for p in root.iterdir()) == sorted([str(os.getpid()), "notes"])
    sources.close()
    assert not own.exists()


def test_a_folder_on_disk_never_imports_fsspec(tmp_path):
    (tmp_path / NAME / "1").mkdir(parents=True)
    (tmp_path / NAME / "1" / "saved_model.pb").write_text("good")
    code = (
        "import asyncio, sys\n"
        "from support.fakes import FakeLoader\n"
        "from artifact.model_config import shortcut\n"
        "from service.backends.registry import VersionRegistry\n"
        f"(entry,) = shortcut({NAME!r}, {str(tmp_path)!r})\n"
        "registry = VersionRegistry(entry, FakeLoader())\n"
        "asyncio.run(registry.refresh())\n"
        "assert registry.serving == 1, registry.not_ready_reason()\n"
        "assert 'fsspec' not in sys.modules\n"
    )
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'tests'}"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# --- at start: one line naming the variable, exit 2, no secret --------------------------------

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"


def test_an_unreachable_endpoint_exits_2_naming_model_base_path_without_the_secret(tmp_path):
    result = run_main_in_process(
        MODEL_BASE_PATH="s3://bucket/models",
        MODEL_CACHE_DIR=str(tmp_path / "cache"),
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}",
        AWS_ACCESS_KEY_ID="AKIDEXAMPLE",
        AWS_SECRET_ACCESS_KEY=SECRET,
    )
    line = assert_one_error_line(result, "MODEL_BASE_PATH", "s3://bucket/models/fashion_mnist")
    assert "cannot reach the storage endpoint" in line
    assert SECRET not in result.stdout + result.stderr


def test_an_unknown_scheme_exits_2_naming_model_base_path(tmp_path):
    result = run_main_in_process(MODEL_BASE_PATH="nope://bucket/models")
    assert_one_error_line(result, "MODEL_BASE_PATH", "no filesystem for nope://")


def test_a_model_config_at_an_unreachable_url_exits_2_naming_the_file(tmp_path):
    config = tmp_path / "models.config"
    config.write_text(
        'model_config_list { config { name: "m" base_path: "s3://bucket/models/m" '
        'model_platform: "tensorflow" } }'
    )
    endpoint = f"http://127.0.0.1:{free_port()}"
    result = run_main_in_process(
        MODEL_CONFIG_FILE=str(config), AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="AKID",
        AWS_SECRET_ACCESS_KEY=SECRET,
    )  # fmt: skip
    assert_one_error_line(result, "MODEL_CONFIG_FILE", "model 'm'", "cannot reach")


def test_no_credentials_at_all_says_which_variables_to_set(tmp_path, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    # No instance metadata service to ask: this machine has none, and it must not be tried.
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    result = run_main_in_process(
        MODEL_BASE_PATH="s3://bucket/models", AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}"
    )
    assert_one_error_line(result, "MODEL_BASE_PATH", "no credentials found", "AWS_ACCESS_KEY_ID")


def test_a_cache_folder_that_cannot_be_written_exits_2_naming_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    result = run_main_in_process(
        MODEL_BASE_PATH="memory://bucket-empty/models", MODEL_CACHE_DIR=str(blocker / "cache")
    )
    assert_one_error_line(result, "MODEL_CACHE_DIR", str(blocker / "cache"))


def assert_one_error_line(result, *fragments: str) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]
