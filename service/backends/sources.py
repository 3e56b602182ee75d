"""Where a model's versions come from: a folder on disk, or a URL on object storage whose
complete versions are copied into a local cache before they load.

The version registry asks its source for the versions there now (`scan`), a stamp that
changes when a version's files do (a version that failed to load is tried again only then),
and a local folder to load a version from (`fetch`). A folder on disk is its own source, as
it always was: nothing here runs for it but `list_versions`, and fsspec is never imported.

For a URL (artifact/storage.py has the completeness rule):

- a complete version is downloaded into the cache, verified and renamed into place before
  the loader sees it; a version that is not complete yet is said once in the log and looked
  at again at the next poll;
- a listing that fails (the endpoint gone, credentials refused) changes nothing: the
  versions loaded keep serving from memory, the failure is logged when it starts, then at
  most once a minute, and once when the listing works again;
- a download that fails because the endpoint did not answer is tried again at the next
  poll; one that fails verification, when the version's files change;
- the cache holds only what is loaded or loading: a version unloaded, failed or deleted
  leaves it at the end of the poll, and the process's cache folder is removed when it stops.

Each process has a folder of its own in the cache (MODEL_CACHE_DIR/<pid>), so workers never
share a download; folders of processes that are gone are removed at start.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import shutil
import time
from pathlib import Path

from artifact.repository import files_stamp, foreign_entries, list_versions, parse_version
from artifact.storage import (
    SETTLE_SECONDS,
    RemoteModel,
    StorageError,
    display,
    is_url,
    remove_stale_downloads,
)

log = logging.getLogger("service.backends.sources")

# A listing that keeps failing is logged again at most this often.
FAILURE_LOG_SECONDS = 60.0


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME (else ~/.cache)/estimator-serving/models."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "estimator-serving" / "models"


class LocalSource:
    """A model folder on disk: read in place, as TF Serving reads it."""

    def __init__(self, base_path: Path):
        self.local_dir = Path(base_path)
        self.where = str(base_path)
        self.waiting: dict[int, str] = {}

    async def scan(self) -> dict[int, Path]:
        return dict(list_versions(self.local_dir))

    def foreign(self) -> list[str]:
        return foreign_entries(self.local_dir)

    def stamp(self, version: int, path: Path):
        return files_stamp(path)

    async def fetch(self, version: int, path: Path) -> Path:
        return path

    def retain(self, versions: set[int]) -> None:
        """Nothing to let go of: the folder is the user's."""

    def close(self) -> None:
        """Nothing to remove."""


class RemoteSource:
    """A model folder at a URL, its loaded versions copied into `cache_dir`.

    Args:
        url: the model's folder (s3://bucket/models/name).
        cache_dir: this model's folder in the process's cache.
        settle_seconds: the completeness rule's second look (artifact.storage).
    """

    def __init__(self, url: str, cache_dir: Path, settle_seconds: float = SETTLE_SECONDS):
        self.model = RemoteModel(url, settle_seconds)
        self.local_dir = Path(cache_dir)
        self.where = display(url)
        self.waiting: dict[int, str] = {}
        self._found: dict = {}
        self._foreign: list[str] = []
        self._scans = 0
        # Versions whose download failed because the endpoint did not answer.
        self._retry: set[int] = set()
        self._said: dict[int, str] = {}
        self._failing_since: float | None = None
        self._failures = 0
        self._logged_at = 0.0

    async def scan(self) -> dict[int, Path]:
        """The complete versions (each with the cache folder it loads from).

        Raises:
            StorageError: the listing failed (logged here, rate-limited).
        """
        try:
            complete, waiting, foreign = await asyncio.to_thread(self.model.versions)
        except StorageError as err:
            self._failed(err)
            raise
        if self._failing_since is not None:
            log.info(
                "%s: listed again after %d failed poll(s) in %.0f s",
                self.where,
                self._failures,
                time.monotonic() - self._failing_since,
            )
            self._failing_since, self._failures = None, 0
        self._scans += 1
        self._found, self._foreign, self.waiting = complete, foreign, waiting
        for version, reason in sorted(waiting.items()):
            if self._said.get(version) != reason:
                log.info("%s: version %s is not complete yet (%s)", self.where, version, reason)
        self._said = dict(waiting)
        return {version: self.local_dir / str(version) for version in complete}

    def _failed(self, err: StorageError) -> None:
        now = time.monotonic()
        self._failures += 1
        if self._failing_since is None:
            self._failing_since = self._logged_at = now
            log.warning("%s: cannot list the versions; those loaded keep serving: %s",
                        self.where, err)  # fmt: skip
        elif now - self._logged_at >= FAILURE_LOG_SECONDS:
            self._logged_at = now
            log.warning("%s: still cannot list the versions (%d failed polls): %s",
                        self.where, self._failures, err)  # fmt: skip

    def foreign(self) -> list[str]:
        return self._foreign

    def stamp(self, version: int, path: Path):
        """The version's listing, and the scan's number while a download is to be retried."""
        found = self._found.get(version)
        return (
            found.fingerprint if found is not None else None,
            self._scans if version in self._retry else None,
        )

    async def fetch(self, version: int, path: Path) -> Path:
        """The version downloaded and verified into the cache; its folder there.

        Raises:
            StorageError: it could not be downloaded or is not what was listed.
        """
        found = self._found.get(version)
        if found is None:
            raise StorageError(f"{self.where}: version {version} is no longer listed", True)
        target = self.local_dir / str(version)
        shutil.rmtree(target, ignore_errors=True)
        started = time.monotonic()
        try:
            await asyncio.to_thread(self.model.download, found, target)
        except StorageError as err:
            if err.transient:
                self._retry.add(version)
            raise
        self._retry.discard(version)
        log.info(
            "%s: version %s copied to the cache (%d files, %d bytes) in %.1f s",
            self.where,
            version,
            len(found.files),
            sum(f.size for f in found.files),
            time.monotonic() - started,
        )
        return target

    def retain(self, versions: set[int]) -> None:
        """Remove from the cache every version not in `versions` (the loaded ones)."""
        if not self.local_dir.is_dir():
            return
        stale = [p.name for p in self.local_dir.iterdir() if parse_version(p.name) not in versions]
        remove_stale_downloads(self.local_dir, stale)

    def close(self) -> None:
        shutil.rmtree(self.local_dir, ignore_errors=True)


class Sources:
    """Makes each model's source; owns this process's folder in the cache.

    Args:
        cache_dir: MODEL_CACHE_DIR (default_cache_dir() when None).
        settle_seconds: the completeness rule's second look.
    """

    def __init__(self, cache_dir: str | Path | None = None, settle_seconds: float = SETTLE_SECONDS):
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.settle_seconds = settle_seconds
        self._own: Path | None = None

    def open(self, base_path: Path | str) -> LocalSource | RemoteSource:
        """The source of a model config entry's base path."""
        if is_url(base_path):
            return RemoteSource(base_path, self.process_dir() / cache_key(base_path),
                                self.settle_seconds)  # fmt: skip
        return LocalSource(Path(base_path))

    def process_dir(self) -> Path:
        """This process's cache folder, made (private) on first use; the folders of
        processes that are gone are removed then."""
        if self._own is None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            for path in self.cache_dir.iterdir():
                if (
                    path.name.isdigit()
                    and int(path.name) != os.getpid()
                    and not _alive(int(path.name))
                ):
                    shutil.rmtree(path, ignore_errors=True)
            own = self.cache_dir / str(os.getpid())
            shutil.rmtree(own, ignore_errors=True)  # a pid reused: nothing of it is trusted
            own.mkdir(mode=0o700)
            self._own = own
        return self._own

    def close(self) -> None:
        if self._own is not None:
            shutil.rmtree(self._own, ignore_errors=True)
            self._own = None


def cache_key(url: str) -> str:
    """A folder name for a model's URL: readable, and unique by a digest."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", display(url)).strip("_")[-80:]
    return f"{readable}-{hashlib.sha256(url.encode()).hexdigest()[:10]}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
