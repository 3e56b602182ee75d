"""The commands' typed configs: what each command of `python -m training` was asked, as a
frozen dataclass with one field per option (named as argparse names them), built at the
command line's edge by `from_args` (training/commands/) before anything else runs. The code
below the commands reads these fields and never argparse's Namespace.

`retrain`'s config is RetrainConfig (training/retrain/arguments.py), `promote`'s PromoteConfig
(training/commands/promote.py). What `train`, `compare` and `retrain` share is said by the
protocols below, so that the code each of them runs (training/kinds/) takes any of their
configs: DataOptions (the data and its kind's options), ModelOptions (the model's shape and
its schedule) and RunOptions (a run's checkpoints and evaluations, on top).

No TensorFlow here: the fast tier's tests build these configs.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Protocol, TypeVar

# --deterministic without --seed trains with this seed (training/determinism.py).
DEFAULT_SEED = 0

_Config = TypeVar("_Config")


def _given(cls: type[_Config], args: argparse.Namespace, **replaced: Any) -> _Config:
    """A config of every field's option as parsed, some replaced."""
    # A TypeVar cannot say "a dataclass type": mypy cannot see that every config is one.
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    given = {field.name: getattr(args, field.name) for field in fields}
    return cls(**{**given, **replaced})


def run_seed(seed: int | None, deterministic: bool) -> int | None:
    """The run's seed: --seed, or DEFAULT_SEED with --deterministic (random otherwise)."""
    return DEFAULT_SEED if seed is None and deterministic else seed


class DataOptions(Protocol):
    """The data a run trains on: --data-dir's IDX files, or a CSV file or an image folder with
    their options (train, compare, retrain). Read-only, as the configs are frozen."""

    @property
    def data_dir(self) -> str: ...
    @property
    def labels(self) -> str: ...
    @property
    def csv(self) -> str | None: ...
    @property
    def image_folder(self) -> str | None: ...
    @property
    def label(self) -> str | None: ...
    @property
    def task(self) -> str | None: ...
    @property
    def max_vocabulary(self) -> int | None: ...
    @property
    def receiver(self) -> str | None: ...
    @property
    def image_size(self) -> int | None: ...
    @property
    def channels(self) -> int | None: ...


class ModelOptions(Protocol):
    """The budget, the model's layers and its schedule (train, compare, retrain)."""

    @property
    def epochs(self) -> float | None: ...
    @property
    def max_steps(self) -> int | None: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def learning_rate(self) -> float: ...
    @property
    def constant_learning_rate(self) -> bool: ...
    @property
    def data_format(self) -> str: ...
    @property
    def hidden_units(self) -> list[int]: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def deterministic(self) -> bool: ...


class RunOptions(ModelOptions, Protocol):
    """A run's checkpoints and evaluations, on top of its model (train, retrain)."""

    @property
    def checkpoint_steps(self) -> int: ...
    @property
    def eval_every_secs(self) -> int: ...


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """`python -m training train`'s options (training/commands/train.py). --model, --model-dir
    and --export-dir are None when left out: their defaults follow the kind of data."""

    # The data (IDX files, or a CSV file or an image folder and their options).
    data_dir: str
    labels: str
    csv: str | None
    image_folder: str | None
    label: str | None
    task: str | None
    max_vocabulary: int | None
    receiver: str | None
    image_size: int | None
    channels: int | None
    # The model, where it lives, its budget and schedule.
    model: str | None
    model_dir: str | None
    export_dir: str | None
    epochs: float | None
    max_steps: int | None
    batch_size: int
    learning_rate: float
    constant_learning_rate: bool
    data_format: str
    hidden_units: list[int]
    seed: int | None
    deterministic: bool
    eval_every_secs: int
    checkpoint_steps: int
    no_export: bool
    hooks: list[str]
    check_numerics: bool
    # The IDX kinds' own: warm starts, fine-tuning, a cluster's workers, GPUs.
    warm_start_from: str | None
    fine_tune_from: str | None
    warm_start_vars: str
    fine_tune_scopes: list[str] | None
    max_worker_delay_secs: int | None
    num_gpus: int | None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TrainConfig:
        """The parsed command line, the seed defaulted for --deterministic."""
        return _given(cls, args, seed=run_seed(args.seed, args.deterministic))


@dataclasses.dataclass(frozen=True)
class CompareConfig:
    """`python -m training compare`'s options (training/commands/compare.py): every kind
    (--models) on the same data and budget, in --work-dir."""

    data_dir: str
    labels: str
    csv: str | None
    image_folder: str | None
    label: str | None
    task: str | None
    max_vocabulary: int | None
    receiver: str | None
    image_size: int | None
    channels: int | None
    models: list[str] | None
    work_dir: str
    epochs: float | None
    max_steps: int | None
    batch_size: int
    learning_rate: float
    constant_learning_rate: bool
    data_format: str
    hidden_units: list[int]
    seed: int | None
    deterministic: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CompareConfig:
        return _given(cls, args, seed=run_seed(args.seed, args.deterministic))


@dataclasses.dataclass(frozen=True)
class EvaluateConfig:
    """`python -m training evaluate`'s options (training/commands/evaluate.py)."""

    path: str  # a model dir, an exported version or a model folder
    data_dir: str
    labels: str
    output: str
    csv: str | None
    image_folder: str | None
    label: str | None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EvaluateConfig:
        return _given(cls, args)


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """`python -m training export`'s options (training/commands/export.py)."""

    data_dir: str
    labels: str
    model_dir: str
    export_dir: str

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ExportConfig:
        return _given(cls, args)


@dataclasses.dataclass(frozen=True)
class PredictConfig:
    """`python -m training predict`'s options (training/commands/predict.py)."""

    model: str  # an exported version or a model folder
    input: str
    output: str
    batch_size: int
    invert: str

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PredictConfig:
        return _given(cls, args)


@dataclasses.dataclass(frozen=True)
class PublishConfig:
    """`python -m training publish`'s options (training/commands/publish.py)."""

    staged: str  # the staging area a retrain wrote
    export_dir: str
    config: str | None  # TF Serving's model config file
    publish: str  # version, canary or stable

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PublishConfig:
        return _given(cls, args)


@dataclasses.dataclass(frozen=True)
class SampleDataConfig:
    """`python -m training sample-data`'s options (training/commands/sample_data.py)."""

    out: str
    rows: int
    images_per_class: int
    seed: int

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SampleDataConfig:
        return _given(cls, args)


@dataclasses.dataclass(frozen=True)
class ExpireFeedbackConfig:
    """`python -m training expire-feedback`'s options
    (training/commands/expire_feedback.py)."""

    feedback_dir: str
    model: str
    max_age_days: float

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ExpireFeedbackConfig:
        return _given(cls, args)
