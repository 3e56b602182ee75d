"""The model repository in TensorFlow Serving's layout: what is on disk, read without TensorFlow.

    <base>/<model name>/<version>/saved_model.pb
    <base>/<model name>/<version>/variables/
    <base>/<model name>/<version>/assets.extra/   labels.txt, evaluation.json,
                                                  tf_serving_warmup_requests,
                                                  confusion_matrix.png (classifiers),
                                                  predicted_vs_true.png, residuals.png
                                                  (regressors), learning_curves.png,
                                                  blessing.json (when retraining wrote one)

A version is a folder named by a non-negative int64 written in ASCII digits (TF Serving's
rule) holding a saved_model.pb. Anything else in a model's folder is not a version: hidden
folders (an export being staged) silently, other names (`²`, `v2`, `latest`) with a warning
from whoever lists them.
"""

from __future__ import annotations

import json
from pathlib import Path

from artifact.contract import ASSETS_EXTRA, BLESSING_FILE, DIGIT_LABELS, LABELS_FILE, REPORT_FILE

INT64_MAX = 2**63 - 1
SAVED_MODEL_FILE = "saved_model.pb"


def parse_version(text: str) -> int | None:
    """The version a folder name or URL segment names, or None when it names none.

    ASCII digits only: str.isdigit() also accepts '²' (int() then raises) and '１' (int()
    reads 1). TF Serving's versions are int64.
    """
    if not text or not (text.isascii() and text.isdigit()) or len(text) > 19:
        return None
    value = int(text)
    return value if value <= INT64_MAX else None


def list_versions(model_dir: str | Path) -> list[tuple[int, Path]]:
    """(version, path) of every version folder holding a saved_model.pb, oldest first."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return []
    found: dict[int, Path] = {}
    for path in sorted(model_dir.iterdir()):
        version = parse_version(path.name)
        if version is None or not (path / SAVED_MODEL_FILE).is_file():
            continue
        # "7" and "007" name the same version (TF Serving reads leading zeros too): the
        # plain spelling wins, and the choice does not depend on the listing's order.
        if version not in found or path.name == str(version):
            found[version] = path
    return sorted(found.items())


def foreign_entries(model_dir: str | Path) -> list[str]:
    """Names in a model's folder that are neither versions nor hidden (staging) entries."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return []
    return sorted(
        p.name
        for p in model_dir.iterdir()
        if parse_version(p.name) is None and not p.name.startswith(".")
    )


def newest_version(model_dir: str | Path) -> tuple[int, Path] | None:
    """The newest version on disk, or None."""
    versions = list_versions(model_dir)
    return versions[-1] if versions else None


def resolve_version_path(path: str | Path) -> Path:
    """An exported version folder, or a model folder's newest version.

    Raises:
        FileNotFoundError: neither (the message says which).
    """
    path = Path(path)
    if (path / SAVED_MODEL_FILE).is_file():
        return path
    newest = newest_version(path)
    if newest is None:
        what = "not found" if not path.exists() else "holds no exported version"
        raise FileNotFoundError(f"{path}: {what}")
    return newest[1]


def read_labels(version_path: str | Path) -> tuple[str, ...] | None:
    """The class labels exported with a version, or None when it has none."""
    path = Path(version_path) / ASSETS_EXTRA / LABELS_FILE
    if not path.is_file():
        return None
    return tuple(line for line in path.read_text(encoding="utf-8").splitlines() if line)


def version_labels(version_path: str | Path) -> tuple[str, ...]:
    """The labels a version answers with: its own, or the digits 0-9 when it has none."""
    return read_labels(version_path) or DIGIT_LABELS


def read_report(version_path: str | Path) -> dict | None:
    """The evaluation report exported with a version, or None when it has none."""
    path = Path(version_path) / ASSETS_EXTRA / REPORT_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def read_blessing(version_path: str | Path) -> dict | None:
    """Retraining's blessing report (candidate against baseline) exported with a version, or
    None when it has none."""
    path = Path(version_path) / ASSETS_EXTRA / BLESSING_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def files_stamp(version_path: str | Path) -> float:
    """The newest modification time among a version's folders and files (0 when gone).

    A version that failed to load is tried again once this changes: a copy that was still
    running, or a fix.
    """
    root = Path(version_path)
    try:
        return max(p.stat().st_mtime for p in (root, *root.rglob("*")))
    except (FileNotFoundError, ValueError):
        return 0.0


def assets_stamp(version_path: str | Path) -> float:
    """The newest modification time in a version's assets.extra/ (0 when it has none)."""
    return files_stamp(Path(version_path) / ASSETS_EXTRA)
