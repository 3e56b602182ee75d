"""Models of other contracts than Fashion-MNIST's, made quickly for the tests that serve them.

- `classifier`: a pre-made LinearClassifier on sample-data's classification.csv (floats x1,
  x2, int64 rooms, a string categorical `color`; label_vocabulary high/low/mid), exported
  through the raw receiver: one `predict` signature, no `serving_default`.
- `regressor`: a pre-made DNNRegressor on regression.csv, the same receiver.
- `classifier_examples`, `regressor_examples`: the same checkpoints exported through the
  parsing receiver (tf.Examples in: `classification`/`regression`, `predict` and
  `serving_default` signatures), what TF Serving's Classify and Regress need.
- `shapes`: the custom model_fn's CNN on sample-data's image folder at 32x32x3 (`image`
  float32 [-1, 32, 32, 3], 3 classes).
- `tokens`: a tf.Module with int64 and string inputs, string outputs (one of them `_bytes`)
  and a second signature whose input has no batch dimension.

Each is trained a few steps through `python -m training` (seconds) or saved directly.
"""

from __future__ import annotations

from pathlib import Path

from support.sides import run_trainings

STEPS = 30
IMAGE_SIZE, CHANNELS = 32, 3
# Instances of the tabular models' features (sample-data's classification.csv columns, and
# regression.csv's with `city` for `color`).
ROWS = [
    {"x1": 0.5, "x2": 4.0, "rooms": 3, "color": "red"},
    {"x1": -1.25, "x2": 6.5, "rooms": 1, "color": "blue"},
    # Outside the vocabulary: served, as TensorFlow serves it (the column's OOV bucket).
    {"x1": 2.0, "x2": 3.0, "rooms": 5, "color": "purple"},
]
CITY_ROWS = [{k: v for k, v in r.items() if k != "color"} | {"city": c} for r, c in
             zip(ROWS, ("a", "d", "zz"), strict=True)]  # fmt: skip


def classifier_commands(sample: Path, work: Path, export_dir: Path, *extra) -> list[list]:
    """Trained once; a second command with the same work folder only exports (the run is at
    its last step), e.g. through `--receiver parsing`."""
    return [[
        "train", "--csv", sample / "classification.csv", "--label", "label",
        "--model-dir", work / "classifier", "--export-dir", export_dir,
        "--max-steps", STEPS, "--batch-size", 32, "--learning-rate", 0.05, "--deterministic",
        "--eval-every-secs", 1, *extra,
    ]]  # fmt: skip


def regressor_commands(sample: Path, work: Path, export_dir: Path, *extra) -> list[list]:
    return [[
        "train", "--csv", sample / "regression.csv", "--label", "price", "--model", "dnn",
        "--hidden-units", "8", "--model-dir", work / "regressor", "--export-dir", export_dir,
        "--max-steps", STEPS, "--batch-size", 32, "--learning-rate", 0.05, "--deterministic",
        "--eval-every-secs", 1, *extra,
    ]]  # fmt: skip


def shapes_commands(sample: Path, work: Path, export_dir: Path) -> list[list]:
    return [[
        "train", "--image-folder", sample / "shapes", "--image-size", IMAGE_SIZE,
        "--channels", CHANNELS, "--model-dir", work / "shapes", "--export-dir", export_dir,
        "--max-steps", 10, "--batch-size", 16, "--deterministic", "--eval-every-secs", 1,
    ]]  # fmt: skip


def save_tokens(version_dir: Path) -> None:
    """int64 `ids` [-1] and string `words` [-1] in; `doubled` int64, `upper` and `echo_bytes`
    strings out (serving_default); `fixed`: float `x` [3] (no batch dimension) -> `scaled`."""
    import tensorflow as tf

    class Tokens(tf.Module):
        @tf.function(
            input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.string)]
        )
        def serve(self, ids, words):
            return {
                "doubled": ids * 2,
                "upper": tf.strings.upper(words),
                "echo_bytes": tf.strings.join([words, b"\xff"]),
            }

        @tf.function(input_signature=[tf.TensorSpec([3], tf.float32)])
        def fixed(self, x):
            return {"scaled": x * 10.0}

    module = Tokens()
    tf.saved_model.save(
        module,
        str(version_dir),
        signatures={
            "serving_default": module.serve.get_concrete_function(),
            "fixed": module.fixed.get_concrete_function(),
        },
    )


def make_repository(root: Path) -> dict[str, Path]:
    """Every model above as version 1 under root/models/<name>; their folders by name.

    The trained ones in one run of the training side (support/sides.py), the tokens module
    here."""
    sample, base, work = root / "sample", root / "models", root / "work"
    names = ("classifier", "regressor", "classifier_examples", "regressor_examples", "shapes",
             "tokens")  # fmt: skip
    dirs = {name: base / name for name in names}
    run_trainings(
        [["sample-data", "--out", sample]]
        + classifier_commands(sample, work, dirs["classifier"])
        + classifier_commands(sample, work, dirs["classifier_examples"], "--receiver", "parsing")
        + regressor_commands(sample, work, dirs["regressor"])
        + regressor_commands(sample, work, dirs["regressor_examples"], "--receiver", "parsing")
        + shapes_commands(sample, work, dirs["shapes"])
    )
    save_tokens(dirs["tokens"] / "1")
    return dirs
