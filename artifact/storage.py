"""Model repositories on object storage (`s3://`, `gs://`): list, check, fetch and publish
versions through fsspec, with no TensorFlow.

A model folder at a URL has TensorFlow Serving's layout, each object a file:

    s3://bucket/models/fashion_mnist/3/saved_model.pb
    s3://bucket/models/fashion_mnist/3/variables/variables.index
    s3://bucket/models/fashion_mnist/3/variables/variables.data-00000-of-00001
    s3://bucket/models/fashion_mnist/3/assets.extra/labels.txt
    s3://bucket/models/fashion_mnist/3/.manifest.json        (written last by our publish)

Object storage has no folders and no rename: a version appears file by file, so a reader
could see half of one (TF Serving has no rule for it and can load half a version). The rule
here, for every reader (the service, the retrain's baseline):

- A version with `.manifest.json` (what `python -m training` publishes: every file's size
  and sha256, uploaded after every other file) is complete when every file it lists is
  there with its size; after the download each file's sha256 is checked too.
- A version without one (copied there by another tool) is complete when it holds
  saved_model.pb, variables/variables.index and every shard variables.data-K-of-N for K in
  0..N-1, and its listing (every file's size and tag) is the same on two looks, the second
  SETTLE_SECONDS after the first or at the next poll; after the download every size is
  checked.

A version that is not complete is left alone (said once in the log) and looked at again at
the next poll; one that is complete is fetched into a hidden folder of a local cache,
verified, and renamed into place, so the loader only ever reads a complete local copy.

Credentials and endpoints come from the standard variables (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL, and TF Serving's
S3_ENDPOINT, S3_USE_HTTPS, S3_VERIFY_SSL for S3; GOOGLE_APPLICATION_CREDENTIALS for GCS); no
message this module makes carries a secret (`scrub`). fsspec is imported only when a URL is
used: local paths cost nothing here.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeGuard

from artifact.repository import SAVED_MODEL_FILE, parse_version

MANIFEST_FILE = ".manifest.json"
MANIFEST_FORMAT = 1
VARIABLES_INDEX = "variables/variables.index"
_SHARD = re.compile(r"variables/variables\.data-(\d{5})-of-(\d{5})\Z")
# The second look at a version without a manifest, when it was not seen at the last poll.
SETTLE_SECONDS = 1.0
# s3fs's retries of a failed call (its default, 5, spends seconds on an endpoint that is gone).
S3_RETRIES = 2
# Prefix of the hidden folder a version is downloaded into before it is renamed into place.
DOWNLOAD_PREFIX = ".download-"
_URL = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*)://(.*)\Z", re.DOTALL)
# Variables whose values never appear in a message of this module.
SECRET_VARIABLES = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "GOOGLE_OAUTH_ACCESS_TOKEN",
)


class StorageError(OSError):
    """Object storage cannot be used: one line saying what and where, with no secret in it.

    `transient` is true when trying again later may work (the endpoint did not answer).
    """

    def __init__(self, message: str, transient: bool = False):
        super().__init__(scrub(message))
        self.transient = transient

    def __str__(self) -> str:
        return self.args[0]


# --- URLs ------------------------------------------------------------------------------------


def is_url(path: str | Path) -> TypeGuard[str]:
    """True for `scheme://...` other than file://; a Path (even of a URL's text) never is."""
    if not isinstance(path, str):
        return False
    match = _URL.match(path)
    return match is not None and match.group(1).lower() != "file"


def location(text: str | Path) -> Path | str:
    """A model repository's location: the URL itself (no trailing slash) for object storage, a
    Path otherwise (file://PATH as PATH)."""
    if isinstance(text, Path):
        return text
    match = _URL.match(text)
    if match and is_url(text):
        scheme, rest = match.groups()
        return f"{scheme.lower()}://{rest.rstrip('/')}"
    return Path(match.group(2) if match else text)


def join(base: Path | str, *names: str) -> Path | str:
    """base/name/...: a Path under a Path, a URL under a URL."""
    if isinstance(base, str) and is_url(base):
        return "/".join([base.rstrip("/"), *names])
    return Path(base).joinpath(*names)


def basename(where: Path | str) -> str:
    """The last segment of a path or URL (a model's name)."""
    if isinstance(where, str) and is_url(where):
        return where.rstrip("/").rsplit("/", 1)[-1]
    return Path(where).name


def display(where: Path | str) -> str:
    """A path or URL as messages show it: a URL's user:password@ part is left out."""
    text = str(where)
    match = _URL.match(text)
    if match and "@" in match.group(2).split("/", 1)[0]:
        scheme, rest = match.groups()
        host_and_path = rest.split("@", 1)[1]
        return f"{scheme}://***@{host_and_path}"
    return text


def scrub(text: str, environ: Mapping[str, str] | None = None) -> str:
    """The text with the value of every secret variable (and of a URL's password) replaced."""
    environ = os.environ if environ is None else environ
    for name in SECRET_VARIABLES:
        value = environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return re.sub(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]*@", r"\1***@", text)


# --- the filesystem of a URL -----------------------------------------------------------------


def s3_options(environ: Mapping[str, str] | None = None) -> dict:
    """s3fs's options from the standard variables, TF Serving's S3_* included.

    AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, or S3_ENDPOINT (TF Serving's: host[:port], https
    unless S3_USE_HTTPS=0, certificates checked unless S3_VERIFY_SSL=0); the region from
    AWS_REGION or AWS_DEFAULT_REGION. Keys come from botocore's own chain (AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE, instance roles): never copied here.
    """
    environ = os.environ if environ is None else environ
    client: dict[str, Any] = {}
    endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    tf_endpoint = environ.get("S3_ENDPOINT")
    if not endpoint and tf_endpoint:
        https = environ.get("S3_USE_HTTPS", "1").strip().lower() not in ("0", "false", "no")
        endpoint = tf_endpoint if "://" in tf_endpoint else (
            f"{'https' if https else 'http'}://{tf_endpoint}"
        )  # fmt: skip
    if endpoint:
        client["endpoint_url"] = endpoint
    if environ.get("S3_VERIFY_SSL", "1").strip().lower() in ("0", "false", "no"):
        client["verify"] = False
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    if region:
        client["region_name"] = region
    return {
        "client_kwargs": client,
        # A poll that cannot reach the endpoint fails in seconds, and is tried again at the
        # next poll, rather than retried for a minute inside it (s3fs's own retries too:
        # S3_RETRIES, set on the instance).
        "config_kwargs": {
            "connect_timeout": 5,
            "read_timeout": 30,
            "retries": {"max_attempts": 2, "mode": "standard"},
        },
    }


def _options(protocol: str) -> dict:
    if protocol in ("s3", "s3a"):
        return s3_options()
    return {}


def filesystem(url: str):
    """(fsspec filesystem, path inside it) of a URL.

    Raises:
        StorageError: no filesystem for its scheme (the message says which are known).
    """
    import fsspec  # only here: local paths never import it

    protocol = url.split("://", 1)[0].lower()
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except (ValueError, ImportError) as err:
        raise StorageError(
            f"{display(url)}: no filesystem for {protocol}:// (use s3:// or gs://): {err}"
        ) from err
    # An instance of its own: fsspec's shared ones keep the credentials they were made with.
    fs = cls(**_options(protocol), skip_instance_cache=True)
    if protocol in ("s3", "s3a"):
        fs.retries = S3_RETRIES
    return fs, cls._strip_protocol(url).rstrip("/")


def describe_error(err: BaseException, where: str) -> StorageError:
    """One line for a failure of fsspec, s3fs, gcsfs or botocore at `where`."""
    if isinstance(err, StorageError):
        return err
    name = type(err).__name__
    text = str(err).splitlines()[0] if str(err) else name
    if isinstance(err, PermissionError) or "AccessDenied" in text or "Forbidden" in text:
        reason = (
            f"access denied ({text}): check the credentials (AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or GOOGLE_APPLICATION_CREDENTIALS)"
        )
        return StorageError(f"{where}: {reason}")
    if "NoCredentials" in name or "DefaultCredentials" in name:
        return StorageError(
            f"{where}: no credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(or AWS_PROFILE, or a role) for s3://, GOOGLE_APPLICATION_CREDENTIALS for gs://"
        )
    if isinstance(err, FileNotFoundError):
        return StorageError(f"{where}: not found ({text})")
    transient = (
        isinstance(err, ConnectionError | TimeoutError)
        or "Connect" in name
        or "Timeout" in name
        or "Could not connect" in text
    )
    if transient:
        return StorageError(f"{where}: cannot reach the storage endpoint ({text})", True)
    return StorageError(f"{where}: {name}: {text}", isinstance(err, OSError))


# --- versions at a URL -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RemoteFile:
    """One object of a version: its path inside the version, size, and tag (ETag, md5 or
    modification time: whatever changes when the object does)."""

    rel: str
    size: int
    tag: str


@dataclasses.dataclass(frozen=True)
class RemoteVersion:
    """A version folder as listed: its number, URL and files."""

    version: int
    url: str
    files: tuple[RemoteFile, ...]

    @property
    def fingerprint(self) -> tuple:
        """Every file's path, size and tag: equal on two listings when nothing changed."""
        return tuple((f.rel, f.size, f.tag) for f in self.files)

    @property
    def sizes(self) -> dict[str, int]:
        return {f.rel: f.size for f in self.files}

    @property
    def has_manifest(self) -> bool:
        return MANIFEST_FILE in self.sizes


def structure_problem(sizes: Mapping[str, int]) -> str | None:
    """Why a version's files are not a whole SavedModel (None when they are): saved_model.pb,
    the variables index and every one of its N data shards."""
    if SAVED_MODEL_FILE not in sizes:
        return f"no {SAVED_MODEL_FILE} yet"
    if VARIABLES_INDEX not in sizes:
        return f"no {VARIABLES_INDEX} yet"
    shards: dict[int, set[int]] = {}
    for rel in sizes:
        match = _SHARD.match(rel)
        if match:
            shards.setdefault(int(match.group(2)), set()).add(int(match.group(1)))
    if not shards:
        return "no variables data shard yet"
    if len(shards) > 1:
        return f"variables data shards of {len(shards)} different counts"
    ((count, present),) = shards.items()
    missing = sorted(set(range(count)) - present)
    if missing:
        return f"{len(missing)} of {count} variables data shard(s) missing"
    return None


def manifest_problem(manifest: Any, sizes: Mapping[str, int]) -> str | None:
    """Why the files listed do not match a version's manifest (None when every file it names
    is there with its size)."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files or manifest.get("format") != MANIFEST_FORMAT:
        return f"{MANIFEST_FILE} is not a manifest of format {MANIFEST_FORMAT}"
    for rel, entry in sorted(files.items()):
        if not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int):
            return f"{MANIFEST_FILE}: {rel}: no size"
        if _unsafe(rel):
            return f"{MANIFEST_FILE}: {rel!r} is not a path inside the version"
        if rel not in sizes:
            return f"{rel} is not there yet"
        if sizes[rel] != entry["bytes"]:
            return f"{rel} is {sizes[rel]} bytes, the manifest says {entry['bytes']}"
    return None


def _unsafe(rel: str) -> bool:
    parts = rel.split("/")
    return rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in rel


def build_manifest(version_dir: Path) -> dict:
    """The manifest of a local version folder: every file's size and sha256."""
    files = {}
    for path in sorted(p for p in Path(version_dir).rglob("*") if p.is_file()):
        rel = path.relative_to(version_dir).as_posix()
        if rel != MANIFEST_FILE:
            files[rel] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
    return {"format": MANIFEST_FORMAT, "files": files}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _tag(info: Mapping) -> str:
    for key in ("ETag", "etag", "md5Hash", "generation", "LastModified", "updated", "mtime",
                "created"):  # fmt: skip
        if info.get(key) is not None:
            return str(info[key])
    return ""


class RemoteModel:
    """One model's folder at a URL: its versions, which are complete, fetch and publish.

    Keeps what it saw at the last look, for the rule's second look. Its methods block
    (network): the service calls them off the event loop.

    Args:
        url: the model's folder, e.g. s3://bucket/models/fashion_mnist.
        settle_seconds: the pause before the second look at a version without a manifest.
    """

    def __init__(self, url: str, settle_seconds: float = SETTLE_SECONDS):
        self.url = url.rstrip("/")
        self.settle_seconds = settle_seconds
        self._fs = None
        self._root = ""
        self._seen: dict[int, tuple] = {}
        # (version, the manifest's tag) -> the manifest: read once, not at every poll.
        self._manifests: dict[tuple[int, str], Any] = {}

    def __repr__(self) -> str:
        return f"RemoteModel({display(self.url)!r})"

    @property
    def fs(self):
        if self._fs is None:
            self._fs, self._root = filesystem(self.url)
        return self._fs

    def _call(self, what: Callable[[], Any], where: str | None = None) -> Any:
        try:
            return what()
        except Exception as err:  # noqa: BLE001 - every failure becomes one clear line
            raise describe_error(err, display(where or self.url)) from None

    # --- listing -------------------------------------------------------------------------

    def listing(self) -> tuple[dict[int, RemoteVersion], list[str]]:
        """Every version-named folder (complete or not) and the names that are neither
        versions nor hidden, as the storage lists them now.

        Raises:
            StorageError: the listing failed (no such bucket, access denied, unreachable).
        """
        fs = self.fs
        root = self._root

        def find():
            # All of it: s3fs drops only a path and its parents, and a folder's cached listing
            # would hide a file that landed since (this instance is this model's alone).
            fs.invalidate_cache()
            return fs.find(root, detail=True)

        found = self._call(find)
        files: dict[tuple[str, int], list[RemoteFile]] = {}
        foreign: set[str] = set()
        for path, info in found.items():
            if info.get("type") == "directory":
                continue
            rel = path[len(root) :].lstrip("/") if path.startswith(root) else path
            top, _, inner = rel.partition("/")
            version = parse_version(top)
            if version is None:
                if not top.startswith("."):
                    foreign.add(top)
                continue
            if inner:
                size = int(info.get("size") or 0)
                files.setdefault((top, version), []).append(RemoteFile(inner, size, _tag(info)))
        versions: dict[int, RemoteVersion] = {}
        for (name, version), listed in sorted(files.items()):
            # "7" and "007" name the same version: the plain spelling wins (as on disk).
            if version not in versions or name == str(version):
                versions[version] = RemoteVersion(
                    version, f"{self.url}/{name}", tuple(sorted(listed, key=lambda f: f.rel))
                )
        return versions, sorted(foreign)

    def exists(self) -> bool:
        """True when the folder holds anything (object storage has no empty folders).

        Raises:
            StorageError: it cannot be listed.
        """
        versions, foreign = self.listing()
        return bool(versions or foreign)

    def problem(self, found: RemoteVersion) -> str | None:
        """Why a listed version is not complete (None when it is), by the module's rule,
        without the second look."""
        if found.has_manifest:
            try:
                manifest = self.manifest(found)
            except StorageError as err:
                return f"{MANIFEST_FILE} cannot be read yet ({err})"
            return manifest_problem(manifest, found.sizes)
        return structure_problem(found.sizes)

    def manifest(self, found: RemoteVersion) -> Any:
        """A version's manifest (None when it has none or it is not JSON)."""
        tag = next((f.tag for f in found.files if f.rel == MANIFEST_FILE), None)
        if tag is None:
            return None
        key = (found.version, tag)
        if key not in self._manifests:
            url = f"{found.url}/{MANIFEST_FILE}"
            raw = self._call(lambda: self.fs.cat_file(f"{self._root_of(found)}/{MANIFEST_FILE}"),
                             url)  # fmt: skip
            try:
                self._manifests[key] = json.loads(raw)
            except ValueError:
                self._manifests[key] = None
        return self._manifests[key]

    def _root_of(self, found: RemoteVersion) -> str:
        return f"{self._root}/{found.url.rsplit('/', 1)[-1]}"

    def versions(self) -> tuple[dict[int, RemoteVersion], dict[int, str], list[str]]:
        """(complete versions, why each other version-named folder is not, foreign names).

        A version without a manifest counts only once its listing was the same at the last
        look (the previous call) or at a second look settle_seconds after this one.

        Raises:
            StorageError: a listing failed.
        """
        listed, foreign = self.listing()
        complete, waiting = self._judge(listed)
        unsettled = [v for v in complete if not listed[v].has_manifest
                     and self._seen.get(v) != listed[v].fingerprint]  # fmt: skip
        if unsettled and self.settle_seconds > 0:
            self._seen.update({v: listed[v].fingerprint for v in unsettled})
            time.sleep(self.settle_seconds)
            listed, foreign = self.listing()
            complete, waiting = self._judge(listed)
        for v in list(complete):
            found = complete[v]
            if not found.has_manifest and self._seen.get(v) != found.fingerprint:
                del complete[v]
                waiting[v] = "its files are still changing"
        self._seen = {v: f.fingerprint for v, f in listed.items()}
        return complete, waiting, foreign

    def _judge(self, listed: dict[int, RemoteVersion]):
        complete, waiting = {}, {}
        for version, found in listed.items():
            problem = self.problem(found)
            if problem is None:
                complete[version] = found
            else:
                waiting[version] = problem
        return complete, waiting

    # --- fetching -------------------------------------------------------------------------

    def download(self, found: RemoteVersion, target: Path) -> Path:
        """Copy a complete version to `target` (a local folder that must not exist yet):
        downloaded into a hidden folder beside it, verified (sizes; with a manifest, only the
        files it lists and their sha256), then renamed into place.

        Raises:
            StorageError: a file could not be read, or is not what the listing or the
                manifest says (transient when the endpoint did not answer).
        """
        target = Path(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        manifest = self.manifest(found) if found.has_manifest else None
        if manifest is not None:
            wanted = {rel: entry["bytes"] for rel, entry in manifest["files"].items()}
            wanted[MANIFEST_FILE] = found.sizes[MANIFEST_FILE]
        else:
            wanted = {f.rel: f.size for f in found.files if not _unsafe(f.rel)}
        temp = Path(tempfile.mkdtemp(prefix=DOWNLOAD_PREFIX, dir=target.parent))
        try:
            remote_root = self._root_of(found)
            rels = sorted(wanted)
            for rel in rels:
                (temp / rel).parent.mkdir(parents=True, exist_ok=True)
            self._call(
                lambda: self.fs.get(
                    [f"{remote_root}/{rel}" for rel in rels], [str(temp / rel) for rel in rels]
                ),
                found.url,
            )
            problem = _verify(temp, wanted, manifest)
            if problem:
                raise StorageError(f"{display(found.url)}: {problem}")
            os.replace(temp, target)
            return target
        finally:
            shutil.rmtree(temp, ignore_errors=True)

    def read_text(self, rel_path: str) -> str | None:
        """A small file under the model's folder (a version's labels), or None when absent.

        Raises:
            StorageError: it cannot be read for another reason.
        """
        url = f"{self.url}/{rel_path}"
        try:
            raw = self.fs.cat_file(f"{self._root}/{rel_path}")
        except FileNotFoundError:
            return None
        except Exception as err:  # noqa: BLE001 - one clear line
            raise describe_error(err, display(url)) from None
        return raw.decode("utf-8")

    # --- publishing -----------------------------------------------------------------------

    def publish(
        self,
        version_dir: Path,
        before_upload: Callable[[int, Path], None] | None = None,
    ) -> str:
        """Upload a complete local version as the next version number; its URL.

        The number is one past every version-named folder there (complete or not: a number
        is never reused). Uploaded in an order that keeps readers off it until it is whole:
        assets and the rest, then variables/, then saved_model.pb, then `.manifest.json`
        (every file's size and sha256) last. Object storage has no rename: two publishers
        racing for one number could mix their files; the manifest's digests make readers
        refuse such a version, and a retrain's lock keeps one publisher per model dir.

        Args:
            version_dir: the complete local version (a staged export).
            before_upload: called with the number and the folder before anything is
                uploaded (to write a file that names the version).
        Raises:
            StorageError: the upload failed; what was uploaded of it is removed (the message
                says so when that failed too), so it is never served.
        """
        version_dir = Path(version_dir)
        listed, _ = self.listing()
        number = max(listed, default=0) + 1
        if before_upload is not None:
            before_upload(number, version_dir)
        manifest = build_manifest(version_dir)
        url = f"{self.url}/{number}"
        remote_root = f"{self._root}/{number}"
        rels = sorted(manifest["files"])
        groups = [
            [r for r in rels if r != SAVED_MODEL_FILE and not r.startswith("variables/")],
            [r for r in rels if r.startswith("variables/")],
            [r for r in rels if r == SAVED_MODEL_FILE],
        ]
        body = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
        try:
            for group in groups:
                if group:
                    self._call(
                        functools.partial(
                            self.fs.put,
                            [str(version_dir / r) for r in group],
                            [f"{remote_root}/{r}" for r in group],
                        ),
                        url,
                    )
            self._call(lambda: self.fs.pipe_file(f"{remote_root}/{MANIFEST_FILE}", body), url)
        except StorageError as err:
            raise self._remove_partial(remote_root, url, err) from None
        return url

    def _remove_partial(self, remote_root: str, url: str, err: StorageError) -> StorageError:
        """After a failed upload: remove what of the version was uploaded, so that no reader
        takes it for a version of another tool (complete without a manifest, once its listing
        holds still); the error to raise, saying so when it cannot be removed."""
        try:
            if self.fs.exists(remote_root):
                self.fs.rm(remote_root, recursive=True)
            return err
        except Exception as rm_err:  # noqa: BLE001 - one clear line
            left = describe_error(rm_err, display(url))
            return StorageError(
                f"{err}; and what was uploaded of it could not be removed ({left}): delete "
                f"{display(url)} before a server takes it",
                err.transient,
            )


def _verify(root: Path, sizes: Mapping[str, int], manifest: Any) -> str | None:
    """Why a downloaded copy is not the version (None when it is)."""
    for rel, size in sorted(sizes.items()):
        path = root / rel
        if not path.is_file():
            return f"{rel} did not download"
        if path.stat().st_size != size:
            return f"{rel}: {path.stat().st_size} bytes downloaded, {size} expected"
    if manifest is not None:
        for rel, entry in sorted(manifest["files"].items()):
            if entry.get("sha256") and _sha256(root / rel) != entry["sha256"]:
                return f"{rel}: not the bytes its manifest names (sha256 differs)"
    else:
        problem = structure_problem(sizes)
        if problem:
            return problem
    return None


def remove_stale_downloads(folder: Path, names: Iterable[str] = ()) -> None:
    """Remove hidden download folders (and the named entries) under a cache folder."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        if path.name.startswith(DOWNLOAD_PREFIX) or path.name in names:
            shutil.rmtree(path, ignore_errors=True)
