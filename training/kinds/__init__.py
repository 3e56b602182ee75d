"""The kinds of training data, registered in one place: IDX images (`--data-dir`, the
default), a CSV file (`--csv`) and an image folder (`--image-folder`). Each is one module
implementing training/kinds/base.py's DataKind (its options, its `train` and `compare`, the
data a retrain reads of it); the commands (training/commands/) dispatch through KINDS. A new
kind of data is one new module and one line here."""

from __future__ import annotations

from collections.abc import Callable

from training.configs import DataOptions
from training.kinds.base import DataKind
from training.kinds.csv import CSV
from training.kinds.idx import IDX
from training.kinds.image_folder import IMAGE_FOLDER
from training.kinds.model_data import ModelData

KINDS: dict[str, DataKind] = {kind.name: kind for kind in (IDX, CSV, IMAGE_FOLDER)}
# The kind a command runs on when no other kind's option is given.
DEFAULT = IDX


def others(kind: DataKind) -> list[DataKind]:
    """Every registered kind but `kind`, in the registry's order."""
    return [other for other in KINDS.values() if other is not kind]


def chosen(options: object) -> DataKind:
    """The kind whose option a command's config gives (--csv, --image-folder); IDX otherwise."""
    for kind in KINDS.values():
        if kind is not DEFAULT and kind.given(options):
            return kind
    return DEFAULT


def location_keys() -> frozenset[str]:
    """The keys of a run's recorded data that say where its files are (not what they hold)."""
    return frozenset(key for kind in KINDS.values() for key in kind.location_keys)


def retrain_data(
    options: DataOptions, report: dict, labels_of_idx: Callable[[], tuple[str, ...]]
) -> ModelData:
    """The data of the model being retrained: the serving version's kind (its evaluation
    report's params), or the one --csv / --image-folder / --data-dir names for a first model.

    Raises:
        UsageError: options of another kind than the serving version's, a base file that is
            gone (give it again), or options that contradict the serving version's.
        DataError: the base data is not usable.
    """
    params = report.get("params") or {}
    data = params.get("data")
    recorded = data if isinstance(data, dict) else {}
    kind_of_data: DataKind = DEFAULT
    for kind in KINDS.values():
        if kind is not DEFAULT and (
            kind.recorded_in(recorded) or (kind.given(options) and not report)
        ):
            kind_of_data = kind
            break
    return kind_of_data.retrain_data(
        options, recorded, params, bool(report), labels_of_idx, others(kind_of_data)
    )
