"""A model dir's bookkeeping: params.json, the latest step, what was exported from it."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf

from artifact.repository import list_versions, read_report
from artifact.storage import is_url
from training.errors import UsageError

PARAMS_FILE = "params.json"
# Options that change the model's variables: resuming with another value cannot work.
_ARCHITECTURE_OPTIONS = {
    "model": "--model",
    "data_format": "--data-format",
    "hidden_units": "--hidden-units",
}
EVAL_BATCH_SIZE = 500


def load_params(model_dir: Path) -> dict:
    """The run's params.json; UsageError when the dir is not a model dir of this tool."""
    path = Path(model_dir) / PARAMS_FILE
    if not path.is_file():
        raise UsageError(f"{model_dir}: not a model dir of this tool (no {PARAMS_FILE})")
    params = json.loads(path.read_text())
    params.setdefault("model", "cnn")  # written before there were other kinds
    return params


def write_params(model_dir: Path, params: dict) -> None:
    """Write params.json atomically: other tasks of a distributed run may be reading it."""
    model_dir = Path(model_dir)
    fd, temp = tempfile.mkstemp(prefix=f".{PARAMS_FILE}.", dir=model_dir)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(params, indent=2) + "\n")
        os.replace(temp, model_dir / PARAMS_FILE)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def previous_params(model_dir: Path) -> dict | None:
    """The params.json of an earlier run in model_dir, or None."""
    path = Path(model_dir) / PARAMS_FILE
    return load_params(model_dir) if path.is_file() else None


def check_resumable(model_dir: Path, params: dict) -> None:
    """Refuse to resume a run whose architecture differs: the weights would not fit or mean
    something else."""
    previous = previous_params(model_dir)
    if previous is None:
        return
    for key, option in _ARCHITECTURE_OPTIONS.items():
        if key == "hidden_units" and params.get("model") != "dnn":
            continue
        before, now = previous.get(key), params.get(key)
        if before is not None and before != now:
            show = ",".join(map(str, before)) if isinstance(before, list) else before
            wanted = ",".join(map(str, now)) if isinstance(now, list) else now
            raise UsageError(
                f"{model_dir}: was trained with {option} {show}, not {wanted}; "
                "use a new --model-dir"
            )


def latest_step(model_dir: Path) -> int:
    """The global step of the model dir's latest checkpoint; 0 when it has none."""
    checkpoint = tf.train.latest_checkpoint(str(model_dir))
    if checkpoint is None:
        return 0
    return int(tf.train.load_variable(checkpoint, "global_step"))


def newest_finite_checkpoint(model_dir: Path) -> tuple[str, int] | None:
    """(prefix, step) of the newest checkpoint whose float variables are all finite."""
    state = tf.train.get_checkpoint_state(str(model_dir))
    for prefix in reversed(state.all_model_checkpoint_paths if state else []):
        reader = tf.train.load_checkpoint(prefix)
        values = (reader.get_tensor(name) for name in reader.get_variable_to_shape_map())
        if all(np.isfinite(v).all() for v in values if np.asarray(v).dtype.kind == "f"):
            return prefix, int(reader.get_tensor("global_step"))
    return None


def local_version(version: Path | str | None) -> Path:
    """A version exported into a local folder (a comparison exports into its work dir).

    Raises:
        UsageError: nothing was exported, or it went to object storage.
    """
    if version is None or is_url(str(version)):
        raise UsageError(
            f"a comparison reads its models' versions from its work dir, got {version}"
        )
    return Path(version)


def exported_report(version: Path) -> dict:
    """A local version's evaluation report.

    Raises:
        UsageError: the version has none.
    """
    report = read_report(version)
    if report is None:
        raise UsageError(f"{version}: exported without its evaluation report")
    return report


def exported_version_of(export_dir: Path | str, model_dir: Path, step: int) -> Path | None:
    """The newest version exported from this model dir at this step, if any (a model on
    object storage is not searched: the retrain's blessing check covers a rerun there)."""
    if is_url(str(export_dir)):
        return None
    for _, path in reversed(list_versions(export_dir)):
        report = read_report(path) or {}
        if report.get("model_dir") == str(model_dir) and report.get("global_step") == step:
            return path
    return None


def report_context(
    data_dir, model_dir: Path, params: dict, train_seconds: float | None = None
) -> dict:
    """What an export's evaluation report records besides its metrics: the data, the run,
    its step, the checkpoint exported (an absolute path: the retrain warm-starts from it) and
    params (the labels are in labels.txt), and how long training took."""
    checkpoint = tf.train.latest_checkpoint(str(model_dir))
    context = {
        "data_dir": str(data_dir),
        "split": "test",
        "global_step": latest_step(model_dir),
        "model_dir": str(model_dir),
        "checkpoint": os.path.abspath(checkpoint) if checkpoint else None,
        "params": {k: v for k, v in params.items() if k != "labels"},
    }
    if train_seconds is not None:
        context["train_seconds"] = round(train_seconds, 1)
    return context


def directory_bytes(path: Path) -> int:
    """Total size of the files under path."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
