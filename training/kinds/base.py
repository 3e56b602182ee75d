"""The interface every kind of training data implements (training/kinds/__init__.py registers
them): its options, how `train` and `compare` run on it, `evaluate` of its exported versions,
and the data a retrain reads of it (training/kinds/model_data.py's ModelData)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from pathlib import Path

from training.configs import CompareConfig, DataOptions, EvaluateConfig, TrainConfig
from training.errors import UsageError
from training.kinds.model_data import ModelData


class DataKind(abc.ABC):
    """One kind of training data: IDX images, a CSV file, an image folder.

    Attributes:
        name: "idx", "csv" or "image_folder": the key of the registry, of a retrain's
            ModelData (`kind`) and of the data a run's params record.
        option: the command-line option that names the data (--data-dir, --csv, ...).
        attribute: the config's field of that option (argparse's attribute).
        model_kinds: the model kinds (--model) that train on this data.
        default_model: the model kind trained when --model is left out.
        only_options: the options of this kind alone (option -> the config's field).
        noun: what the data is, in words ("CSV file").
        location_keys: the keys of a run's recorded data that say where the files are (a
            retrain's run id leaves them out: their content is hashed instead).
    """

    name: str
    option: str
    attribute: str
    model_kinds: tuple[str, ...]
    default_model: str
    only_options: dict[str, str] = {}
    noun: str
    location_keys: tuple[str, ...] = ()

    def source(self, options: object) -> str | None:
        """This kind's option in a command's config (any config that has it): the data it
        names, or None."""
        return getattr(options, self.attribute, None)

    def given(self, options: object) -> bool:
        """Whether the command line chose this kind (its option given)."""
        return bool(self.source(options))

    def refuse_options(self, options: object, chosen: str) -> None:
        """UsageError naming the first of this kind's own options given (in a command's
        config), when the data is another kind's (`chosen`: its option)."""
        for option, attribute in self.only_options.items():
            if getattr(options, attribute) is not None:
                raise UsageError(f"{option} is for {self.option}")

    @abc.abstractmethod
    def default_folders(self, source: str | None) -> tuple[str, str]:
        """The model dir and export dir used when --model-dir and --export-dir are left out
        (`source`: this kind's option, the data)."""

    @abc.abstractmethod
    def train(self, config: TrainConfig, others: Sequence[DataKind]) -> int:
        """`python -m training train` on this kind of data; `others` are the other kinds,
        whose options are refused."""

    @abc.abstractmethod
    def compare(self, config: CompareConfig, others: Sequence[DataKind]) -> int:
        """`python -m training compare` on this kind of data."""

    @abc.abstractmethod
    def retrain_data(
        self,
        options: DataOptions,
        recorded: dict,
        params: dict,
        has_baseline: bool,
        labels_of_idx: Callable[[], tuple[str, ...]],
        others: Sequence[DataKind],
    ) -> ModelData:
        """The data a retrain reads, trains and judges for a model of this kind.

        Args:
            options: the retrain's data options (its RetrainConfig).
            recorded: the serving version's params' `data` ({} for a first model).
            params: the serving version's params ({} for a first model).
            has_baseline: whether a version serves (its report was read).
            labels_of_idx: the IDX contract's labels (asked only by that kind).

        Raises:
            UsageError: options of another kind, a base file that is gone, or options that
                contradict the serving version's.
            DataError: the base data is not usable.
        """

    def takes(self, version) -> bool:
        """Whether an exported version (training/exported_model.py's description) is a model of
        this kind's data."""
        return False

    def evaluate_export(self, config: EvaluateConfig, version) -> dict:
        """`evaluate`'s report of an exported version of this kind, on the data the command
        line gives (UsageError when it gives none of this kind)."""
        raise UsageError(f"{version.path}: evaluate it on {self.option}")

    def recorded_in(self, recorded: dict) -> bool:
        """Whether a version's recorded data (its params' `data`) is of this kind."""
        return self.attribute in recorded


def given_path(given: str | None, option: str) -> str:
    """The data a kind's option names, in a config that chose the kind (so gave it)."""
    if not given:
        raise UsageError(f"{option}: give the data to train on")
    return given


def base_path(given: str | None, recorded: str | None, option: str, exists) -> str:
    """The base data of a retrain: the one given again, or the one the serving version
    recorded when it is still there.

    Raises:
        UsageError: neither is there.
    """
    path = given or recorded
    if path is None or not exists(Path(path)):
        where = f" on {recorded}, which is not there" if recorded else ""
        raise UsageError(
            f"{option}: the serving version was trained{where}; give its base data again "
            f"with {option}"
        )
    return path
