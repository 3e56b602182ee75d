"""The retrain's staging area and the publish step, `python -m training publish`.

A retrain with `--stage-to DIR` trains and judges its candidate as always, but never writes
the model repository (it may read it read-only): it leaves what it decided in DIR, a folder of
its own, which it empties when it starts:

    DIR/staged.json   written last, atomically: the outcome, the model, the repository and the
                      serving version the candidate was judged against, when; for a staged
                      candidate the size and sha256 of every file under version/
    DIR/version/      the blessed candidate, a complete version: the SavedModel and
                      assets.extra/ (labels, evaluation report, warmup requests, plots,
                      blessing.json)

Outcomes: `staged` (blessed: version/ holds it), `not blessed`, `unchanged` (the serving
version was trained on the same inputs) and `published` (the run was published already, as
`published_version`: only its label may still have to move).

`python -m training publish --staged DIR --export-dir ...` is the small step with write access
to the repository. It runs no model code (no SavedModel is loaded): it checks what was staged
(every file the retrain recorded and no other, unchanged, no links or special files; a
blessing that says blessed, for this model and repository, against the version that still
serves), copies it beside the versions hashing the bytes it copies, and renames the copy in as
the next version (training/versions.py, as every export); then it moves --publish's label. A
refused publish changes nothing and says why in one line. On object storage (--export-dir
s3://... or gs://...) the copy is made in a private temporary folder and uploaded from there
as the next version, its manifest last (artifact/storage.py), as `export` uploads; the bucket
has no lock, as for a retrain that publishes there itself.

What the digests protect: that what is published is what the retrain staged and judged; a
staging area changed, half-copied or half-written since is refused. They cannot vouch for a
retrain that was itself subverted (a SavedModel is a program, and the retrain runs the serving
version's): what the split bounds is what such a retrain can do to the repository, one new
version under the label the publish step's own command line names, at most.

No TensorFlow here (the fast tier tests it).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from artifact.contract import ASSETS_EXTRA, BLESSING_FILE
from artifact.model_config import ModelEntry
from artifact.repository import SAVED_MODEL_FILE, list_versions, read_blessing
from artifact.storage import (
    RemoteModel,
    StorageError,
    basename,
    display,
    is_url,
    join,
    location,
)
from training import lock
from training.configs import PublishConfig
from training.errors import UsageError
from training.versions import (
    STAGING_PREFIX,
    Baseline,
    config_entry,
    fsync_tree,
    move_label,
    pin_stable_before_a_canary,
    publish_next,
    published_number,
    serving_baseline,
    sweep_stale_staging,
    write_json,
)

MANIFEST_FILE = "staged.json"
VERSION_DIR = "version"
FORMAT_VERSION = 1
STAGED, NOT_BLESSED, UNCHANGED, PUBLISHED = "staged", "not blessed", "unchanged", "published"
OUTCOMES = (STAGED, NOT_BLESSED, UNCHANGED, PUBLISHED)
# A staged version must hold these; the rest is whatever the retrain recorded.
REQUIRED_FILES = (
    SAVED_MODEL_FILE,
    "variables/variables.index",
    f"{ASSETS_EXTRA}/{BLESSING_FILE}",
)
EXIT_NOT_BLESSED = 3
EXIT_LOCKED = 75  # sysexits' EX_TEMPFAIL: try again later
_CHUNK_BYTES = 1 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")


class StagingRefused(UsageError):
    """The staging area holds nothing that may be published; the message says why."""


class StorageUnavailable(Exception):
    """Object storage did not answer while publishing: nothing was published, and trying again
    later may work (exit 75, not 2: the CronJob retries it, as a refusal it does not)."""


# --- the retrain's side -----------------------------------------------------------------------


def make_area(stage_dir: str | Path, repository: Path | None) -> Path:
    """The staging folder, made when missing (`repository` None: on object storage).

    Raises:
        UsageError: it cannot be made, or it is inside the model repository (a staged retrain
            writes nothing there).
    """
    stage_dir = Path(stage_dir)
    if repository is not None and stage_dir.absolute().resolve().is_relative_to(
        repository.absolute().resolve()
    ):
        raise UsageError(
            f"--stage-to {stage_dir}: inside the model repository {repository}: stage "
            "outside it (a staged retrain writes nothing in the repository)"
        )
    try:
        stage_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--stage-to {stage_dir}: cannot write there: {err.strerror}") from err
    return stage_dir


def clear(stage_dir: Path) -> None:
    """Remove what an earlier retrain staged: staged.json first, so that from then on the
    folder holds nothing a publish would take, even if this is interrupted."""
    (stage_dir / MANIFEST_FILE).unlink(missing_ok=True)
    if (stage_dir / VERSION_DIR).exists():
        shutil.rmtree(stage_dir / VERSION_DIR)


def stage_candidate(
    stage_dir: Path, version: Path, blessing: dict, fields: dict, reason: str
) -> Path:
    """Leave a blessed candidate in the staging area, then staged.json with its digests.

    Args:
        version: a complete version folder (training.publish.staged_version's), moved when on
            the staging area's filesystem, copied otherwise.
        blessing: blessing.json, written into the staged version's assets.extra/.
        fields: staged.json's model, export_dir, config and baseline_version.
        reason: one line for people.
    Returns:
        The staged version folder, DIR/version.
    """
    target = stage_dir / VERSION_DIR
    if os.stat(version).st_dev == os.stat(stage_dir).st_dev:
        version.rename(target)
    else:
        shutil.copytree(version, target)
    write_json(target / ASSETS_EXTRA / BLESSING_FILE, blessing)
    files = _hashed(stage_dir)
    fsync_tree(target)
    record(stage_dir, STAGED, fields, reason, files=files)
    return target


def record(stage_dir: Path, outcome: str, fields: dict, reason: str, **more) -> None:
    """Write staged.json (atomically): the outcome, fields (model, export_dir, config,
    baseline_version), a line for people and more (files, published_version)."""
    manifest = {
        "format": FORMAT_VERSION,
        "outcome": outcome,
        **fields,
        "staged_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "reason": reason,
        **more,
    }
    write_json(stage_dir / MANIFEST_FILE, manifest)


# --- the publish step -------------------------------------------------------------------------


def publish(request: PublishConfig) -> int:
    """Check the staging area and publish what it holds; 0 published (or nothing to publish),
    2 refused, 3 not blessed, 75 another publisher holds the repository or the staging area,
    or object storage did not answer (try again later)."""
    if request.publish != "version" and not request.config:
        raise UsageError(
            f"--publish {request.publish} moves a label in the model config: give --config"
        )
    stage_dir = Path(request.staged)
    export_dir = location(request.export_dir)
    manifest, manifest_sha256 = read_manifest(stage_dir)
    entry = config_entry(request.config, export_dir) if request.config else None
    model = entry.name if entry is not None else basename(export_dir)
    _check_target(stage_dir, manifest, model, export_dir)
    # The repository root, not the model's folder: a first publish makes that one. Retrains
    # that publish themselves take the same lock. A bucket has no folder to lock: the staging
    # area's lock keeps one publish of it at a time (and none while a retrain stages into it);
    # publishers of different stagings are told apart by the manifests' digests
    # (artifact/storage.py).
    locked = export_dir.absolute().parent if isinstance(export_dir, Path) else stage_dir
    with ExitStack() as held:
        try:
            held.enter_context(lock.hold_directory(locked))
        except lock.LockHeld as err:
            print(f"error: {err}", file=sys.stderr)
            return EXIT_LOCKED
        except OSError as err:
            where = (
                f"--export-dir {export_dir}"
                if isinstance(export_dir, Path)
                else f"--staged {locked}"
            )
            raise UsageError(f"{where}: cannot open its folder: {err.strerror}") from err
        try:
            return _publish(request, stage_dir, manifest, manifest_sha256, entry, export_dir)
        except StorageUnavailable as err:
            print(f"error: {err}; try again later", file=sys.stderr)
            return EXIT_LOCKED


def read_manifest(stage_dir: Path) -> tuple[dict, str]:
    """staged.json, checked field by field, and its sha256.

    Raises:
        StagingRefused: no staging area, a half-written one, or a malformed staged.json.
    """
    if not stage_dir.is_dir():
        raise StagingRefused(f"--staged {stage_dir}: no such folder")
    path = stage_dir / MANIFEST_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise StagingRefused(
            f"--staged {stage_dir}: no {MANIFEST_FILE}: nothing was staged there, or the "
            "retrain that was staging stopped before it finished; nothing published"
        ) from None
    try:
        manifest = json.loads(raw)
    except ValueError as err:
        raise StagingRefused(f"--staged {path}: not JSON: {err}") from err
    problem = _manifest_problem(manifest)
    if problem:
        raise StagingRefused(f"--staged {path}: {problem}; nothing published")
    return manifest, hashlib.sha256(raw).hexdigest()


def _manifest_problem(manifest) -> str | None:
    if not isinstance(manifest, dict):
        return f"expected a JSON object, got {type(manifest).__name__}"
    if manifest.get("format") != FORMAT_VERSION:
        return f"format {manifest.get('format')!r}: this publish reads format {FORMAT_VERSION}"
    if manifest.get("outcome") not in OUTCOMES:
        return f"outcome {manifest.get('outcome')!r}: expected one of {', '.join(OUTCOMES)}"
    for key in ("model", "export_dir", "reason"):
        if not isinstance(manifest.get(key), str):
            return f"{key}: expected a string, got {manifest.get(key)!r}"
    if not _is_version(manifest.get("baseline_version"), none_ok=True):
        return f"baseline_version: expected a version or null, got {manifest['baseline_version']!r}"
    if manifest["outcome"] == PUBLISHED and not _is_version(manifest.get("published_version")):
        return f"published_version: expected a version, got {manifest.get('published_version')!r}"
    if manifest["outcome"] == STAGED:
        files = manifest.get("files")
        if not isinstance(files, dict) or not files:
            return "files: expected the staged files' digests"
        for rel, digest in files.items():
            if not (
                isinstance(digest, dict)
                and isinstance(digest.get("bytes"), int)
                and digest["bytes"] >= 0
                and isinstance(digest.get("sha256"), str)
                and _SHA256.fullmatch(digest["sha256"])
            ):
                return f"files: {rel}: expected bytes and a sha256, got {digest!r}"
        missing = [rel for rel in REQUIRED_FILES if rel not in files]
        if missing:
            return f"files: no {VERSION_DIR}/{missing[0]}: not a complete version"
    return None


def _is_version(value, none_ok: bool = False) -> bool:
    if value is None:
        return none_ok
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_target(stage_dir: Path, manifest: dict, model: str, export_dir: Path | str) -> None:
    """The staging was made for this model in this repository."""
    if manifest["model"] != model:
        raise StagingRefused(
            f"--staged {stage_dir}: staged for the model {manifest['model']}, not {model}; "
            "nothing published"
        )
    if not _same_path(manifest["export_dir"], export_dir):
        raise StagingRefused(
            f"--staged {stage_dir}: the candidate was judged against the versions in "
            f"{display(manifest['export_dir'])}, not --export-dir {display(export_dir)}; "
            "nothing published"
        )


def _same_path(recorded: str, given: Path | str) -> bool:
    if is_url(recorded) or not isinstance(given, Path):
        return location(recorded) == given
    if os.path.abspath(recorded) == os.path.abspath(given):
        return True
    try:
        return os.path.samefile(recorded, given)
    except OSError:
        return False


def _publish(
    request: PublishConfig,
    stage_dir: Path,
    manifest: dict,
    manifest_sha256: str,
    entry,
    export_dir: Path | str,
) -> int:
    outcome = manifest["outcome"]
    if outcome == NOT_BLESSED:
        print(
            f"error: --staged {stage_dir}: the retrain did not bless its candidate "
            f"({manifest['reason']}); nothing published",
            file=sys.stderr,
        )
        return EXIT_NOT_BLESSED
    if outcome == UNCHANGED:
        print(f"Nothing to publish: {manifest['reason']}")
        return 0
    if outcome == PUBLISHED:
        version = manifest["published_version"]
        _check_gated(export_dir, version, stage_dir)
        print(
            f"{display(join(export_dir, str(version)))} is published already "
            f"({manifest['reason']})."
        )
        _label(request, entry, version)
        return 0
    version_dir = stage_dir / VERSION_DIR
    # First in place, reading only: a refusal leaves the repository as it was.
    _compare(stage_dir, _hashed(stage_dir), manifest["files"])
    blessing = _staged_blessing(stage_dir, version_dir, manifest)
    already = _published_from(export_dir, manifest_sha256)
    if already is not None:
        print(f"{display(already)} was published from this very staging already.")
        _label(request, entry, published_number(already))
        return 0
    baseline = serving_baseline(entry, export_dir)
    _check_baseline(stage_dir, blessing, baseline)
    if request.publish == "canary":
        pin_stable_before_a_canary(request.config, entry, request.publish, baseline)

    def name_version(version: int, folder: Path) -> None:
        document = {
            **blessing,
            "versions": {**blessing.get("versions", {}), "candidate": version},
            "publish": {
                **(blessing.get("publish") or {}),
                "mode": request.publish,
                "config": request.config,
                "version": version,
                "label_changes": None,
                "staged": {
                    "from": os.path.abspath(stage_dir),
                    "at": manifest.get("staged_at"),
                    "manifest_sha256": manifest_sha256,
                },
            },
        }
        write_json(folder / ASSETS_EXTRA / BLESSING_FILE, document)

    published: Path | str
    if isinstance(export_dir, Path):
        published = _copy_in(stage_dir, export_dir, manifest["files"], name_version)
    else:
        published = _upload(stage_dir, export_dir, manifest["files"], name_version)
    print(
        f"Published {display(published)} (staged {manifest.get('staged_at')}, {manifest['reason']})"
    )
    _label(request, entry, published_number(published))
    return 0


def _label(request: PublishConfig, entry: ModelEntry | None, version: int) -> None:
    if request.publish != "version":
        move_label(request.config, entry, request.publish, version)


def _check_gated(export_dir: Path | str, version: int, stage_dir: Path) -> None:
    """A version the retrain says it published must be there, published through the gate."""
    blessing = dict(_blessings(export_dir)).get(version)
    if not (
        blessing is not None
        and blessing.get("blessed") is True
        and (_field(blessing, "versions") or {}).get("candidate") == version
    ):
        raise StagingRefused(
            f"--staged {stage_dir}: says version {version} is published, but "
            f"{display(export_dir)} holds no such version blessed by a retrain; nothing published"
        )


def _blessings(export_dir: Path | str) -> list[tuple[int, dict | None]]:
    """(version, its blessing.json, or None when it has none that reads as a JSON object) of
    every complete version, oldest first (on object storage, by artifact/storage.py's rule)."""
    found: list[tuple[int, dict | None]] = []
    if isinstance(export_dir, Path):
        for version, path in list_versions(export_dir):
            try:
                found.append((version, _object(read_blessing(path))))
            except (OSError, ValueError):
                found.append((version, None))
        return found
    model = RemoteModel(export_dir)
    try:
        complete, _, _ = model.versions()
        for version in sorted(complete):
            try:
                text = model.read_text(f"{version}/{ASSETS_EXTRA}/{BLESSING_FILE}")
                found.append((version, _object(json.loads(text)) if text else None))
            except ValueError:  # not UTF-8, or not JSON
                found.append((version, None))
        return found
    except StorageError as err:
        if err.transient:
            raise StorageUnavailable(f"--export-dir: {err}; nothing published") from None
        raise UsageError(f"--export-dir: {err}; nothing published") from None


def _object(document) -> dict | None:
    return document if isinstance(document, dict) else None


def _field(document: dict | None, key: str) -> dict | None:
    """document[key] when both are JSON objects (a blessing another tool wrote may be anything)."""
    return _object(document.get(key)) if document is not None else None


def _staged_blessing(stage_dir: Path, version_dir: Path, manifest: dict) -> dict:
    """The staged blessing.json (its bytes checked already): blessed, for this model."""
    where = f"--staged {stage_dir}: {VERSION_DIR}/{ASSETS_EXTRA}/{BLESSING_FILE}"
    try:
        blessing = read_blessing(version_dir)
    except (OSError, ValueError) as err:
        raise StagingRefused(f"{where}: cannot read it: {err}") from err
    if not isinstance(blessing, dict):
        raise StagingRefused(f"{where}: expected a JSON object")
    if blessing.get("blessed") is not True:
        failed = "; ".join(map(str, blessing.get("failed") or [])) or "blessed is not true"
        raise StagingRefused(f"{where}: the candidate is not blessed ({failed}); nothing published")
    if blessing.get("model") != manifest["model"]:
        raise StagingRefused(
            f"{where}: judges the model {blessing.get('model')!r}, not {manifest['model']}; "
            "nothing published"
        )
    judged = (blessing.get("versions") or {}).get("baseline", "?")
    if judged != manifest["baseline_version"]:
        raise StagingRefused(
            f"{where}: judged against version {judged}, but {MANIFEST_FILE} says "
            f"{manifest['baseline_version']}; nothing published"
        )
    return blessing


def _check_baseline(stage_dir: Path, blessing: dict, baseline: Baseline | None) -> None:
    """The version the candidate beat still serves."""
    judged = blessing["versions"]["baseline"]
    now = baseline.version if baseline is not None else None
    if judged == now:
        return
    was = f"version {judged}" if judged is not None else "no version (none served then)"
    serves = (
        f"version {now} serves now ({baseline.chosen_by})"
        if baseline is not None
        else "no version serves now"
    )
    raise StagingRefused(
        f"--staged {stage_dir}: the candidate was judged against {was}, but {serves}: "
        "retrain against it; nothing published"
    )


def _published_from(export_dir: Path | str, manifest_sha256: str) -> Path | str | None:
    """The version an earlier publish of this very staging made, if any."""
    for version, blessing in reversed(_blessings(export_dir)):
        staged = _field(_field(blessing, "publish"), "staged")
        if staged is not None and staged.get("manifest_sha256") == manifest_sha256:
            return join(export_dir, str(version))
    return None


def _copy_in(
    stage_dir: Path,
    export_dir: Path,
    files: dict,
    before_rename: Callable[[int, Path], None],
) -> Path:
    """Copy the staged version beside the versions, hashing what is copied; checked, rename it
    in as the next version. What is renamed is what was hashed: only this process writes the
    copy."""
    export_dir.mkdir(parents=True, exist_ok=True)
    sweep_stale_staging(export_dir)
    copy = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=export_dir))
    try:
        target = copy / VERSION_DIR
        _compare(stage_dir, _hashed(stage_dir, copy_to=target), files)
        fsync_tree(target)
        return publish_next(target, export_dir, before_rename)
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def _upload(
    stage_dir: Path,
    url: str,
    files: dict,
    before_upload: Callable[[int, Path], None],
) -> str:
    """Copy the staged version into a private temporary folder, hashing what is copied;
    checked, upload that copy as the next version at `url` (its manifest last). What is
    uploaded is what was hashed: only this process writes the copy."""
    with tempfile.TemporaryDirectory(prefix=STAGING_PREFIX) as copy:
        target = Path(copy) / VERSION_DIR
        _compare(stage_dir, _hashed(stage_dir, copy_to=target), files)
        try:
            return RemoteModel(url).publish(target, before_upload)
        except StorageError as err:
            if err.transient:
                raise StorageUnavailable(f"--export-dir: nothing published: {err}") from None
            raise UsageError(f"--export-dir: nothing published: {err}") from None


def _compare(stage_dir: Path, found: dict[str, dict], staged: dict[str, dict]) -> None:
    """Refuse unless the files found are the files staged, byte for byte."""
    where = f"--staged {stage_dir}: {VERSION_DIR}/"
    missing = sorted(staged.keys() - found.keys())
    if missing:
        raise StagingRefused(
            f"{where}{missing[0]}: staged, but not there (half-written or removed since"
            f"{f'; {len(missing) - 1} more' if len(missing) > 1 else ''}); nothing published"
        )
    added = sorted(found.keys() - staged.keys())
    if added:
        raise StagingRefused(f"{where}{added[0]}: not staged (added since); nothing published")
    for rel in sorted(staged):
        want, got = staged[rel], found[rel]
        if got["bytes"] != want["bytes"]:
            raise StagingRefused(
                f"{where}{rel}: {got['bytes']:,} bytes, staged with {want['bytes']:,}: changed "
                "since it was staged; nothing published"
            )
        if got["sha256"] != want["sha256"]:
            raise StagingRefused(
                f"{where}{rel}: not the bytes that were staged (sha256 {got['sha256'][:12]}..., "
                f"staged {want['sha256'][:12]}...): changed since; nothing published"
            )


def _files(root: Path, where: str) -> list[tuple[str, Path]]:
    """(relative path, path) of every regular file under root, sorted; a link or anything
    but a file or folder is refused (a link could bring in a file from anywhere)."""
    found = []
    folders = [root]
    while folders:
        folder = folders.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                rel = Path(entry.path).relative_to(root).as_posix()
                if entry.is_symlink():
                    raise StagingRefused(f"{where}{rel}: a symbolic link; nothing published")
                if entry.is_dir(follow_symlinks=False):
                    folders.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    found.append((rel, Path(entry.path)))
                else:
                    raise StagingRefused(
                        f"{where}{rel}: not a regular file or folder; nothing published"
                    )
    return sorted(found)


def _hashed(stage_dir: Path, copy_to: Path | None = None) -> dict[str, dict]:
    """{relative path: {bytes, sha256}} of every file of the staged version (none when it is
    not there), each copied to the same place under copy_to as it is read, when given."""
    root, where = stage_dir / VERSION_DIR, f"--staged {stage_dir}: {VERSION_DIR}/"
    if not root.is_dir():
        return {}
    found = {}
    for rel, path in _files(root, where):
        try:
            # O_NOFOLLOW | O_NONBLOCK: a link swapped in, or a FIFO, neither followed nor
            # waited on.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as err:
            raise StagingRefused(
                f"{where}{rel}: cannot read it ({err.strerror}); nothing published"
            ) from err
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StagingRefused(f"{where}{rel}: not a regular file; nothing published")
            target = None
            if copy_to is not None:
                target = copy_to / rel
                target.parent.mkdir(parents=True, exist_ok=True)
            found[rel] = _digest(fd, target)
        finally:
            os.close(fd)
    return found


def _digest(fd: int, copy_to: Path | None) -> dict:
    """{bytes, sha256} of what is read from fd to its end, written to copy_to too if given."""
    out = os.open(copy_to, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644) if copy_to else None
    try:
        digest, size = hashlib.sha256(), 0
        while chunk := os.read(fd, _CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
            view = memoryview(chunk)
            while out is not None and view:
                view = view[os.write(out, view) :]
        return {"bytes": size, "sha256": digest.hexdigest()}
    finally:
        if out is not None:
            os.close(out)
