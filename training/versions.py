"""The model repository's versions as the trainers write them, without TensorFlow.

- Which version serves now (`serving_baseline`): the model config's `stable` label, else the
  newest version its policy serves, else the newest on disk. The gated retrain judges its
  candidate against it; the publish step (training/staging.py) checks that it still is.
- A complete version moved in as the next number (`publish_next`, `publish_staged`): one
  rename, retried when another writer takes the number first; a folder staged on another
  filesystem is copied beside the versions first. TF Serving and the service, which poll the
  folder, never see half a version.
- A label moved onto a published version (`move_label`), within training.promote's rules.
- A model folder on object storage (`s3://`, `gs://`; artifact/storage.py) takes the same
  calls: a version is uploaded with its manifest last instead of renamed in, and the serving
  version is downloaded to judge against.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from artifact.contract import ASSETS_EXTRA, REPORT_FILE
from artifact.model_config import ConfigError, ModelEntry, Policy, parse_config
from artifact.repository import list_versions, parse_version, read_report
from artifact.storage import RemoteModel, StorageError, basename, display, is_url, location
from training.errors import UsageError
from training.promote import promote

STAGING_PREFIX = ".export-"
# Staging directories older than this belong to a killed export and are swept away.
STALE_STAGING_SECONDS = 3600
# What a blessed candidate is published as: the next version only, or also labeled.
PUBLISH_MODES = ("version", "canary", "stable")


@dataclasses.dataclass(frozen=True)
class Baseline:
    """The version serving now, and why it is the one."""

    version: int
    # A folder on disk (for a model on object storage: its local copy, or its URL).
    path: Path | str
    chosen_by: str


def config_entry(config: str | Path, export_dir: Path | str) -> ModelEntry:
    """The model config's entry whose base_path is export_dir (UsageError when none is)."""
    path = Path(config)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"--config {path}: cannot read it: {err}") from err
    try:
        entries = parse_config(text, path)
    except ConfigError as err:
        raise UsageError(str(err)) from err
    for entry in entries:
        if _same_place(entry.base_path, export_dir):
            return entry
    listed = ", ".join(f"{e.name} at {display(e.base_path)}" for e in entries)
    raise UsageError(
        f"--config {path}: no model there has its base_path at --export-dir {display(export_dir)} "
        f"(it lists: {listed})"
    )


def _same_place(a: Path | str, b: Path | str) -> bool:
    if is_url(a) or is_url(b):
        return location(str(a)) == location(str(b))
    return Path(a).resolve() == Path(b).resolve()


def serving_baseline(
    entry: ModelEntry | None, export_dir: Path | str, fetch_to: Path | None = None
) -> Baseline | None:
    """The version serving now (None when no version is on disk).

    Args:
        fetch_to: for a model on object storage, a local folder to download the serving
            version into (its `path` is then that copy; otherwise its URL).
    Raises:
        UsageError: a model on object storage that cannot be listed or downloaded.
    """
    if is_url(export_dir):
        return _remote_baseline(entry, export_dir, fetch_to)
    on_disk = dict(list_versions(export_dir))
    return _choose_baseline(entry, export_dir, on_disk)


def _remote_baseline(entry, url: str, fetch_to: Path | None) -> Baseline | None:
    model = RemoteModel(url)
    try:
        complete, _, _ = model.versions()
    except StorageError as err:
        raise UsageError(f"--export-dir: {err}") from None
    chosen = _choose_baseline(entry, url, {v: found.url for v, found in complete.items()})
    if chosen is None or fetch_to is None:
        return chosen
    target = Path(fetch_to) / str(chosen.version)
    if target.exists():
        shutil.rmtree(target)
    try:
        model.download(complete[chosen.version], target)
    except StorageError as err:
        raise UsageError(f"--export-dir: the serving version cannot be downloaded: {err}") from None
    return dataclasses.replace(chosen, path=target)


def _choose_baseline(entry, export_dir, on_disk: dict) -> Baseline | None:
    if not on_disk:
        return None
    if entry is not None:
        stable = entry.labels.get("stable")
        if stable is not None:
            if stable not in on_disk:
                raise UsageError(
                    f"--config: the stable label names version {stable}, which is not in "
                    f"{display(export_dir)} (on disk: {', '.join(map(str, on_disk))})"
                )
            return Baseline(stable, on_disk[stable], "the stable label")
        served = entry.aspired(on_disk)
        if served:
            version = max(served)
            return Baseline(
                version,
                on_disk[version],
                f"the newest version the policy ({entry.policy.describe()}) serves",
            )
    version = max(on_disk)
    return Baseline(version, on_disk[version], "the newest version on disk")


def pin_stable_before_a_canary(
    config: str | Path | None, entry: ModelEntry | None, label: str, baseline: Baseline | None
) -> None:
    """Without a stable label the newest version takes all the traffic: pin the one serving
    now before the candidate appears, so that it gets the canary's share only.

    Raises:
        UsageError: a canary without --config's entry.
    """
    if label != "canary" or baseline is None:
        return
    config, entry = _labeled(config, entry, label)
    if "stable" not in entry.labels:
        for line in promote(config, entry.name, label="stable", version=baseline.version):
            print(line)


def _labeled(
    config: str | Path | None, entry: ModelEntry | None, label: str
) -> tuple[str | Path, ModelEntry]:
    """--config and its entry, in which --publish moves a label (the command lines check
    first)."""
    if config is None or entry is None:
        raise UsageError(f"--publish {label} moves a label in the model config: give --config")
    return config, entry


def move_label(
    config: str | Path | None, entry: ModelEntry | None, label: str, version: int
) -> list[str]:
    """Point the label at the version (widening a `specific` policy first when it does not
    serve it); print and return what changed.

    Raises:
        UsageError: no --config's entry; the config cannot be edited (the message says how to
            finish by hand).
    """
    config, entry = _labeled(config, entry, label)
    changes = []
    try:
        current = {e.name: e for e in parse_config(Path(config).read_text(), config)}
        policy = current[entry.name].policy
        if policy.kind == "specific" and version not in policy.versions:
            wider = Policy("specific", versions=tuple(sorted({*policy.versions, version})))
            changes += promote(config, entry.name, policy=wider)
        changes += promote(config, entry.name, label=label, version=version)
    except (ConfigError, UsageError, OSError, KeyError) as err:
        raise UsageError(
            f"version {version} is published, but the label {label} could not be moved: "
            f"{err}; move it with `python -m training promote --config {config} --model "
            f"{entry.name} --label {label} --version {version}`"
        ) from err
    for line in changes or [f"{entry.name}: label {label} already names {version}"]:
        print(line)
    if changes:
        print(f"Wrote {config}; the label applies once version {version} is AVAILABLE.")
    return changes


def write_json(path: Path, document: dict) -> None:
    """Written beside itself, fsynced and renamed: a reader sees the old file or the new one."""
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(document, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def sweep_stale_staging(base: Path) -> None:
    """Remove the staging folders of exports killed over STALE_STAGING_SECONDS ago."""
    cutoff = time.time() - STALE_STAGING_SECONDS
    for path in base.glob(STAGING_PREFIX + "*"):
        if path.is_dir() and path.stat().st_mtime < cutoff:
            shutil.rmtree(path, ignore_errors=True)


def publish_next(
    staged: Path, base: Path, before_rename: Callable[[int, Path], None] | None = None
) -> Path:
    """Rename a complete staged version to the next free integer; atomic on one filesystem.

    Args:
        before_rename: called with the number about to be taken and the staged folder, before
            each try (to write a file that names the version into it).
    """
    while True:
        # Every version-named folder counts, loadable or not: a number is never reused.
        numbers = (parse_version(p.name) for p in base.iterdir())
        existing = [v for v in numbers if v is not None]
        target = base / str(max(existing, default=0) + 1)
        if before_rename is not None:
            before_rename(int(target.name), staged)
        try:
            staged.rename(target)
            return target
        except OSError:
            if not target.exists():
                raise
            # Another export took this number between our listing and the rename.


def publish_staged(
    staged: str | Path,
    export_base: str | Path,
    before_rename: Callable[[int, Path], None] | None = None,
) -> Path | str:
    """Move a complete version staged outside the repository in as the next version.

    Atomic either way: renamed in directly when `staged` is on the repository's filesystem,
    else copied into a hidden staging folder beside the versions and renamed from there. The
    files are fsynced before the rename, so a version never appears with empty files.

    Args:
        staged: the complete version folder (training.publish.staged_version's).
        export_base: the model's directory in the repository (created when missing).
        before_rename: as publish_next's.
        A URL (s3://, gs://) as export_base: uploaded as the next version there, its
        manifest last (artifact/storage.py), before_rename called before the upload.
    Returns:
        The published version directory (its URL on object storage).
    Raises:
        UsageError: the upload to object storage failed (no version was published: readers
            never take a version without its manifest).
    """
    if is_url(str(export_base)):
        return publish_remote(staged, str(export_base), before_rename)
    staged, base = Path(staged), Path(export_base)
    base.mkdir(parents=True, exist_ok=True)
    sweep_stale_staging(base)
    fsync_tree(staged)
    if os.stat(staged).st_dev == os.stat(base).st_dev:
        return publish_next(staged, base, before_rename)
    copy = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=base))
    try:
        target = copy / staged.name
        shutil.copytree(staged, target)
        fsync_tree(target)
        return publish_next(target, base, before_rename)
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def publish_remote(
    staged: str | Path, url: str, before_upload: Callable[[int, Path], None] | None = None
) -> str:
    """Upload a complete staged version as the next version of the model at `url`.

    Raises:
        UsageError: the upload failed (one line, without secrets).
    """
    try:
        remote = location(url)
        if not isinstance(remote, str):
            raise UsageError(f"--export-dir {url}: not a URL on object storage")
        return RemoteModel(remote).publish(Path(staged), before_upload)
    except StorageError as err:
        raise UsageError(f"--export-dir: nothing published: {err}") from None


def published_number(published: Path | str) -> int:
    """The version number of a published version's folder or URL."""
    return int(basename(published))


def published_report(published: Path | str) -> dict | None:
    """A published version's evaluation report (read back from object storage for a URL)."""
    if not is_url(published):
        return read_report(published)
    parent, number = str(published).rsplit("/", 1)
    try:
        text = RemoteModel(parent).read_text(f"{number}/{ASSETS_EXTRA}/{REPORT_FILE}")
    except StorageError:
        return None
    return json.loads(text) if text else None


def fsync_tree(root: Path) -> None:
    """fsync every file and folder under root (root too)."""
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
