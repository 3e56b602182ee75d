"""The version registry: one model's versions on disk and in memory, with no TensorFlow in it.

It lists the versions in the model's folder, loads and warms them through a `Loader` it is
given (the in-process backend's runs TensorFlow; the tests' fakes do not), and keeps one
record per version with its state and error. The rules are TF Serving's, from its
model config (artifact/model_config.py):

- The version policy (`latest { num_versions }`, `all`, `specific { versions }`) picks the
  aspired versions among those on disk; a version a label points to is aspired too.
- A new aspired version is loaded and warmed before it takes any request; a version leaves
  (policy change, folder deleted) only once an aspired version is AVAILABLE, and is unloaded
  only after its in-flight requests finish (TF Serving's availability-preserving policy).
- A version that is unloaded stays listed in state END with error code OK, as TF Serving
  lists it; one that fails to load ends in state END with its error, is tried again only once
  its files change, and does not count for the policy: a broken newest export leaves the
  next newest one serving at once (TF Serving would leave the model without a version).
- Requests that name no version go to the `stable` label's version when the config has
  one (so a new export does not go live by itself), otherwise to the newest AVAILABLE one;
  a request naming a version or a label gets it if it is AVAILABLE, and TF Serving's
  "Servable not found" (404) otherwise.

The versions come from the model's source (service/backends/sources.py): its folder on
disk, or a URL on object storage whose complete versions are copied into a local cache
before they load. A listing that fails changes nothing: what is loaded keeps serving.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Protocol

from artifact.model_config import ConfigError, ModelEntry
from artifact.repository import assets_stamp
from artifact.storage import StorageError
from service.backends.sources import Sources
from service.errors import BadInput, NotFound, NotReady, check_label_name
from service.types import VersionState, VersionStatus

log = logging.getLogger("service.backends.registry")

# The label requests that name no version go to, when the config has it.
STABLE = "stable"


class Loader(Protocol):
    """Loads one version into something that can serve it, and lets it go."""

    async def load(self, version: int, path: Path) -> Any:
        """Load and warm up a version; raise when it cannot serve."""

    async def unload(self, servable: Any) -> None:
        """Release a loaded version."""

    async def reload_assets(self, servable: Any, path: Path) -> Any:
        """The servable with its assets.extra/ read again; raise to keep the old one."""


def servable_not_found(name: str, version: int | None) -> str:
    """TF Serving's own wording for a model or version it does not serve."""
    if version is None:
        return f"Servable not found for request: Latest({name})"
    return f"Servable not found for request: Specific({name}, {version})"


def contract_change(before: dict, after: dict) -> str:
    """What differs between two versions' signatures (name -> typed signature), briefly."""
    changes = []
    for name in sorted(set(before) | set(after)):
        if name not in after:
            changes.append(f"no {name!r} signature")
        elif name not in before:
            changes.append(f"a new {name!r} signature")
        elif before[name] != after[name]:
            old, new = before[name], after[name]
            parts = []
            for what in ("inputs", "outputs"):
                was = {spec.name: spec for spec in getattr(old, what)}
                now = {spec.name: spec for spec in getattr(new, what)}
                if set(was) != set(now):
                    parts.append(f"{what} {sorted(was)} -> {sorted(now)}")
                else:
                    parts += [
                        f"{key} {_tensor_text(was[key])} -> {_tensor_text(now[key])}"
                        for key in sorted(was)
                        if was[key] != now[key]
                    ]
            if old.method_name != new.method_name:
                parts.append(f"method {old.method_name} -> {new.method_name}")
            changes.append(f"{name!r}: " + ", ".join(parts))
    return "; ".join(changes)


def _tensor_text(spec) -> str:
    shape = "unknown rank" if spec.shape is None else list(spec.shape)
    return f"{spec.dtype} {shape}"


@dataclasses.dataclass
class VersionRecord:
    """What the registry knows of one version."""

    version: int
    path: Path
    state: VersionState = VersionState.START
    error: str = ""
    # Its files' stamp (the source's: modification times, or a listing) when last tried.
    stamp: Any = 0.0
    servable: Any = None
    loading: asyncio.Future | None = None
    inflight: int = 0
    # assets.extra/'s newest modification time when the servable read it.
    assets_stamp: float = 0.0

    def status(self) -> VersionStatus:
        if self.state == VersionState.END and self.error:
            return VersionStatus(self.version, self.state, "UNKNOWN", self.error)
        return VersionStatus(self.version, self.state)

    @property
    def failed(self) -> bool:
        return self.state == VersionState.END and bool(self.error)


class Lease:
    """A request's hold on a loaded version: the version stays loaded until released."""

    def __init__(self, registry: VersionRegistry, record: VersionRecord):
        self.version = record.version
        self.servable = record.servable
        self._registry = registry
        self._record: VersionRecord | None = record
        record.inflight += 1

    def release(self) -> None:
        if self._record is not None:
            self._registry._released(self._record)
            self._record = None


class VersionRegistry:
    """One model's versions: list, load, warm, swap, unload.

    Args:
        entry: the model's config entry (name, base path, policy, labels).
        loader: loads and unloads versions.
        allow_signature_changes: ALLOW_SIGNATURE_CHANGES: a new version whose signatures
            differ from the serving version's may serve (refused otherwise, so a retrain
            cannot silently change what clients must send).
        sources: makes the source of the entry's base path (a folder, or a URL and its cache).
        observer: told how long each load took, or that it failed (version_loaded).
    """

    def __init__(
        self,
        entry: ModelEntry,
        loader: Loader,
        allow_signature_changes: bool = False,
        sources: Sources | None = None,
        observer=None,
    ):
        self.entry = entry
        self.loader = loader
        # Told of every load's end (the metrics: service/backends/base.py's Observer).
        self.observer = observer
        self._sources = sources or Sources()
        self.source = self._sources.open(entry.base_path)
        self.allow_signature_changes = allow_signature_changes
        self.records: dict[int, VersionRecord] = {}
        self._reason = "the model is loading"
        self._warned: set[str] = set()
        self._refreshing = asyncio.Lock()
        self._unloads: set[asyncio.Task] = set()
        self._closed = False

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def model_dir(self) -> Path:
        """The folder the versions load from: the model's own, or its cache for a URL."""
        return self.source.local_dir

    @property
    def labels(self) -> dict[str, int]:
        return dict(self.entry.labels)

    # --- reading ------------------------------------------------------------------------

    def available(self) -> list[int]:
        """The AVAILABLE versions, oldest first."""
        return sorted(v for v, r in self.records.items() if r.state == VersionState.AVAILABLE)

    @property
    def serving(self) -> int | None:
        """The version answering requests that name none (None while nothing answers)."""
        # One pass, not available()'s sorted list: every request asks this, mostly twice.
        stable = self.entry.labels.get(STABLE)
        newest = None
        for version, record in self.records.items():
            if record.state == VersionState.AVAILABLE:
                if version == stable:
                    return stable
                if newest is None or version > newest:
                    newest = version
        return newest

    def not_ready_reason(self) -> str:
        """Why no version serves (meaningful while `serving` is None)."""
        return self._reason

    def statuses(self) -> list[VersionStatus]:
        """Every version the registry knows of, the serving one first, then newest first."""
        serving = self.serving
        ordered = sorted(self.records.values(), key=lambda r: (r.version != serving, -r.version))
        return [r.status() for r in ordered if r.state != VersionState.START]

    def version_status(self, version: int) -> VersionStatus:
        """One version's status.

        Raises:
            NotFound: TF Serving's GetModelStatus wording for a version it does not have.
        """
        record = self.records.get(version)
        if record is None or record.state == VersionState.START:
            raise NotFound(f"Could not find version {version} of model {self.name}")
        return record.status()

    def label_version(self, label: str) -> int | None:
        """The version a label points to, or None when the config has no such label."""
        return self.entry.labels.get(label)

    def servable_of(self, version: int) -> Any:
        """The loaded object of an AVAILABLE version (KeyError when it is not loaded)."""
        record = self.records[version]
        if record.state != VersionState.AVAILABLE:
            raise KeyError(version)
        return record.servable

    # --- serving requests ---------------------------------------------------------------

    def acquire(self, version: int | None = None, label: str | None = None) -> Lease:
        """A lease on the version a request names (by number or label), or the serving one.

        Release it when the request is done: a version leaving the policy is unloaded only
        once no lease holds it.

        Raises:
            BadInput: both a version and a label, or a malformed or unknown label.
            NotReady: nothing serves yet.
            NotFound: the version is not AVAILABLE (TF Serving's wording).
        """
        if version is not None and label is not None:
            raise BadInput(
                f"Both model version ({version}) and model version label ({label}) cannot "
                "be supplied."
            )
        if label is not None:
            check_label_name(label)
            version = self.entry.labels.get(label)
            if version is None:
                # TF Serving's wording (an INVALID_ARGUMENT there too).
                raise BadInput(f"Unrecognized servable version label: {label}")
        elif version is None:
            version = self.serving
            if version is None:
                raise NotReady(f"model {self.name} is not ready: {self._reason}")
        record = self.records.get(version)
        if record is None or record.state != VersionState.AVAILABLE:
            raise NotFound(servable_not_found(self.name, version))
        return Lease(self, record)

    def _released(self, record: VersionRecord) -> None:
        record.inflight -= 1
        if record.state == VersionState.UNLOADING and record.inflight == 0:
            self._finish_unload(record)

    # --- following the repository and the config ----------------------------------------

    def configure(self, entry: ModelEntry) -> None:
        """Take a new config entry (policy, labels); the next refresh() applies it."""
        if entry.base_path != self.entry.base_path:
            self.source = self._sources.open(entry.base_path)
        self.entry = entry

    def label_problems(self, labels: dict[str, int], allow_unavailable: bool) -> list[str]:
        """Why labels cannot be assigned now: TF Serving's rule, a label may point only to
        an AVAILABLE version; with `allow_unavailable`, a new label (one not pointing to
        another version now) may point to any version."""
        problems = []
        for label, version in sorted(labels.items()):
            current = self.entry.labels.get(label)
            if allow_unavailable and current in (None, version):
                continue
            record = self.records.get(version)
            if record is None or record.state != VersionState.AVAILABLE:
                problems.append(
                    f"Request to assign label to version {version} of model {self.name}, "
                    "which is not currently available for inference"
                )
        return problems

    async def refresh(self) -> None:
        """Realize the policy against the folder: load the aspired versions that are not
        loaded yet (newest first), then unload the others, preserving availability."""
        async with self._refreshing:
            if self._closed:
                return
            try:
                on_disk = await self.source.scan()
            except StorageError as err:
                # Nothing changes: what is loaded keeps serving (the source logs it).
                if self.serving is None:
                    self._reason = f"cannot list the versions of {self.name}: {err}"
                return
            self._warn_foreign()
            # A version gone from the folder is forgotten only if it never loaded: an unloaded
            # or failed one keeps its END status, as TF Serving keeps it.
            for version in [v for v, r in self.records.items() if v not in on_disk]:
                if self.records[version].state == VersionState.START:
                    del self.records[version]
            # Versions that failed and have not changed since do not count for the policy:
            # the next newest takes their place. A failure makes another pass.
            while True:
                loadable = [
                    v
                    for v, path in on_disk.items()
                    if not (
                        v in self.records
                        and self.records[v].failed
                        and self.records[v].stamp == self.source.stamp(v, path)
                    )
                ]
                aspired = self.entry.aspired(loadable)
                wanted = [
                    v
                    for v in sorted(aspired, reverse=True)
                    if self._record(v, on_disk[v]).state != VersionState.AVAILABLE
                ]
                failed_now = False
                for version in wanted:
                    try:
                        await self._load(self.records[version])
                    except Exception:  # noqa: BLE001 - recorded and logged; the policy moves on
                        failed_now = True
                if not failed_now:
                    break
            self._unload_unaspired(aspired)
            self.source.retain(
                {v for v, r in self.records.items() if r.servable is not None or r.loading}
            )
            await self._reload_changed_assets()
            serving = self.serving
            if serving is None:
                self._reason = self._why_nothing_serves(on_disk)

    async def _reload_changed_assets(self) -> None:
        """Labels and the rest of assets.extra/ are read again when they change (a copy that
        wrote them after the model files, or a fix); new labels that break the contract are
        refused with a warning and the old ones kept."""
        reload = getattr(self.loader, "reload_assets", None)
        if reload is None:
            return
        for record in list(self.records.values()):
            if record.state != VersionState.AVAILABLE:
                continue
            stamp = assets_stamp(record.path)
            if stamp == record.assets_stamp:
                continue
            record.assets_stamp = stamp
            try:
                record.servable = await reload(record.servable, record.path)
            except Exception as err:  # noqa: BLE001 - the version keeps serving as it was
                log.warning(
                    "%s version %s: assets.extra/ changed but cannot be used, keeping the "
                    "previous: %s",
                    self.name,
                    record.version,
                    err,
                )
            else:
                log.info("%s version %s: assets.extra/ read again", self.name, record.version)

    def _unload_unaspired(self, aspired: set[int]) -> None:
        """TF Serving's availability-preserving rule: a version that is no longer aspired
        leaves once an aspired one is AVAILABLE (or when nothing is aspired at all);
        otherwise the newest of them stays, so something keeps answering."""
        available = self.available()
        leaving = [v for v in available if v not in aspired]
        if not leaving:
            return
        if aspired and not any(v in aspired for v in available):
            leaving = leaving[:-1]
        for version in leaving:
            record = self.records[version]
            record.state = VersionState.UNLOADING
            log.info("Unloading %s version %s (no longer aspired)", self.name, version)
            if record.inflight == 0:
                self._finish_unload(record)

    def _finish_unload(self, record: VersionRecord) -> None:
        # The record stays, in END with no error: TF Serving's status keeps listing an
        # unloaded version so, with error code OK (core/servable_state_monitor.cc keeps the
        # last state of every servable it saw; model_servers/get_model_status_impl.cc).
        servable, record.servable = record.servable, None
        record.state, record.error = VersionState.END, ""
        task = asyncio.ensure_future(self.loader.unload(servable))
        self._unloads.add(task)
        task.add_done_callback(self._unloads.discard)

    def _why_nothing_serves(self, on_disk: dict[int, Path]) -> str:
        if not on_disk:
            waiting = sorted(self.source.waiting.items())
            if waiting:
                version, why = waiting[-1]
                return f"no complete version under {self.source.where} yet ({version}: {why})"
            return f"no version under {self.source.where}"
        failures = [r for r in self.records.values() if r.failed]
        if failures:
            newest = max(failures, key=lambda r: r.version)
            return (
                f"no version of {self.name} loads; version {newest.version} failed: {newest.error}"
            )
        return "the model is loading"

    def _record(self, version: int, path: Path) -> VersionRecord:
        record = self.records.get(version)
        if record is None:
            record = self.records[version] = VersionRecord(version, path)
        return record

    def _warn_foreign(self) -> None:
        for name in self.source.foreign():
            if name not in self._warned:
                self._warned.add(name)
                log.warning(
                    "Ignoring %r in %s: a version folder is named by a non-negative integer "
                    "in ASCII digits",
                    name,
                    self.source.where,
                )

    async def _load(self, record: VersionRecord) -> Any:
        """Load one version once, however many callers ask for it at the same time."""
        if record.state == VersionState.AVAILABLE:
            return record.servable
        if record.loading is None:
            record.state, record.error = VersionState.LOADING, ""
            record.stamp = self.source.stamp(record.version, record.path)
            record.loading = asyncio.ensure_future(self._fetch_and_load(record))
        pending = record.loading
        try:
            servable = await asyncio.shield(pending)
            if record.loading is pending:
                self._check_signatures(record.version, servable)
        except Exception as err:
            if record.loading is pending:
                record.loading = None
                record.state, record.error = VersionState.END, f"{type(err).__name__}: {err}"
                log.error("Loading %s version %s failed: %s", self.name, record.version, err)
            raise
        if record.loading is pending:
            record.loading = None
            record.state, record.servable = VersionState.AVAILABLE, servable
            log.info("%s version %s is AVAILABLE", self.name, record.version)
        return servable

    async def _fetch_and_load(self, record: VersionRecord) -> Any:
        # A URL's version is copied into the cache first; a folder on disk is used in place.
        started = time.monotonic()
        try:
            record.path = await self.source.fetch(record.version, record.path)
            # Before the load reads them: a change during the load is seen next time.
            record.assets_stamp = assets_stamp(record.path)
            servable = await self.loader.load(record.version, record.path)
        except Exception:
            if self.observer is not None:
                self.observer.version_loaded(self.name, time.monotonic() - started, True)
            raise
        if self.observer is not None:
            self.observer.version_loaded(self.name, time.monotonic() - started, False)
        return servable

    def _check_signatures(self, version: int, servable: Any) -> None:
        """Refuse (and let go of) a new version whose signatures differ from the serving
        version's, unless the setting allows it: clients would have to send other inputs."""
        serving = self.serving
        if self.allow_signature_changes or serving is None or serving == version:
            return
        before = getattr(self.records[serving].servable, "contract", None)
        after = getattr(servable, "contract", None)
        if before is None or after is None or before == after:
            return
        task = asyncio.ensure_future(self.loader.unload(servable))
        self._unloads.add(task)
        task.add_done_callback(self._unloads.discard)
        raise ValueError(
            f"its signatures differ from version {serving}'s, which serves: "
            f"{contract_change(before, after)}; set ALLOW_SIGNATURE_CHANGES=true to serve it"
        )

    async def close(self) -> None:
        """Unload every version (in-flight requests keep theirs until they finish)."""
        async with self._refreshing:
            self._closed = True
            for record in list(self.records.values()):
                if record.loading is not None:
                    record.loading.cancel()
                if record.servable is not None:
                    record.state = VersionState.UNLOADING
                    if record.inflight == 0:
                        self._finish_unload(record)
            self.records = {v: r for v, r in self.records.items() if r.inflight}
            self._reason = "the model was unloaded"
            self.source.close()
        if self._unloads:
            await asyncio.gather(*self._unloads, return_exceptions=True)


class ModelRegistry:
    """Every model of the config, each with its VersionRegistry; applies configs whole.

    Args:
        loader: loads and unloads versions (shared by every model).
        allow_unavailable_labels: TF Serving's --allow_version_labels_for_unavailable_models:
            a new label may point to a version that is not AVAILABLE (yet).
        allow_signature_changes: ALLOW_SIGNATURE_CHANGES (see VersionRegistry).
        sources: makes each model's source (MODEL_CACHE_DIR for URLs).
    """

    def __init__(
        self,
        loader: Loader,
        allow_unavailable_labels: bool = False,
        allow_signature_changes: bool = False,
        sources: Sources | None = None,
    ):
        self.loader = loader
        self.sources = sources or Sources()
        self.allow_unavailable_labels = allow_unavailable_labels
        self.allow_signature_changes = allow_signature_changes
        self.models: dict[str, VersionRegistry] = {}
        # Handed to each model's registry (set before the models load).
        self.observer = None
        self._applying = asyncio.Lock()

    def get(self, name: str) -> VersionRegistry | None:
        return self.models.get(name)

    async def apply(self, entries: list[ModelEntry]) -> list[str]:
        """Realize a new config whole, or refuse it whole (the previous one keeps serving).

        Models no longer listed are unloaded; new ones are loaded; the others take their new
        policy and labels. A label may point only to an AVAILABLE version (TF Serving's
        rule), so a new model's labels are checked once its versions have loaded.

        Returns:
            What changed, a line each (for the log).
        Raises:
            ConfigError: a label breaks the rule; nothing was changed.
        """
        async with self._applying:
            problems: list[str] = []
            for entry in entries:
                current = self.models.get(entry.name)
                if current is not None:
                    problems += current.label_problems(
                        dict(entry.labels), self.allow_unavailable_labels
                    )
            fresh: dict[str, VersionRegistry] = {}
            if not problems:
                for entry in entries:
                    if entry.name in self.models:
                        continue
                    registry = VersionRegistry(
                        dataclasses.replace(entry, labels={}),
                        self.loader,
                        self.allow_signature_changes,
                        self.sources,
                        self.observer,
                    )
                    fresh[entry.name] = registry
                    await registry.refresh()
                    problems += registry.label_problems(
                        dict(entry.labels), self.allow_unavailable_labels
                    )
            if problems:
                for registry in fresh.values():
                    await registry.close()
                raise ConfigError("; ".join(problems))
            changes = []
            listed = {entry.name for entry in entries}
            for name in [n for n in self.models if n not in listed]:
                changes.append(f"model {name}: no longer in the config, unloaded")
                await self.models.pop(name).close()
            for entry in entries:
                registry = self.models.get(entry.name) or fresh[entry.name]
                before = registry.entry
                if entry.name in fresh:
                    changes.append(
                        f"model {entry.name}: added ({entry.policy.describe()}, labels "
                        f"{dict(entry.labels) or 'none'})"
                    )
                elif before != entry:
                    changes.append(
                        f"model {entry.name}: policy {before.policy.describe()} -> "
                        f"{entry.policy.describe()}, labels {dict(before.labels) or 'none'} -> "
                        f"{dict(entry.labels) or 'none'}"
                    )
                registry.configure(entry)
                self.models[entry.name] = registry
                await registry.refresh()
            return changes

    async def refresh(self) -> None:
        """Follow every model's folder (new versions, deleted ones, changed files)."""
        for registry in list(self.models.values()):
            await registry.refresh()

    async def close(self) -> None:
        for registry in self.models.values():
            await registry.close()
        self.models.clear()
        self.sources.close()
