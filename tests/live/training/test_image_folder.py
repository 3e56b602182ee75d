"""`train --image-folder`: a small CNN on images of any size, exported and served by TF.

sample-data's shapes/ folder (40x30 RGB PNGs and JPEGs, 3 classes) trained a few steps at
32x32x3 through the real command line, once per module and kind (the custom model_fn's CNN,
and the same CNN in Keras through model_to_estimator).
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from artifact.contract import ASSETS_EXTRA, LABELS_FILE, REPORT_FILE
from training import image_folder, runs
from training.__main__ import main
from training.sample_data import SHAPES, write_sample_data

# Keras' graph-mode code under model_to_estimator warns about its own internals.
pytestmark = [
    pytest.mark.filterwarnings("ignore:`tf.keras.backend.set_learning_phase` is deprecated"),
]

STEPS = 30
SIZE, CHANNELS = 32, 3
PER_CLASS = 15  # sample-data's default: 3 of each class held out


class Trained:
    def __init__(self, folder: Path, model_dir: Path, version: Path):
        self.folder, self.model_dir, self.version = folder, model_dir, version


@pytest.fixture(scope="module", params=image_folder.IMAGE_KINDS)
def trained(request, tmp_path_factory) -> Trained:
    tmp = tmp_path_factory.mktemp(f"images-{request.param}")
    folder = write_sample_data(tmp / "sample")["images"]
    model_dir, export_dir = tmp / "run", tmp / "models" / "shapes"
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(
            ["train", "--image-folder", str(folder), "--image-size", str(SIZE),
             "--channels", str(CHANNELS), "--model-dir", str(model_dir),
             "--export-dir", str(export_dir), "--max-steps", str(STEPS), "--batch-size", "16",
             "--seed", "0", "--eval-every-secs", "1", "--model", request.param]
        )  # fmt: skip
    assert code == 0, out.getvalue()
    versions = sorted(p.name for p in export_dir.iterdir())
    assert versions == ["1"], versions
    return Trained(folder, model_dir, export_dir / "1")


def test_export_signatures_take_the_folders_image_size(trained):
    loaded = tf.saved_model.load(str(trained.version))
    assert set(loaded.signatures) == {"serving_default", "classify"}
    for signature in loaded.signatures.values():
        (spec,) = signature.structured_input_signature[1].values()
        assert list(signature.structured_input_signature[1]) == ["image"]
        assert (spec.dtype, spec.shape.as_list()) == (tf.float32, [None, SIZE, SIZE, CHANNELS])
        outputs = {k: (v.dtype, v.shape.as_list()) for k, v in signature.structured_outputs.items()}
        assert outputs == {
            "classes": (tf.int64, [None]),
            "probabilities": (tf.float32, [None, len(SHAPES)]),
        }


def test_export_answers_as_estimator_predict(trained):
    folder = image_folder.scan_image_folder(trained.folder)
    images, _ = image_folder.holdout_images(folder, SIZE, CHANNELS)
    assert images.shape == (len(SHAPES) * 3, SIZE, SIZE, CHANNELS)
    assert images.min() >= 0.0 and images.max() <= 1.0 and images.std() > 0.05
    params = runs.load_params(trained.model_dir)
    estimator = image_folder.make_estimator(
        params, tf.estimator.RunConfig(model_dir=str(trained.model_dir))
    )
    expected = list(
        estimator.predict(
            lambda: tf.data.Dataset.from_tensor_slices({"image": images}).batch(len(images))
        )
    )
    probabilities = np.array([p["probabilities"] for p in expected])
    classes = np.array([p["classes"] for p in expected])
    signature = tf.saved_model.load(str(trained.version)).signatures["serving_default"]
    answer = signature(image=tf.constant(images))
    np.testing.assert_allclose(answer["probabilities"].numpy(), probabilities, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(answer["classes"].numpy(), classes)
    # Not a constant model.
    assert np.ptp(probabilities, axis=0).max() > 1e-3


def test_report_and_labels(trained):
    extra = trained.version / ASSETS_EXTRA
    assert (extra / LABELS_FILE).read_text(encoding="utf-8").splitlines() == list(SHAPES)
    report = json.loads((extra / REPORT_FILE).read_text(encoding="utf-8"))
    assert report["task"] == "classification" and report["split"] == "holdout"
    assert report["examples"] == len(SHAPES) * 3 and report["global_step"] == STEPS
    confusion = np.array(report["confusion_matrix"])
    assert confusion.shape == (3, 3)
    np.testing.assert_array_equal(confusion.sum(axis=1), [3, 3, 3])
    assert report["accuracy"] == pytest.approx(np.trace(confusion) / confusion.sum(), abs=1e-4)
    assert [row["label"] for row in report["per_class"]] == list(SHAPES)
    for k, row in enumerate(report["per_class"]):
        assert row["recall"] == pytest.approx(confusion[k, k] / 3, abs=1e-4)
    params = json.loads((trained.model_dir / "params.json").read_text())
    assert params["data"]["image_size"] == SIZE and params["data"]["channels"] == CHANNELS
    assert params["model"] in image_folder.IMAGE_KINDS and params["num_classes"] == len(SHAPES)


def test_grayscale_at_another_size(tmp_path, capsys):
    """--channels 1 --image-size 16: the same folder of RGB images, read as grayscale."""
    folder = write_sample_data(tmp_path / "sample", rows=10, images_per_class=5)["images"]
    export_dir = tmp_path / "models" / "gray"
    code = main(
        ["train", "--image-folder", str(folder), "--image-size", "16", "--channels", "1",
         "--model-dir", str(tmp_path / "run"), "--export-dir", str(export_dir),
         "--max-steps", "5", "--batch-size", "8", "--seed", "0"]
    )  # fmt: skip
    assert code == 0
    signature = tf.saved_model.load(str(export_dir / "1")).signatures["serving_default"]
    (spec,) = signature.structured_input_signature[1].values()
    assert spec.shape.as_list() == [None, 16, 16, 1]
    images, _ = image_folder.holdout_images(image_folder.scan_image_folder(folder), 16, 1)
    assert images.shape == (3, 16, 16, 1)
    probabilities = signature(image=tf.constant(images))["probabilities"].numpy()
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)


def test_an_image_folder_refuses_csv_options(tmp_path, capsys):
    folder = write_sample_data(tmp_path / "sample", rows=10, images_per_class=5)["images"]
    code = main(["train", "--image-folder", str(folder), "--receiver", "parsing",
                 "--model-dir", str(tmp_path / "run"), "--export-dir", str(tmp_path / "m")])  # fmt: skip
    assert code == 2
    assert capsys.readouterr().err.strip() == "error: --receiver is for --csv"
    assert not (tmp_path / "run").exists() and not (tmp_path / "m").exists()
