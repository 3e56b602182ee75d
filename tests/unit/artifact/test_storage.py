"""Model repositories on object storage (artifact/storage.py), on fsspec's in-memory filesystem
and a fake gs:// one: URLs, the completeness rule, verified downloads, publishing, and
errors that never carry a secret. The real S3 server is the live tier's
(tests/live/service/test_object_storage.py)."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from artifact import storage
from artifact.storage import (
    MANIFEST_FILE,
    RemoteModel,
    StorageError,
    describe_error,
    display,
    is_url,
    join,
    location,
    s3_options,
    scrub,
    structure_problem,
)

MODEL_FILES = {
    "saved_model.pb": b"graph",
    "variables/variables.index": b"index",
    "variables/variables.data-00000-of-00002": b"shard zero",
    "variables/variables.data-00001-of-00002": b"shard one",
    "assets.extra/labels.txt": b"a\nb\n",
}


@pytest.fixture
def root():
    """A fresh model folder URL on the in-memory filesystem, removed afterwards."""
    url = f"memory://bucket-{uuid.uuid4().hex[:8]}/models/m"
    yield url
    fs = fsspec.filesystem("memory")
    path = url.removeprefix("memory:/")
    if fs.exists(path.rsplit("/models", 1)[0]):
        fs.rm(path.rsplit("/models", 1)[0], recursive=True)


def put(url: str, files: dict[str, bytes]) -> None:
    fs, path = storage.filesystem(url)
    for rel, data in files.items():
        fs.pipe_file(f"{path}/{rel}", data)


def local_version(tmp_path: Path, files=MODEL_FILES) -> Path:
    folder = tmp_path / "staged"
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


# --- URLs and options -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, url",
    [
        pytest.param("s3://bucket/models", True, id="s3"),
        pytest.param("gs://bucket/models/", True, id="gs"),
        pytest.param("file:///srv/models", False, id="file-url"),
        pytest.param("/srv/models", False, id="absolute"),
        pytest.param("models", False, id="relative"),
        pytest.param("C:/models", False, id="no-scheme"),
    ],
)
def test_is_url(text, url):
    assert is_url(text) is url
    assert is_url(Path(text)) is False  # a Path is never a URL


def test_location_and_join():
    assert location("S3://bucket/models/") == "s3://bucket/models"
    assert location("file:///srv/models") == Path("/srv/models")
    assert location("models") == Path("models")
    assert join("s3://bucket/models", "m", "3") == "s3://bucket/models/m/3"
    assert join(Path("models"), "m") == Path("models/m")
    assert storage.basename("gs://bucket/models/fashion_mnist") == "fashion_mnist"


def test_display_and_scrub_leave_out_secrets():
    assert display("s3://key:secret@bucket/models") == "s3://***@bucket/models"
    environ = {"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG", "AWS_SESSION_TOKEN": "tok3n-v4lue"}
    text = "bad wJalrXUtnFEMI/K7MDENG and tok3n-v4lue at s3://k:p@b/x"
    cleaned = scrub(text, environ)
    assert "wJalrXUtnFEMI" not in cleaned and "tok3n" not in cleaned and ":p@" not in cleaned


def test_a_storage_error_never_carries_the_secret_key(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-v4lue-never-shown")
    err = describe_error(PermissionError("denied for s3cr3t-v4lue-never-shown"), "s3://b/m")
    assert "s3cr3t" not in str(err) and "access denied" in str(err)
    assert "AWS_SECRET_ACCESS_KEY" in str(err)  # the variable is named, its value is not


@pytest.mark.parametrize(
    "environ, client",
    [
        pytest.param({}, {}, id="none"),
        pytest.param(
            {"S3_ENDPOINT": "minio:9000"}, {"endpoint_url": "https://minio:9000"}, id="tf-serving"
        ),
        pytest.param(
            {"S3_ENDPOINT": "minio:9000", "S3_USE_HTTPS": "0", "S3_VERIFY_SSL": "0"},
            {"endpoint_url": "http://minio:9000", "verify": False},
            id="tf-serving-plain",
        ),
        pytest.param(
            {"AWS_ENDPOINT_URL": "http://a:1", "S3_ENDPOINT": "b:2"},
            {"endpoint_url": "http://a:1"},
            id="aws-first",
        ),
        pytest.param({"AWS_REGION": "eu-west-1"}, {"region_name": "eu-west-1"}, id="region"),
    ],
)
def test_s3_options_from_the_standard_variables(environ, client):
    options = s3_options(environ)
    assert options["client_kwargs"] == client
    assert "key" not in options and "secret" not in options  # botocore's own chain reads them


def test_an_unknown_scheme_is_one_line():
    with pytest.raises(StorageError, match=r"nope://b/m: no filesystem for nope://"):
        storage.filesystem("nope://b/m")


# --- the completeness rule --------------------------------------------------------------------


@pytest.mark.parametrize(
    "rels, problem",
    [
        pytest.param(list(MODEL_FILES), None, id="whole"),
        pytest.param(["variables/variables.index"], "no saved_model.pb", id="no-graph"),
        pytest.param(["saved_model.pb"], "no variables/variables.index", id="no-index"),
        pytest.param(
            ["saved_model.pb", "variables/variables.index"], "no variables data", id="no-shard"
        ),
        pytest.param(
            [
                "saved_model.pb",
                "variables/variables.index",
                "variables/variables.data-00001-of-00002",
            ],
            "1 of 2 variables data shard",
            id="a-shard-missing",
        ),  # fmt: skip
    ],
)
def test_structure_problem(rels, problem):
    found = structure_problem(dict.fromkeys(rels, 1))
    assert found is None if problem is None else problem in found


def test_listing_names_versions_and_foreign_entries(root):
    put(root, {"1/saved_model.pb": b"x", "007/saved_model.pb": b"y", "7/saved_model.pb": b"z",
               "latest/saved_model.pb": b"x", ".staging/saved_model.pb": b"x",
               "README": b"x"})  # fmt: skip
    versions, foreign = RemoteModel(root).listing()
    assert sorted(versions) == [1, 7]
    assert versions[7].url == f"{root}/7"  # the plain spelling wins
    assert foreign == ["README", "latest"]


def test_a_version_with_a_manifest_is_complete_once_every_file_it_lists_is_there(root, tmp_path):
    model = RemoteModel(root, settle_seconds=0)
    staged = local_version(tmp_path)
    manifest = storage.build_manifest(staged)
    put(root, {f"1/{MANIFEST_FILE}": json.dumps(manifest).encode()})
    put(root, {"1/saved_model.pb": MODEL_FILES["saved_model.pb"]})
    complete, waiting, _ = model.versions()
    assert complete == {} and "is not there yet" in waiting[1]
    put(root, {f"1/{rel}": data for rel, data in MODEL_FILES.items()})
    complete, waiting, _ = model.versions()
    assert list(complete) == [1] and waiting == {}  # no second look needed


def test_a_version_without_a_manifest_counts_once_its_listing_holds_still(root):
    model = RemoteModel(root, settle_seconds=0)
    put(root, {f"2/{rel}": data for rel, data in MODEL_FILES.items() if rel != "saved_model.pb"})
    complete, waiting, _ = model.versions()
    assert complete == {} and "no saved_model.pb" in waiting[2]
    put(root, {"2/saved_model.pb": b"graph"})
    complete, waiting, _ = model.versions()
    assert complete == {} and "still changing" in waiting[2]  # first seen whole: look again
    complete, waiting, _ = model.versions()
    assert list(complete) == [2]


def test_the_second_look_sees_a_file_that_landed_meanwhile(root, monkeypatch):
    model = RemoteModel(root, settle_seconds=1.0)
    put(root, {f"3/{rel}": data for rel, data in MODEL_FILES.items()})
    # The pause between the two looks, during which another file of the version lands.
    monkeypatch.setattr(storage.time, "sleep", lambda _: put(root, {"3/assets/vocab": b"v"}))
    complete, waiting, _ = model.versions()
    assert complete == {} and "still changing" in waiting[3]
    monkeypatch.setattr(storage.time, "sleep", lambda _: None)
    assert list(model.versions()[0]) == [3]  # unchanged since the last look


# --- fetching and publishing ------------------------------------------------------------------


def test_publish_then_download_round_trip(root, tmp_path):
    model = RemoteModel(root, settle_seconds=0)
    put(root, {"4/saved_model.pb": b"half an upload"})  # a number is never reused
    named = []
    url = model.publish(local_version(tmp_path), lambda n, folder: named.append(n))
    assert url == f"{root}/5" and named == [5]
    complete, waiting, _ = model.versions()
    assert list(complete) == [5] and 4 in waiting
    target = model.download(complete[5], tmp_path / "cache" / "5")
    for rel, data in MODEL_FILES.items():
        assert (target / rel).read_bytes() == data
    assert (target / MANIFEST_FILE).is_file()
    assert [p.name for p in target.parent.iterdir()] == ["5"]  # no download folder left


def test_a_download_that_is_not_what_the_manifest_names_is_refused(root, tmp_path):
    model = RemoteModel(root, settle_seconds=0)
    model.publish(local_version(tmp_path))
    # Same size, other bytes: listed complete, refused by the digest after the download.
    put(root, {"1/variables/variables.index": b"INDEX"})
    (found,) = model.versions()[0].values()
    with pytest.raises(StorageError, match="variables/variables.index: not the bytes"):
        model.download(found, tmp_path / "cache" / "1")
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_failed_upload_is_removed_so_no_reader_takes_it(root, tmp_path, monkeypatch):
    """Every file up but the manifest: complete by the rule for other tools' versions, so it
    must not stay."""
    model = RemoteModel(root, settle_seconds=0)
    uploaded = []
    original_put = MemoryFileSystem.put

    def put(self, sources, targets, **kwargs):
        uploaded.extend(t.rsplit("/1/", 1)[1] for t in targets)
        return original_put(self, sources, targets, **kwargs)

    def no_manifest(self, path, value, **kwargs):
        raise ConnectionError("Could not connect to the endpoint URL")

    monkeypatch.setattr(MemoryFileSystem, "put", put)
    monkeypatch.setattr(MemoryFileSystem, "pipe_file", no_manifest)
    with pytest.raises(StorageError, match="cannot reach the storage endpoint") as caught:
        model.publish(local_version(tmp_path))
    assert caught.value.transient
    # Uploaded in the order that keeps readers off it: saved_model.pb last of the files.
    assert uploaded[-1] == "saved_model.pb" and set(uploaded) == set(MODEL_FILES)
    assert model.listing() == ({}, [])


def test_a_failed_upload_that_cannot_be_removed_names_the_version_to_delete(
    root, tmp_path, monkeypatch
):
    model = RemoteModel(root, settle_seconds=0)

    def refused(self, *args, **kwargs):
        raise PermissionError("AccessDenied")

    monkeypatch.setattr(MemoryFileSystem, "pipe_file", refused)
    monkeypatch.setattr(MemoryFileSystem, "rm", refused)
    with pytest.raises(StorageError) as caught:
        model.publish(local_version(tmp_path))
    message = str(caught.value)
    assert message.startswith(f"{root}/1: access denied"), message
    assert "could not be removed" in message and f"delete {root}/1 before a server" in message


def test_read_text_of_a_missing_file_is_none(root):
    put(root, {"1/assets.extra/labels.txt": b"a\nb\n"})
    model = RemoteModel(root)
    assert model.read_text("1/assets.extra/labels.txt") == "a\nb\n"
    assert model.read_text("1/assets.extra/nothing.txt") is None


class FakeGCS(MemoryFileSystem):
    """gs:// answered from memory: the code path of a gs:// URL, without Google's servers."""

    protocol = ("gs", "gcs")
    store: dict = {}
    pseudo_dirs = [""]

    @classmethod
    def _strip_protocol(cls, path):
        for prefix in ("gs://", "gcs://"):
            path = path.removeprefix(prefix)
        return "/" + path.lstrip("/")


def test_a_gs_url_goes_through_the_gs_filesystem(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules["fsspec.registry"]._registry, "gs", FakeGCS)
    model = RemoteModel("gs://bucket/models/m", settle_seconds=0)
    assert model.publish(local_version(tmp_path)) == "gs://bucket/models/m/1"
    assert "/bucket/models/m/1/.manifest.json" in FakeGCS.store
    assert list(model.versions()[0]) == [1]
