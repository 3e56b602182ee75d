"""The friendly /predict/{model} for models as users export them beyond the trainer's kinds,
served side by side from one model config by a real `python -m service` (conftest's
`exports_server`): every answer held against `tf.saved_model.load` in this process.

The models (tests/support/user_exports.py): an Estimator taking `image_bytes` and decoding
each file in its graph (TF Serving's usual image model), a `tf.Module` doing the same with
`tf.io.decode_png`, and a pre-made DNNRegressor with label_dimension=2.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from support.helpers import error_message, ok_json, png_bytes
from support.tf_reference import columns, reference
from support.user_exports import RESNET_LABELS, TWO_TARGET_ROWS

TIMEOUT = 60.0
RNG = np.random.default_rng(0)


@pytest.fixture(scope="module")
def client(exports_server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=exports_server.url, timeout=TIMEOUT) as c:
        yield c


@pytest.fixture(scope="module")
def loaded(user_exports):
    """Each model's SavedModel loaded in this process: the reference answers."""
    return {name: tf.saved_model.load(str(path / "1")) for name, path in user_exports.items()}


def jpeg_bytes(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def b64(data: bytes) -> dict:
    return {"b64": base64.b64encode(data).decode()}


# Photos of several sizes and formats: a red PNG, a blue JPEG, a grayscale PNG.
PHOTOS = [RNG.integers(0, 100, size).astype(np.uint8) for size in ((40, 30, 3), (23, 51, 3))]
PHOTOS[0][..., 0] += 150
PHOTOS[1][..., 2] += 150
FILES = [
    ("red.png", png_bytes(PHOTOS[0])),
    ("blue.jpg", jpeg_bytes(PHOTOS[1])),
    ("gray.png", png_bytes(RNG.integers(0, 256, (9, 64)).astype(np.uint8))),
]


def files_of(files) -> list:
    return [("files", (name, data)) for name, data in files]


# --- an image model that decodes its own images ------------------------------------------


def test_uploads_and_base64_images_reach_an_image_bytes_model_unchanged(client, loaded):
    want = reference(
        loaded,
        "resnet_bytes",
        "serving_default",
        image_bytes=np.array([data for _, data in FILES], dtype=object),
    )
    uploaded = ok_json(client.post("/predict/resnet_bytes", files=files_of(FILES)))
    assert uploaded["model_name"] == "resnet_bytes" and uploaded["model_version"] == "1"
    rows = uploaded["predictions"]
    assert [row["file"] for row in rows] == [name for name, _ in FILES]
    for row, class_id, probabilities in zip(
        rows, want["classes"], want["probabilities"], strict=True
    ):
        # Labels from the version's labels.txt; every probability the model's own.
        assert row["class_id"] == class_id and row["label"] == RESNET_LABELS[class_id]
        assert list(row["probabilities"]) == list(RESNET_LABELS)
        np.testing.assert_array_equal(
            np.array(list(row["probabilities"].values()), np.float32), probabilities
        )
    # The model learned the brightest channel: the red photo is red, the blue one blue.
    assert [row["label"] for row in rows[:2]] == ["red", "blue"]
    # Base64, bare or naming the input, as TF Serving's own :predict takes them: one answer.
    bare = {"instances": [b64(data) for _, data in FILES]}
    named = {"instances": [{"image_bytes": b64(data)} for _, data in FILES]}
    without_files = [{k: v for k, v in row.items() if k != "file"} for row in rows]
    assert ok_json(client.post("/predict/resnet_bytes", json=bare))["predictions"] == without_files
    assert ok_json(client.post("/predict/resnet_bytes", json=named))["predictions"] == without_files
    served = ok_json(client.post("/v1/models/resnet_bytes:predict", json=bare))["predictions"]
    assert [row["classes"] for row in served] == want["classes"].tolist()


def test_a_tf_module_decoding_pngs_answers_its_guessed_probabilities(client, loaded):
    png = png_bytes(RNG.integers(0, 256, (30, 20)).astype(np.uint8))
    (row,) = ok_json(client.post("/predict/png_module", files=[("files", ("a.png", png))]))[
        "predictions"
    ]
    (probabilities,) = reference(
        loaded, "png_module", "serving_default", image_bytes=np.array([png], dtype=object)
    )["output_0"]
    # Two classes without labels.txt: named by their ids.
    assert row["label"] == str(probabilities.argmax()) and list(row["probabilities"]) == ["0", "1"]
    np.testing.assert_array_equal(
        np.array(list(row["probabilities"].values()), np.float32), probabilities
    )


def test_what_the_graph_cannot_decode_is_a_400_naming_the_file(client):
    truncated = FILES[0][1][:200]  # a PNG's header, then too little of its data
    message = error_message(
        client.post("/predict/resnet_bytes", files=[("files", ("cut.png", truncated))]), 400
    )
    assert message == (
        "files[0] (cut.png): model resnet_bytes could not use it (the model decodes its images "
        "itself): Invalid PNG data, size 200"
    )
    message = error_message(
        client.post("/predict/png_module", json={"instances": [b64(truncated)] * 2}), 400
    )
    assert message == (
        "model png_module could not use one of the 2 images (the model decodes its images "
        "itself): Invalid PNG data, size 200"
    )
    # What is no image at all never reaches the model: named from its header.
    message = error_message(
        client.post("/predict/resnet_bytes", files=[("files", ("notes.txt", b"a note"))]), 400
    )
    assert message.startswith("files[0] (notes.txt): not an image file in an accepted format")
    # And the model serves on.
    ok_json(client.post("/predict/resnet_bytes", files=files_of(FILES[:1])))


def test_the_page_is_told_the_models_take_image_files(client):
    for model in ("resnet_bytes", "png_module"):
        form = ok_json(client.get(f"/page/models/{model}"))["form"]
        assert form["kind"] == "image_bytes" and form["task"] == "classification", model
        assert form["inputs"] == [{"name": "image_bytes", "dtype": "object", "shape": [-1]}]
    form = ok_json(client.get("/page/models/png_module"))["form"]
    assert form["probabilities_guessed"] is True


# --- a regressor of two values per instance ----------------------------------------------


def test_a_premade_regressor_with_label_dimension_2_answers_a_list_each(client, loaded):
    answer = ok_json(client.post("/predict/two_targets", json={"instances": TWO_TARGET_ROWS}))
    want = reference(loaded, "two_targets", "predict", **columns(TWO_TARGET_ROWS))["predictions"]
    assert want.shape == (3, 2)
    assert [list(row) for row in answer["predictions"]] == [["value"]] * 3
    np.testing.assert_array_equal(
        np.array([row["value"] for row in answer["predictions"]], np.float32), want
    )
    form = ok_json(client.get("/page/models/two_targets"))["form"]
    assert (form["kind"], form["signature_name"]) == ("features", "predict")
    assert [f["name"] for f in form["features"]] == ["x1", "x2"]
