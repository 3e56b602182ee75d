"""`python -m training predict`: every input kind, equal to the service's answers, bad input."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from support.helpers import assert_one_error_line, png_bytes
from support.training_harness import (
    LABELS,
    call_main,
    serve,
    service_predict_pixels,
    write_idx_images,
)

from artifact.contract import normalize_pixels
from artifact.repository import resolve_version_path
from artifact.saved_model import SavedModelPredictor

# One model call on each side: TF's CPU kernels may round differently for other batch sizes,
# so the comparison with the service sends the same images in one request (<= its batch).
COUNT = 12


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_predict(model, input_path, output, *extra) -> int:
    return call_main("predict", "--model", model, "--input", input_path, "--output", output,
                     "--batch-size", 64, *extra)  # fmt: skip


def without_key(rows, key: str):
    """The rows (or one row) without one key."""
    if isinstance(rows, dict):
        return {k: v for k, v in rows.items() if k != key}
    return [without_key(row, key) for row in rows]


def assert_answers_equal(rows: list[dict], served: list[dict]) -> None:
    """Batch prediction's rows are the service's answers: the same keys, files, class ids and
    labels, and the same probabilities to float32 rounding (the service runs current
    TensorFlow, this command 2.15: docs/architecture.md, "Two TensorFlows")."""
    assert without_key(rows, "probabilities") == without_key(served, "probabilities")
    for row, answer in zip(rows, served, strict=True):
        assert list(row["probabilities"]) == list(answer["probabilities"])
        np.testing.assert_allclose(
            list(row["probabilities"].values()),
            list(answer["probabilities"].values()),
            rtol=1e-5,
            atol=1e-7,
        )


@pytest.fixture(scope="module")
def service(trained_model):
    """The service serving the session's model (in its own venv, on its own TensorFlow)."""
    with serve(trained_model.export_base) as client:
        yield client


@pytest.fixture(scope="module")
def service_answers(service, small_test_data) -> list[dict]:
    """The service's /predict answers for the first COUNT test images (JSON integers)."""
    images, _ = small_test_data
    return service_predict_pixels(service, images[:COUNT])


@pytest.fixture()
def image_folder(tmp_path, small_test_data) -> Path:
    """Test images as files: 28x28 grayscale PNGs, an RGB one, and a large dark-on-white one."""
    images, _ = small_test_data
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(4):
        (folder / f"item{i}.png").write_bytes(png_bytes(images[i]))
    (folder / "rgb.png").write_bytes(png_bytes(images[4], mode="RGB"))
    # A product shot: dark item on white, 4x larger; the service inverts and scales it.
    big = Image.fromarray(255 - images[5]).resize((112, 112), Image.NEAREST)
    big.convert("RGB").save(folder / "shot.jpg", quality=95)
    (folder / "notes.txt").write_text("not an image: skipped")
    return folder


def test_idx_predictions_equal_the_service_answers(
    tmp_path, trained_model, small_test_data, service_answers, capsys
):
    images, _ = small_test_data
    idx = write_idx_images(tmp_path / "images-idx3-ubyte", images[:COUNT])
    output = tmp_path / "preds.jsonl"
    assert run_predict(trained_model.version_path, idx, output) == 0
    out, err = capsys.readouterr()
    rows = read_lines(output)
    assert [row["index"] for row in rows] == list(range(COUNT))
    assert [list(row) for row in rows] == [["index", "class_id", "label", "probabilities"]] * COUNT
    # Equal to what the service answers for the same images.
    assert_answers_equal(without_key(rows, "index"), service_answers)
    for row in rows:
        assert row["label"] == LABELS[row["class_id"]]
        assert list(row["probabilities"]) == list(LABELS)
        assert max(row["probabilities"], key=row["probabilities"].get) == row["label"]
    assert f"Wrote {COUNT} predictions to {output}" in out
    assert f"[predict] [########################] {COUNT}/{COUNT} images" in err
    assert "done" in err.splitlines()[-1]


def test_gzipped_idx_and_npy_arrays_give_the_same_lines(
    tmp_path, trained_model, small_test_data, service_answers
):
    images, _ = small_test_data
    inputs = {
        "idx.gz": tmp_path / "t10k-images-idx3-ubyte.gz",
        "uint8.npy": tmp_path / "uint8.npy",
        "float.npy": tmp_path / "float.npy",
    }
    raw = write_idx_images(tmp_path / "raw", images[:COUNT]).read_bytes()
    inputs["idx.gz"].write_bytes(gzip.compress(raw))
    np.save(inputs["uint8.npy"], images[:COUNT])
    np.save(inputs["float.npy"], normalize_pixels(images[:COUNT]))
    for name, path in inputs.items():
        output = tmp_path / f"{name}.jsonl"
        assert run_predict(trained_model.version_path, path, output) == 0, name
        assert_answers_equal(without_key(read_lines(output), "index"), service_answers)


def test_one_npy_image_and_the_model_folder_means_its_newest_version(
    tmp_path, trained_model, small_test_data
):
    images, _ = small_test_data
    repository = tmp_path / "fashion_mnist"
    shutil.copytree(trained_model.export_base, repository)
    # A newer version 2 (the same model) is what a model folder resolves to.
    shutil.copytree(repository / "1", repository / "2")
    assert resolve_version_path(repository) == repository / "2"
    np.save(tmp_path / "one.npy", images[0])  # [28, 28]: one image
    output = tmp_path / "one.jsonl"
    assert run_predict(repository, tmp_path / "one.npy", output) == 0
    with serve(repository) as client:
        status = client.get("/v1/models/fashion_mnist").json()["model_version_status"]
        assert status[0]["version"] == "2"
        (answer,) = service_predict_pixels(client, images[:1])
    assert_answers_equal(read_lines(output), [{"index": 0, **answer}])


def test_image_folder_predictions_equal_the_service_answers_for_uploads(
    tmp_path, trained_model, service, image_folder
):
    output = tmp_path / "folder.jsonl"
    assert run_predict(trained_model.export_base, image_folder, output) == 0
    rows = read_lines(output)
    names = sorted(p.name for p in image_folder.iterdir() if p.suffix != ".txt")
    assert [row["file"] for row in rows] == names
    files = [("files", (name, (image_folder / name).read_bytes())) for name in names]
    response = service.post("/predict", files=files)
    assert response.status_code == 200, response.text
    assert_answers_equal(rows, response.json()["predictions"])
    # A single image file works too (alone in its batch: equal to float32 rounding).
    single = tmp_path / "single.jsonl"
    assert run_predict(trained_model.version_path, image_folder / "shot.jpg", single) == 0
    (alone,) = read_lines(single)
    (in_folder,) = [row for row in rows if row["file"] == "shot.jpg"]
    assert without_key(alone, "probabilities") == without_key(in_folder, "probabilities")
    np.testing.assert_allclose(
        list(alone["probabilities"].values()), list(in_folder["probabilities"].values()), rtol=1e-5
    )


def test_predictions_match_the_saved_model_across_batches(tmp_path, trained_model, small_test_data):
    images, _ = small_test_data
    np.save(tmp_path / "all.npy", images)
    output = tmp_path / "all.jsonl"
    code = call_main("predict", "--model", trained_model.version_path, "--input",
                     tmp_path / "all.npy", "--output", output, "--batch-size", 128)  # fmt: skip
    assert code == 0
    rows = read_lines(output)
    classes, probabilities = SavedModelPredictor(trained_model.version_path).predict_batched(
        normalize_pixels(images), 128
    )
    assert [row["class_id"] for row in rows] == classes.tolist()
    got = np.array([list(row["probabilities"].values()) for row in rows])
    np.testing.assert_allclose(got, probabilities, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Bad input: exit code 2, one line, no output file (and an existing one left as it was).


def bad_empty_folder(tmp, images):
    folder = tmp / "empty"
    folder.mkdir()
    (folder / "readme.txt").write_text("no images here")
    return folder, f"{folder}: no image files in this folder"


def bad_corrupt_image(tmp, images):
    folder = tmp / "folder"
    folder.mkdir()
    (folder / "a.png").write_bytes(png_bytes(images[0]))
    (folder / "b.png").write_bytes(b"\x89PNG not really")
    return folder, f"{folder / 'b.png'}: not an image file"


def bad_missing_input(tmp, images):
    return tmp / "nowhere.npy", f"{tmp / 'nowhere.npy'}: not found"


def bad_npy_shape(tmp, images):
    np.save(tmp / "wrong.npy", images[:3, :27])
    return tmp / "wrong.npy", "expected an array [n, 28, 28] or [28, 28], got (3, 27, 28)"


def bad_npy_range(tmp, images):
    np.save(tmp / "range.npy", images[:3].astype(np.float32))  # 0-255 floats
    return tmp / "range.npy", "image 0: float pixels must be in [0, 1]"


def bad_npy_pickle(tmp, images):
    np.save(tmp / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return tmp / "objects.npy", "not a readable .npy array"


def bad_not_idx(tmp, images):
    (tmp / "data.bin").write_bytes(b"\x00" * 64)
    return tmp / "data.bin", "wrong magic number"


BAD_INPUTS = [
    pytest.param(bad_empty_folder, id="empty_folder"),
    pytest.param(bad_corrupt_image, id="corrupt_image"),
    pytest.param(bad_missing_input, id="missing_input"),
    pytest.param(bad_npy_shape, id="npy_shape"),
    pytest.param(bad_npy_range, id="npy_range"),
    pytest.param(bad_npy_pickle, id="npy_pickle"),
    pytest.param(bad_not_idx, id="not_idx"),
]


@pytest.mark.parametrize("build", BAD_INPUTS)
def test_bad_input_exits_2_and_leaves_the_output_alone(
    tmp_path, trained_model, small_test_data, capsys, build
):
    images, _ = small_test_data
    input_path, message = build(tmp_path, images)
    output = tmp_path / "preds.jsonl"
    output.write_text("previous run\n")
    capsys.readouterr()
    assert run_predict(trained_model.version_path, input_path, output) == 2
    _, err = capsys.readouterr()
    assert_one_error_line(err, message)
    assert output.read_text() == "previous run\n"
    assert sorted(p.name for p in tmp_path.glob(".preds.jsonl.*")) == []


@pytest.mark.parametrize("problem", ["missing model", "no version", "missing output dir"])
def test_bad_model_or_output_exits_2(tmp_path, small_test_data, capsys, problem):
    images, _ = small_test_data
    np.save(tmp_path / "x.npy", images[:2])
    model, output = tmp_path / "models" / "m", tmp_path / "out.jsonl"
    if problem == "missing model":
        message = f"--model {model}: not found"
    elif problem == "no version":
        model.mkdir(parents=True)
        message = f"--model {model}: holds no exported version"
    else:
        model = tmp_path / "version"
        model.mkdir()
        (model / "saved_model.pb").write_bytes(b"")  # never loaded: the output is checked first
        output = tmp_path / "no" / "out.jsonl"
        message = f"--output {output}: folder {output.parent} does not exist"
    assert run_predict(model, tmp_path / "x.npy", output) == 2
    _, err = capsys.readouterr()
    assert_one_error_line(err, message)
    assert not output.exists()


def test_failure_midway_leaves_no_file(tmp_path, trained_model, small_test_data, monkeypatch):
    images, _ = small_test_data
    np.save(tmp_path / "all.npy", images)
    calls = []
    original = SavedModelPredictor.predict

    def fail_on_second_batch(self, batch):
        calls.append(len(batch))
        if len(calls) == 2:
            raise RuntimeError("model failed")
        return original(self, batch)

    monkeypatch.setattr(SavedModelPredictor, "predict", fail_on_second_batch)
    output = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError, match="model failed"):
        call_main("predict", "--model", trained_model.version_path, "--input",
                  tmp_path / "all.npy", "--output", output, "--batch-size", 100)  # fmt: skip
    assert calls == [100, 100]
    assert not output.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["all.npy"]


def test_a_classifier_with_neither_classes_nor_a_known_width_is_named(tmp_path):
    """A tabular signature whose probabilities have an unknown shape, with no labels.txt and
    no classes in its report: nothing tells how many classes it has."""
    from tensorflow.core.framework import types_pb2
    from tensorflow.core.protobuf import meta_graph_pb2

    from training import exported_model
    from training.errors import UsageError

    signature = meta_graph_pb2.SignatureDef()
    signature.inputs["rooms"].dtype = types_pb2.DT_FLOAT
    signature.inputs["rooms"].tensor_shape.dim.add().size = -1
    signature.outputs["probabilities"].dtype = types_pb2.DT_FLOAT
    signature.outputs["probabilities"].tensor_shape.unknown_rank = True
    with pytest.raises(UsageError, match="output 'probabilities' has an unknown shape"):
        exported_model._tabular(tmp_path, "predict", signature, None)
