"""The version registry: one model's versions on disk and in memory, with no TensorFlow in it.

It lists the versions in the model's folder, loads and warms them through a `Loader` it is
given (the in-process backend's runs TensorFlow; the tests' fakes do not), swaps a newer
version in only once it answers, unloads versions whose folder is gone, and keeps one record
per version with its state and error. The rules are TF Serving's:

- At start and on every refresh, the newest version on disk that loads serves the requests
  that name no version. A version that fails stays out (state END with its error) and the
  next newest is tried at once, so a broken newest version never leaves the service unready
  while an older one works.
- A failed version is tried again only once its files change (a copy that was still running,
  or a fix), not on every poll or request.
- A version whose folder is deleted is unloaded; when it was serving, the newest version left
  serves (deleting a bad version rolls back).
- An older version on disk is loaded the first time a request names it; requests that arrive
  while it loads wait for the same load.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import Any, Protocol

from artifact.repository import files_stamp, foreign_entries, list_versions
from service.errors import NotFound, NotReady
from service.types import VersionState, VersionStatus

log = logging.getLogger("service.registry")


class Loader(Protocol):
    """Loads one version into something that can serve it, and lets it go."""

    async def load(self, version: int, path: Path) -> Any:
        """Load and warm up a version; raise when it cannot serve."""

    async def unload(self, servable: Any) -> None:
        """Release a loaded version."""


def servable_not_found(name: str, version: int | None) -> str:
    """TF Serving's own wording for a model or version it does not serve."""
    if version is None:
        return f"Servable not found for request: Latest({name})"
    return f"Servable not found for request: Specific({name}, {version})"


@dataclasses.dataclass
class VersionRecord:
    """What the registry knows of one version."""

    version: int
    path: Path
    state: VersionState = VersionState.START
    error: str = ""
    # The newest modification time of its files when it was last tried.
    stamp: float = 0.0
    servable: Any = None
    loading: asyncio.Future | None = None

    def status(self) -> VersionStatus:
        if self.state == VersionState.END and self.error:
            return VersionStatus(self.version, self.state, "UNKNOWN", self.error)
        return VersionStatus(self.version, self.state)

    @property
    def failed(self) -> bool:
        return self.state == VersionState.END and bool(self.error)


class VersionRegistry:
    """One model's versions: list, load, warm, swap, unload.

    Args:
        name: the model's name (MODEL_NAME).
        model_dir: its folder in the repository (MODEL_BASE_PATH/MODEL_NAME).
        loader: loads and unloads versions.
    """

    def __init__(self, name: str, model_dir: str | Path, loader: Loader):
        self.name = name
        self.model_dir = Path(model_dir)
        self.loader = loader
        self.records: dict[int, VersionRecord] = {}
        self.serving: int | None = None
        self._reason = "the model is loading"
        self._warned: set[str] = set()
        self._refreshing = asyncio.Lock()

    # --- reading ------------------------------------------------------------------------

    def not_ready_reason(self) -> str:
        """Why no version serves (meaningful while `serving` is None)."""
        return self._reason

    def statuses(self) -> list[VersionStatus]:
        """Every version the registry knows of, the serving one first, then newest first."""
        ordered = sorted(
            self.records.values(), key=lambda r: (r.version != self.serving, -r.version)
        )
        return [r.status() for r in ordered if r.state != VersionState.START]

    def servable_of(self, version: int) -> Any:
        """The loaded object of an AVAILABLE version (KeyError when it is not loaded)."""
        record = self.records[version]
        if record.state != VersionState.AVAILABLE:
            raise KeyError(version)
        return record.servable

    # --- following the repository -------------------------------------------------------

    async def refresh(self) -> None:
        """Follow the model's folder: drop versions that are gone, and serve the newest
        version that loads when it is newer than the one serving."""
        async with self._refreshing:
            on_disk = dict(list_versions(self.model_dir))
            self._warn_foreign()
            await self._forget_missing(on_disk)
            newer = sorted(
                (v for v in on_disk if self.serving is None or v > self.serving), reverse=True
            )
            for version in newer:
                record = self._record(version, on_disk[version])
                if record.failed and record.stamp == files_stamp(record.path):
                    continue
                try:
                    await self._load(record)
                except Exception:  # noqa: BLE001 - recorded and logged; the next one is tried
                    continue
                self._serve(version)
                break
            if self.serving is None:
                self._reason = self._why_nothing_serves(on_disk)

    def _why_nothing_serves(self, on_disk: dict[int, Path]) -> str:
        if not on_disk:
            return f"no version under {self.model_dir}"
        failures = [r for r in self.records.values() if r.failed]
        if failures:
            newest = max(failures, key=lambda r: r.version)
            return (
                f"no version of {self.name} loads; version {newest.version} failed: {newest.error}"
            )
        return "the model is loading"

    def _serve(self, version: int) -> None:
        previous, self.serving = self.serving, version
        log.info(
            "Serving %s version %s%s",
            self.name,
            version,
            f" (was {previous})" if previous is not None else "",
        )

    def _record(self, version: int, path: Path) -> VersionRecord:
        record = self.records.get(version)
        if record is None:
            record = self.records[version] = VersionRecord(version, path)
        return record

    def _warn_foreign(self) -> None:
        for name in foreign_entries(self.model_dir):
            if name not in self._warned:
                self._warned.add(name)
                log.warning(
                    "Ignoring %r in %s: a version folder is named by a non-negative integer "
                    "in ASCII digits",
                    name,
                    self.model_dir,
                )

    async def _forget_missing(self, on_disk: dict[int, Path]) -> None:
        gone = [v for v in self.records if v not in on_disk]
        unloaded = []
        for version in gone:
            record = self.records.pop(version)
            if record.servable is not None:
                unloaded.append(version)
                await self.loader.unload(record.servable)
        if self.serving in gone:
            available = [v for v, r in self.records.items() if r.state == VersionState.AVAILABLE]
            self.serving = max(available, default=None)
        if unloaded:
            log.warning(
                "Version(s) %s of %s left %s: unloaded; serving %s",
                ", ".join(map(str, sorted(unloaded))),
                self.name,
                self.model_dir,
                self.serving if self.serving is not None else "nothing until a version appears",
            )

    # --- loading ------------------------------------------------------------------------

    async def _load(self, record: VersionRecord) -> Any:
        """Load one version once, however many callers ask for it at the same time."""
        if record.state == VersionState.AVAILABLE:
            return record.servable
        if record.loading is None:
            record.state, record.error = VersionState.LOADING, ""
            record.stamp = files_stamp(record.path)
            record.loading = asyncio.ensure_future(self.loader.load(record.version, record.path))
        pending = record.loading
        try:
            servable = await asyncio.shield(pending)
        except Exception as err:
            if record.loading is pending:
                record.loading = None
                record.state, record.error = VersionState.END, f"{type(err).__name__}: {err}"
                log.error("Loading %s version %s failed: %s", self.name, record.version, err)
            raise
        if record.loading is pending:
            record.loading = None
            record.state, record.servable = VersionState.AVAILABLE, servable
        return servable

    async def servable(self, version: int | None) -> tuple[int, Any]:
        """(version, loaded object) for a request: the serving version, or the one named.

        Raises:
            NotReady: nothing serves yet, or the named version failed to load.
            NotFound: the named version is not on disk.
        """
        if version is None:
            if self.serving is None:
                raise NotReady(f"model {self.name} is not ready: {self._reason}")
            return self.serving, self.records[self.serving].servable
        record = self.records.get(version)
        if record is not None and record.state == VersionState.AVAILABLE:
            return version, record.servable
        path = self.model_dir / str(version)
        if record is None:
            if (version, path) not in list_versions(self.model_dir):
                raise NotFound(servable_not_found(self.name, version))
            record = self._record(version, path)
        elif record.failed and record.stamp == files_stamp(record.path):
            # Not retried per request: only once its files change.
            raise NotReady(f"version {version} of {self.name} failed to load: {record.error}")
        try:
            return version, await self._load(record)
        except Exception as err:
            raise NotReady(
                f"version {version} of {self.name} failed to load: {record.error}"
            ) from err

    async def version_status(self, version: int) -> VersionStatus:
        """One version's status; loads it when it is on disk and not loaded yet.

        Raises:
            NotFound: TF Serving's GetModelStatus wording for a version it does not have.
        """
        record = self.records.get(version)
        if record is None and not (self.model_dir / str(version)).is_dir():
            raise NotFound(f"Could not find version {version} of model {self.name}")
        if record is not None and record.failed:
            return record.status()
        await self.servable(version)
        return self.records[version].status()

    async def close(self) -> None:
        """Unload every version."""
        for record in list(self.records.values()):
            if record.loading is not None:
                record.loading.cancel()
            if record.servable is not None:
                await self.loader.unload(record.servable)
        self.records.clear()
        self.serving = None
        self._reason = "the service is shutting down"
