"""MNIST-format IDX images (Fashion-MNIST's contract, `--data-dir`): the reference CNN and
its baselines (training/kinds/idx_training.py, idx_comparison.py), and what a retrain reads
of them."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import tensorflow as tf

from artifact.contract import (
    IMAGE_HEIGHT,
    IMAGE_WIDTH,
    INPUT_KEY,
    SIGNATURE_NAME,
)
from artifact.warmup import WARMUP_BATCH_SIZES
from training import (
    cli,
    data,
    determinism,
    finetune,
    publish,
    sources,
)
from training.configs import CompareConfig, DataOptions, ModelOptions, RunOptions, TrainConfig
from training.errors import DataError, UsageError
from training.estimator import MODEL_KINDS, make_estimator, trainable_variable_shapes
from training.kinds.base import DataKind
from training.kinds.idx_comparison import compare_idx
from training.kinds.idx_training import model_params, train_idx
from training.kinds.model_data import (
    IDX_IMAGE_BYTES,
    HeldOut,
    ModelData,
    Reader,
    _quantized,
    idx_dataset,
)


class IdxData(ModelData):
    """MNIST-format folders: `--data-dir`'s train and test splits, `--extra-data` folders."""

    kind = "idx"

    def __init__(self, data_dir: str, labels: tuple[str, ...]):
        self.base = str(data_dir)
        self.labels = tuple(labels)

    def _reader(self, name: str, folder: str, role: str, splits: list[str], detail=None):
        """Splits of an MNIST-format folder, validated whole once (headers, counts, labels in
        range), then streamed; the scan reads one split's files at a time."""
        found = [data.load_split(folder, split)[0] for split in splits]

        def scan(builder: sources.ScanBuilder) -> None:
            for split in found:
                images = data.read_images(split.images_path)
                labels = data.read_labels(split.labels_path)
                for image, label in zip(images, labels, strict=True):
                    builder.add(image.tobytes(), int(label))

        def dataset():
            return idx_dataset([s.images_path for s in found], [s.labels_path for s in found])

        count = sum(split.count for split in found)
        return Reader(name, str(folder), role, count, scan, dataset, detail or {})

    def base_readers(self) -> list[Reader]:
        return [
            self._reader("test split", self.base, sources.HELD_OUT, ["test"]),
            self._reader("train split", self.base, sources.TRAINED, ["train"]),
        ]

    def extra_reader(self, path: str) -> Reader:
        if not Path(path).is_dir():
            raise DataError(f"--extra-data {path}: folder not found")
        splits = [split for split in data.SPLITS if data.has_split(path, split)]
        if not splits:
            raise DataError(
                f"--extra-data {path}: holds no MNIST-format train- or t10k- images file"
            )
        return self._reader("extra data", path, sources.NEW, splits, {"splits": splits})

    def feature_spec(self) -> dict:
        return {INPUT_KEY: tf.io.FixedLenFeature([IMAGE_HEIGHT, IMAGE_WIDTH], tf.float32)}

    def feedback_content(self, features) -> bytes:
        return _quantized(features[INPUT_KEY])

    def feedback_features(self, parsed) -> dict:
        return {INPUT_KEY: parsed[INPUT_KEY]}

    def example_bytes(self) -> int:
        return IDX_IMAGE_BYTES * 4

    def predictions(self, predictor, features) -> np.ndarray:
        return predictor.run(features[INPUT_KEY], SIGNATURE_NAME)["classes"]

    def run_params(
        self, options: ModelOptions, model: str, max_steps: int, baseline_params: dict
    ) -> dict:
        # The linear and dnn normalizers are graph constants: keep the ones the weights know.
        stats = (baseline_params.get("pixel_mean"), baseline_params.get("pixel_std"))
        return model_params(options, model, max_steps, stats)

    def finish_params(self, params, trained) -> None:
        if params["pixel_mean"] is None:
            params["pixel_mean"], params["pixel_std"] = _pixel_stats(trained())

    def warm_start(self, checkpoint, params, run_dir):
        # Checked against the model's variables first: a mismatch is a clear error.
        shapes = trainable_variable_shapes(make_estimator(str(run_dir), params))
        return finetune.warm_start_settings(checkpoint, ".*", shapes)

    def receiver_fn(self):
        return publish.serving_input_receiver_fn()

    def estimator(self, run_dir, params, options: RunOptions | None, warm_start):
        if options is None:  # only its graphs are built
            return make_estimator(str(run_dir), params, warm_start_from=warm_start)
        return make_estimator(
            str(run_dir),
            params,
            seed=options.seed,
            save_checkpoints_steps=options.checkpoint_steps,
            warm_start_from=warm_start,
            session_config=determinism.session_config(options.deterministic),
        )

    @contextlib.contextmanager
    def staged(self, estimator, run_dir, model_name, build_report, checkpoint, warmup, write_plots):
        with publish.staged_version(
            estimator, run_dir, model_name, self.labels, build_report, checkpoint, warmup,
            write_extras=write_plots,
        ) as staged:  # fmt: skip
            yield staged

    def warmup_images(self, held_out: HeldOut) -> np.ndarray | None:
        return held_out.first_inputs(max(WARMUP_BATCH_SIZES))[INPUT_KEY]


def _pixel_stats(trained: tf.data.Dataset) -> tuple[float, float]:
    """Mean and standard deviation of the trained images' pixels in [0, 1] (the linear and
    dnn kinds' normalizer), streamed."""
    total = squares = count = 0.0
    for features, _ in trained.batch(1000).as_numpy_iterator():
        pixels = features[INPUT_KEY].astype(np.float64)
        total += pixels.sum()
        squares += (pixels**2).sum()
        count += pixels.size
    if not count:
        return 0.0, 1.0
    mean = total / count
    return round(mean, 6), round(math.sqrt(max(squares / count - mean**2, 0.0)), 6)


class IdxKind(DataKind):
    """MNIST-format IDX files (--data-dir, the default): the reference CNN and its baselines
    (training/kinds/idx_training.py, idx_comparison.py)."""

    name = "idx"
    option = "--data-dir"
    attribute = "data_dir"
    model_kinds = MODEL_KINDS
    default_model = "cnn"
    noun = "MNIST-format images"
    # Options of the IDX kinds that the other kinds' runs do not support (yet).
    only_options = {
        "--warm-start-from": "warm_start_from",
        "--fine-tune-from": "fine_tune_from",
        "--check-numerics": "check_numerics",
        "--num-gpus": "num_gpus",
    }

    def given(self, options) -> bool:
        # --data-dir has a default: IDX is the kind when no other kind's option is given.
        return False

    def refuse_options(self, options, chosen: str) -> None:
        for option, attribute in self.only_options.items():
            if getattr(options, attribute):
                raise UsageError(f"{option} is for the IDX image kinds; not with {chosen}")

    def default_folders(self, source) -> tuple[str, str]:
        return cli.DEFAULT_MODEL_DIR, cli.DEFAULT_EXPORT_DIR

    def train(self, config: TrainConfig, others: Sequence[DataKind]) -> int:
        return train_idx(config, others)

    def compare(self, config: CompareConfig, others: Sequence[DataKind]) -> int:
        return compare_idx(config, others)

    def retrain_data(
        self,
        options: DataOptions,
        recorded: dict,
        params: dict,
        has_baseline: bool,
        labels_of_idx: Callable[[], tuple[str, ...]],
        others: Sequence[DataKind],
    ) -> ModelData:
        for other in others:
            if other.given(options):
                raise UsageError(
                    f"{other.option}: the serving version was trained on MNIST-format images "
                    f"(--data-dir), not a {other.noun}; retrain it on its own kind of data"
                )
        named = " or ".join(other.option for other in others)
        for other in others:
            for option, attribute in other.only_options.items():
                if getattr(options, attribute) is not None:
                    raise UsageError(f"{option} is for {named} models")
        return IdxData(options.data_dir, labels_of_idx())


IDX = IdxKind()
