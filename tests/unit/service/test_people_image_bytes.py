"""The friendly /predict for models as users export them beyond the trainer's kinds
(service/protocols/model_form.py, simple_predict.py; service/codecs/simple_json.py): an
image model that decodes its own images (one `image_bytes` string [-1] input: each file's
bytes go to it unchanged), and a regressor of several values per instance (a pre-made
regressor with label_dimension 2: `value` a list).

Fast tier: signatures as typed values, models as numpy functions (support.fakes.AnyFakeBackend).
"""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image
from support.fakes import AnyFakeBackend, FakeModel, app_client
from support.helpers import error_message, ok_json, png_bytes

from service.budgets import PixelBudget
from service.codecs import simple_json
from service.errors import BadInput
from service.protocols import model_form, simple_predict
from service.types import SignatureSpec, TensorSpec

FLOAT, INT64, STRING = np.dtype(np.float32), np.dtype(np.int64), np.dtype(object)
PREDICT, REGRESS = model_form.PREDICT_METHOD, model_form.REGRESS_METHOD
LABELS = ("cat", "dog", "eel")


def spec(name, dtype, *shape):
    return TensorSpec(name, dtype, shape)


# What the official ResNet export and an Estimator behind a TensorServingInputReceiver of
# encoded images give: image_bytes string [-1] in, classes and probabilities out.
IMAGE_BYTES = SignatureSpec(
    "serving_default",
    PREDICT,
    (spec("image_bytes", STRING, -1),),
    (spec("classes", INT64, -1), spec("probabilities", FLOAT, -1, 3)),
)
# A pre-made DNNRegressor(label_dimension=2) through the raw receiver: only `predict`, and
# its one output `predictions` [-1, 2].
TWO_TARGETS = SignatureSpec(
    "predict",
    PREDICT,
    (spec("x1", FLOAT, -1), spec("x2", FLOAT, -1)),
    (spec("predictions", FLOAT, -1, 2),),
)
# The same through the parsing receiver: a regress signature's `outputs` [-1, 2].
REGRESS_TWO = SignatureSpec(
    "serving_default", REGRESS, (spec("inputs", STRING, -1),), (spec("outputs", FLOAT, -1, 2),)
)
# TensorFlow's words when decode_image is given a text file (tf 2.21, inside a map_fn).
DECODE_ERROR = (
    "{{function_node __inference_<lambda>_244}} Unknown image file format. One of JPEG, JPEG "
    "XL, PNG, GIF, BMP, WebP required.\n\t [[{{function_node "
    "__inference_map_while_body_254_36}}{{node decode_image/DecodeImage}}]] "
    "[Op:__inference_<lambda>_244]"
)

PNG = png_bytes(np.arange(12 * 20, dtype=np.uint8).reshape(12, 20))  # 240 pixels


def jpeg_bytes(height: int, width: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, "JPEG")
    return out.getvalue()


def first_byte_classes(signature_name, inputs):
    """Class (first byte mod 3) of each file, so a test sees which bytes the model got."""
    files = inputs["image_bytes"]
    classes = np.array([data[0] % 3 for data in files], np.int64)
    probabilities = np.full((len(files), 3), 0.1, np.float32)
    probabilities[np.arange(len(files)), classes] = 0.8
    return {"classes": classes, "probabilities": probabilities}


def refuse_to_decode(signature_name, inputs):
    raise BadInput(DECODE_ERROR)


def two_targets(signature_name, inputs):
    return {"predictions": np.stack([inputs["x1"] + inputs["x2"], inputs["x1"] - 10], axis=1)}


MODELS = {
    "resnet": FakeModel({"serving_default": IMAGE_BYTES}, first_byte_classes, LABELS),
    "strict": FakeModel({"serving_default": IMAGE_BYTES}, refuse_to_decode, LABELS),
    "two_targets": FakeModel({"predict": TWO_TARGETS}, two_targets),
    "regress_two": FakeModel(
        {"serving_default": REGRESS_TWO},
        lambda name, inputs: {"outputs": np.array([[1.5, -2.0]] * len(inputs["inputs"]))},
    ),
}


@pytest.fixture
def backend():
    return AnyFakeBackend(MODELS)


@pytest.fixture
def client(backend):
    with app_client(backend, max_request_pixels=10_000) as c:
        yield c


def b64(data: bytes) -> dict:
    return {"b64": base64.b64encode(data).decode()}


# --- what the signature is ---------------------------------------------------------------


@pytest.mark.parametrize(
    "inputs, kind",
    [
        pytest.param((spec("image_bytes", STRING, -1),), "image_bytes", id="image_bytes"),
        pytest.param((spec("input_images_bytes", STRING, -1),), "image_bytes", id="images"),
        pytest.param((spec("audio_bytes", STRING, -1),), "features", id="not-images"),
        pytest.param((spec("image", STRING, -1),), "features", id="no-suffix"),
        pytest.param((spec("image_bytes", STRING, -1, 1),), "features", id="not-one-per-instance"),
        pytest.param((spec("image_bytes", STRING, 1),), "tensors", id="no-batch-dimension"),
        pytest.param((spec("image_bytes", INT64, -1),), "features", id="not-strings"),
        pytest.param((spec("image_bytes", STRING, -1), spec("key", STRING, -1)), "features",
                     id="with-a-key"),
    ],
)  # fmt: skip
def test_one_string_input_named_bytes_takes_image_files(inputs, kind):
    form = model_form.describe(SignatureSpec("s", PREDICT, inputs, IMAGE_BYTES.outputs))
    assert form.kind == kind
    assert form.task == "classification" and form.image is None and not form.image_contract


def test_the_page_is_told_the_kind_and_whether_probabilities_are_guessed(client):
    form = ok_json(client.get("/page/models/resnet"))["form"]
    assert form["kind"] == "image_bytes" and form["image"] is None
    assert form["inputs"] == [{"name": "image_bytes", "dtype": "object", "shape": [-1]}]
    assert form["probabilities_guessed"] is False
    form = ok_json(client.get("/page/models/two_targets"))["form"]
    assert (form["kind"], form["task"], form["probabilities_guessed"]) == (
        "features",
        "classification",
        True,
    )


# --- reading what a person sends ---------------------------------------------------------


def test_instances_are_base64_files_bare_or_naming_the_input():
    files = simple_json.image_bytes_files(
        [b64(b"\x89PNG"), {"image_bytes": b64(b"GIF8")}], "image_bytes"
    )
    assert files == [("instances[0]", b"\x89PNG"), ("instances[1].image_bytes", b"GIF8")]


@pytest.mark.parametrize(
    "instance, message",
    [
        pytest.param(np.zeros((4, 4)).tolist(), 'instances[0]: expected {"b64": "<base64 image '
                     'file>"} or {"image_bytes": {"b64": ...}}, got a list of 4; the model takes '
                     "image files and decodes them itself", id="pixels"),
        pytest.param("aGk=", "instances[0]: expected", id="a-bare-string"),
        pytest.param({"image_bytes": "aGk="}, "instances[0].image_bytes: expected", id="named-string"),
        pytest.param({"image": b64(b"x")}, "got an object with ['image']", id="another-name"),
        pytest.param({"b64": "@@"}, "instances[0].b64: not valid base64", id="bad-base64"),
        pytest.param({"image_bytes": {"b64": "@"}}, "instances[0].image_bytes.b64: not valid",
                     id="named-bad-base64"),
    ],
)  # fmt: skip
def test_instances_that_are_not_files_are_refused_naming_them(instance, message):
    with pytest.raises(BadInput) as caught:
        simple_json.image_bytes_files([instance], "image_bytes")
    assert message in caught.value.message


def test_tensorflows_words_lose_its_graphs_names():
    assert simple_predict.tensorflow_words(DECODE_ERROR) == (
        "Unknown image file format. One of JPEG, JPEG XL, PNG, GIF, BMP, WebP required."
    )
    assert simple_predict.tensorflow_words("Input is empty.") == "Input is empty."
    assert simple_predict.tensorflow_words("{{node x}}") == "{{node x}}"  # nothing else: as it was


# --- the files go to the model unchanged -------------------------------------------------


def test_uploads_reach_the_model_byte_for_byte(client, backend):
    jpeg = jpeg_bytes(30, 40)
    files = [("files", ("a.png", PNG, "image/png")), ("files", ("b.jpg", jpeg, "image/jpeg"))]
    # include_pixels and invert do not apply: the service never sees the pixels.
    answer = ok_json(client.post("/predict/resnet?include_pixels=true&invert=yes", files=files))
    ((model, signature_name, inputs),) = backend.inputs
    assert (model, signature_name) == ("resnet", "serving_default")
    assert inputs["image_bytes"].dtype == object and inputs["image_bytes"].tolist() == [PNG, jpeg]
    rows = answer["predictions"]
    assert [row["file"] for row in rows] == ["a.png", "b.jpg"]
    assert [row["label"] for row in rows] == [LABELS[PNG[0] % 3], LABELS[jpeg[0] % 3]]
    assert rows[0]["probabilities"] == {
        label: pytest.approx(0.8 if i == PNG[0] % 3 else 0.1) for i, label in enumerate(LABELS)
    }
    assert not any("pixels" in row for row in rows)


def test_base64_instances_reach_the_model_byte_for_byte(client, backend):
    body = {"instances": [b64(PNG), {"image_bytes": b64(PNG[:-1] + b"\x00")}]}
    rows = ok_json(client.post("/predict/resnet", json=body))["predictions"]
    ((_, _, inputs),) = backend.inputs
    assert inputs["image_bytes"].tolist() == [PNG, PNG[:-1] + b"\x00"]
    assert len(rows) == 2 and "file" not in rows[0]
    # A large body is read on the decoding thread: the same answer.
    padded = {"instances": [b64(PNG)] * 16}
    big = ok_json(client.post("/predict/resnet", json=padded))["predictions"]
    assert big == [rows[0]] * 16


# --- refused, and said why ---------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, status, message",
    [
        pytest.param({"files": [("files", ("a.png", PNG)), ("files", ("notes.txt", b"hello"))]},
                     400, "files[1] (notes.txt): not an image file in an accepted format (PNG, "
                     "JPEG)", id="a-text-file"),
        pytest.param({"json": {"instances": [b64(b"hello")]}}, 400,
                     "instances[0]: not an image file", id="base64-text"),
        pytest.param({"json": {"instances": [np.zeros((28, 28)).tolist()]}}, 400,
                     'instances[0]: expected {"b64": "<base64 image file>"}', id="pixels"),
        pytest.param({"files": [("files", ("big.jpg", jpeg_bytes(120, 100)))]}, 413,
                     "the limit is 0.01 per request (MAX_REQUEST_PIXELS)",
                     id="past-max-request-pixels"),
        pytest.param({"files": [("files", (f"{i}.png", PNG)) for i in range(17)]}, 413,
                     "the limit is 16 per request (MAX_IMAGES)", id="too-many-files"),
        pytest.param({"json": {"instances": [b64(PNG)] * 17}}, 413,
                     "request has 17 images; the limit is 16", id="too-many-instances"),
        pytest.param({"json": {"instances": []}}, 400, "instances: is empty", id="empty"),
    ],
)  # fmt: skip
def test_what_is_no_image_never_reaches_the_model(client, backend, kwargs, status, message):
    assert message in error_message(client.post("/predict/resnet", **kwargs), status)
    assert backend.inputs == []


def test_the_models_own_refusal_is_a_400_naming_the_file(client):
    files = [("files", ("a.png", PNG, "image/png"))]
    assert error_message(client.post("/predict/strict", files=files), 400) == (
        "files[0] (a.png): model strict could not use it (the model decodes its images "
        "itself): Unknown image file format. One of JPEG, JPEG XL, PNG, GIF, BMP, WebP required."
    )
    message = error_message(
        client.post("/predict/strict", json={"instances": [b64(PNG), b64(PNG)]}), 400
    )
    assert message.startswith("model strict could not use one of the 2 images (the model")


def test_the_files_pixels_are_held_while_the_model_decodes_them(monkeypatch, backend):
    budgets: list[PixelBudget] = []
    hold = PixelBudget.hold

    def spying(self, pixels):
        budgets.append(self)
        return hold(self, pixels)

    monkeypatch.setattr(PixelBudget, "hold", spying)
    held = []

    def run(signature_name, inputs):
        held.append(budgets[-1].held)
        return first_byte_classes(signature_name, inputs)

    backend.models = {"resnet": FakeModel({"serving_default": IMAGE_BYTES}, run, LABELS)}
    with app_client(backend) as client:
        files = [("files", (f"{i}.png", PNG)) for i in range(3)]
        ok_json(client.post("/predict/resnet", files=files))
    assert held == [3 * 240] and budgets[-1].held == 0


# --- a regressor of several values -------------------------------------------------------


def test_a_premade_regressor_of_two_values_answers_each_as_a_list(client):
    body = {"instances": [{"x1": 1.0, "x2": 2.0}, {"x1": 4.0, "x2": -1.0}]}
    rows = ok_json(client.post("/predict/two_targets", json=body))["predictions"]
    assert rows == [{"value": [3.0, -9.0]}, {"value": [3.0, -6.0]}]
    rows = ok_json(client.post("/predict/regress_two", json={"instances": [{"x": 1.0}]}))
    assert rows["predictions"] == [{"value": [1.5, -2.0]}]


def test_a_single_output_of_probabilities_is_still_a_classifiers():
    form = model_form.describe(TWO_TARGETS)
    probabilities = np.array([[0.25, 0.75]], np.float32)
    (row,) = model_form.answer_rows(form, {"predictions": probabilities}, ("no", "yes"))
    assert row["label"] == "yes" and row["probabilities"] == {"no": 0.25, "yes": 0.75}


@pytest.mark.parametrize(
    "value, rows",
    [
        pytest.param(np.array([1.5, 2.0]), [1.5, 2.0], id="one-value"),
        pytest.param(np.array([[1.5], [2.0]]), [1.5, 2.0], id="one-value-in-a-row"),
        pytest.param(np.array([[1.5, 2.0, 3.0]]), [[1.5, 2.0, 3.0]], id="three-values"),
        pytest.param(np.arange(8.0).reshape(2, 2, 2), [[[0, 1], [2, 3]], [[4, 5], [6, 7]]],
                     id="a-matrix-each"),
    ],
)  # fmt: skip
def test_value_rows_are_a_number_or_the_instances_values(value, rows):
    answer = model_form.value_rows(value)
    assert [np.asarray(row["value"]).tolist() for row in answer] == rows
