"""The model repository's versions as the trainers write them, without TensorFlow.

- Which version serves now (`serving_baseline`): the model config's `stable` label, else the
  newest version its policy serves, else the newest on disk. The gated retrain judges its
  candidate against it; the publish step (training/staging.py) checks that it still is.
- A complete version moved in as the next number (`publish_next`, `publish_staged`): one
  rename, retried when another writer takes the number first; a folder staged on another
  filesystem is copied beside the versions first. TF Serving and the service, which poll the
  folder, never see half a version.
- A label moved onto a published version (`move_label`), within training.promote's rules.
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

from artifact.model_config import ConfigError, ModelEntry, Policy, parse_config
from artifact.repository import list_versions, parse_version
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
    path: Path
    chosen_by: str


def config_entry(config: str | Path, export_dir: Path) -> ModelEntry:
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
    target = export_dir.resolve()
    for entry in entries:
        if entry.base_path.resolve() == target:
            return entry
    listed = ", ".join(f"{e.name} at {e.base_path}" for e in entries)
    raise UsageError(
        f"--config {path}: no model there has its base_path at --export-dir {export_dir} "
        f"(it lists: {listed})"
    )


def serving_baseline(entry: ModelEntry | None, export_dir: Path) -> Baseline | None:
    """The version serving now (None when no version is on disk)."""
    on_disk = dict(list_versions(export_dir))
    if not on_disk:
        return None
    if entry is not None:
        stable = entry.labels.get("stable")
        if stable is not None:
            if stable not in on_disk:
                raise UsageError(
                    f"--config: the stable label names version {stable}, which is not in "
                    f"{export_dir} (on disk: {', '.join(map(str, on_disk))})"
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
    config: str | Path, entry: ModelEntry, label: str, baseline: Baseline | None
) -> None:
    """Without a stable label the newest version takes all the traffic: pin the one serving
    now before the candidate appears, so that it gets the canary's share only."""
    if label == "canary" and baseline is not None and "stable" not in entry.labels:
        for line in promote(config, entry.name, label="stable", version=baseline.version):
            print(line)


def move_label(config: str | Path, entry: ModelEntry, label: str, version: int) -> list[str]:
    """Point the label at the version (widening a `specific` policy first when it does not
    serve it); print and return what changed.

    Raises:
        UsageError: the config cannot be edited; the message says how to finish by hand.
    """
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
) -> Path:
    """Move a complete version staged outside the repository in as the next version.

    Atomic either way: renamed in directly when `staged` is on the repository's filesystem,
    else copied into a hidden staging folder beside the versions and renamed from there. The
    files are fsynced before the rename, so a version never appears with empty files.

    Args:
        staged: the complete version folder (training.publish.staged_version's).
        export_base: the model's directory in the repository (created when missing).
        before_rename: as publish_next's.
    Returns:
        The published version directory.
    """
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
