"""The friendly /predict for any model (service/protocols/model_form.py, simple_predict.py;
the reading of what a person sends, service/codecs/simple_json.py): which
signature, what it takes (images of any size, named features, tf.Examples, tensors), how the
answer is shown (classifier, regressor, outputs), and the page's description of it.

Fast tier: signatures as typed values, models as numpy functions (support.fakes.AnyFakeBackend).
"""

from __future__ import annotations

import base64

import numpy as np
import pytest
from support.fakes import MODEL_NAME, AnyFakeBackend, FakeModel, app_client
from support.helpers import error_message, ok_json, png_bytes

from artifact.images import ImageInput, image_to_input
from service.codecs import simple_json, tf_example
from service.errors import BadInput
from service.protocols import model_form
from service.types import SignatureSpec, TensorSpec

FLOAT, DOUBLE, INT64, INT32 = (np.dtype(t) for t in (np.float32, np.float64, np.int64, np.int32))
STRING, BOOL = np.dtype(object), np.dtype(np.bool_)
PREDICT, CLASSIFY, REGRESS = (
    model_form.PREDICT_METHOD,
    model_form.CLASSIFY_METHOD,
    model_form.REGRESS_METHOD,
)
VOCABULARY = (b"high", b"low", b"mid")


def spec(name, dtype, *shape):
    return TensorSpec(name, dtype, shape)


# A pre-made LinearClassifier with label_vocabulary, through the raw receiver: only `predict`.
PREMADE = SignatureSpec(
    "predict",
    PREDICT,
    (spec("color", STRING, -1), spec("rooms", INT64, -1), spec("x1", FLOAT, -1)),
    (
        spec("all_class_ids", INT32, -1, 3),
        spec("all_classes", STRING, -1, 3),
        spec("class_ids", INT64, -1, 1),
        spec("classes", STRING, -1, 1),
        spec("logits", FLOAT, -1, 3),
        spec("probabilities", FLOAT, -1, 3),
    ),
)
REGRESSOR = SignatureSpec(
    "predict",
    PREDICT,
    (spec("city", STRING, -1), spec("x1", FLOAT, -1)),
    (spec("predictions", FLOAT, -1, 1),),
)
SHAPES = SignatureSpec(
    "serving_default",
    PREDICT,
    (spec("image", FLOAT, -1, 32, 32, 3),),
    (spec("classes", INT64, -1), spec("probabilities", FLOAT, -1, 3)),
)
CLASSIFY_EXAMPLES = SignatureSpec(
    "serving_default",
    CLASSIFY,
    (spec("inputs", STRING, -1),),
    (spec("classes", STRING, -1, 3), spec("scores", FLOAT, -1, 3)),
)
REGRESS_EXAMPLES = SignatureSpec(
    "serving_default", REGRESS, (spec("inputs", STRING, -1),), (spec("outputs", FLOAT, -1, 1),)
)
TOKENS = SignatureSpec(
    "serving_default",
    PREDICT,
    (spec("ids", INT64, -1), spec("words", STRING, -1)),
    (spec("doubled", INT64, -1), spec("upper", STRING, -1)),
)
SOFTMAX = SignatureSpec(
    "serving_default",
    PREDICT,
    (spec("pixels", FLOAT, -1, 8, 8, 1),),
    (spec("dense", FLOAT, -1, 4),),
)
RAGGED = SignatureSpec(
    "serving_default", PREDICT, (spec("x", FLOAT, -1, -1),), (spec("y", FLOAT, -1),)
)
FIXED = SignatureSpec("fixed", PREDICT, (spec("x", FLOAT, 3),), (spec("scaled", FLOAT, 3),))


def premade_answer(signature_name, inputs):
    """Probabilities from x1 and rooms, the pre-made head's other outputs from them."""
    x1, rooms = inputs["x1"].astype(np.float64), inputs["rooms"].astype(np.float64)
    logits = np.stack([x1, rooms / 3, -x1], axis=1)
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    ids = probabilities.argmax(axis=1)
    n = len(x1)
    return {
        "all_class_ids": np.tile(np.arange(3, dtype=np.int32), (n, 1)),
        "all_classes": np.array([list(VOCABULARY)] * n, dtype=object),
        "class_ids": ids[:, None].astype(np.int64),
        "classes": np.array([[VOCABULARY[i]] for i in ids], dtype=object),
        "logits": logits.astype(np.float32),
        "probabilities": probabilities.astype(np.float32),
    }


def shapes_answer(signature_name, inputs):
    """Class 0 for bright images, 1 for dark: from the mean pixel."""
    mean = inputs["image"].reshape(len(inputs["image"]), -1).mean(axis=1)
    probabilities = np.stack([mean, 1 - mean, np.zeros_like(mean)], axis=1).astype(np.float32)
    return {"classes": probabilities.argmax(axis=1), "probabilities": probabilities}


def examples_answer(signature_name, inputs):
    n = len(inputs["inputs"])
    if signature_name == "regression":
        return {"outputs": np.arange(n, dtype=np.float32)[:, None] + 0.5}
    scores = np.tile(np.array([[0.1, 0.7, 0.2]], np.float32), (n, 1))
    return {"classes": np.array([list(VOCABULARY)] * n, dtype=object), "scores": scores}


def refuse_int64_x1(signature_name, inputs):
    """What TensorFlow's ParseExample says of an int64 feature the model parses as float."""
    raise BadInput(
        "Name: <unknown>, Key: x1, Index: 0.  Data types don't match. Data type: int64 but "
        "expected type: float"
    )


MODELS = {
    "premade": FakeModel({"predict": PREMADE}, premade_answer, ("a", "b", "c")),
    "regressor": FakeModel(
        {"predict": REGRESSOR},
        lambda name, inputs: {"predictions": (inputs["x1"] * 2)[:, None]},
        ("0", "1", "2", "3", "4", "5", "6", "7", "8", "9"),
    ),
    "shapes": FakeModel({"serving_default": SHAPES}, shapes_answer, ("circle", "square", "tri")),
    "classifier_examples": FakeModel({"serving_default": CLASSIFY_EXAMPLES}, examples_answer),
    "regressor_examples": FakeModel(
        {"serving_default": REGRESS_EXAMPLES},
        lambda name, inputs: examples_answer("regression", inputs),
    ),
    "tokens": FakeModel(
        {"serving_default": TOKENS, "fixed": FIXED},
        lambda name, inputs: {
            "doubled": inputs["ids"] * 2,
            "upper": np.array([w.upper() for w in inputs["words"]], dtype=object),
        },
    ),
    "ragged": FakeModel(
        {"serving_default": RAGGED}, lambda name, inputs: {"y": inputs["x"].sum(1)}
    ),
    "typed_examples": FakeModel({"serving_default": REGRESS_EXAMPLES}, refuse_int64_x1),
    "two_predicts": FakeModel(
        {"a": REGRESSOR, "b": REGRESSOR}, lambda name, inputs: {"predictions": inputs["x1"]}
    ),
}


@pytest.fixture
def backend():
    return AnyFakeBackend(MODELS)


@pytest.fixture
def client(backend):
    with app_client(backend) as c:
        yield c


# --- which signature, and what it is ----------------------------------------------------


def test_the_default_signature_or_the_only_predict_one():
    assert model_form.choose_signature({"serving_default": SHAPES, "x": PREMADE}, "m") is SHAPES
    assert model_form.choose_signature({"predict": PREMADE}, "m") is PREMADE
    # A classify signature beside the one predict signature: predict is chosen.
    assert model_form.choose_signature({"predict": PREMADE, "c": CLASSIFY_EXAMPLES}, "m") is PREMADE
    with pytest.raises(BadInput, match=r"model m has no \"serving_default\" signature and 2"):
        model_form.choose_signature({"a": REGRESSOR, "b": REGRESSOR}, "m")
    with pytest.raises(BadInput, match="signature_name at /v1/models/m:predict"):
        model_form.choose_signature({"c": CLASSIFY_EXAMPLES}, "m")


@pytest.mark.parametrize(
    "signature, kind, task, fields",
    [
        pytest.param(PREMADE, "features", "classification",
                     {"probabilities": "probabilities", "class_names": "all_classes",
                      "class_ids": "class_ids"}, id="premade-classifier"),
        pytest.param(REGRESSOR, "features", "regression", {"value": "predictions"},
                     id="premade-regressor"),
        pytest.param(SHAPES, "image", "classification",
                     {"probabilities": "probabilities", "class_ids": "classes",
                      "class_names": None}, id="image-32x32x3"),
        pytest.param(CLASSIFY_EXAMPLES, "examples", "classification",
                     {"probabilities": "scores", "class_names": "classes", "class_ids": None},
                     id="classify-examples"),
        pytest.param(REGRESS_EXAMPLES, "examples", "regression", {"value": "outputs"},
                     id="regress-examples"),
        pytest.param(TOKENS, "features", "outputs", {}, id="tokens"),
        pytest.param(SOFTMAX, "image", "classification",
                     {"probabilities": "dense", "softmax_guess": True}, id="keras-softmax"),
        pytest.param(FIXED, "tensors", "outputs", {}, id="no-batch-dimension"),
        pytest.param(RAGGED, "tensors", "regression", {"value": "y"},
                     id="ragged-input-one-value-out"),
        pytest.param(
            SignatureSpec("s", PREDICT, (spec("x", FLOAT, -1, 28, 28, 4),),
                          (spec("y", FLOAT, -1, 2, 2),)),
            "features", "outputs", {}, id="four-channels-are-a-feature"),
    ],
)  # fmt: skip
def test_what_a_signature_is_to_a_person(signature, kind, task, fields):
    form = model_form.describe(signature)
    assert (form.kind, form.task) == (kind, task)
    for key, value in fields.items():
        assert getattr(form, key) == value, key
    assert not form.image_contract


def test_the_image_contract_is_recognised_and_described():
    from support.fakes import signature_specs

    form = model_form.describe(signature_specs()["serving_default"])
    assert form.image_contract and form.image == ImageInput(28, 28)
    assert form.to_json()["image"] == {
        "height": 28,
        "width": 28,
        "channels": 1,
        "shape": [28, 28],
        "preparation": "centred",
    }
    described = model_form.describe(PREMADE).to_json()
    assert described["features"] == [
        {"name": "color", "type": "string", "dtype": "object", "shape": []},
        {"name": "rooms", "type": "integer", "dtype": "int64", "shape": []},
        {"name": "x1", "type": "number", "dtype": "float32", "shape": []},
    ]


# --- features ----------------------------------------------------------------------------


def read_features(instances: list, form: model_form.ModelForm) -> dict:
    return simple_json.read_features(instances, form.features)


PREMADE_FORM = model_form.describe(PREMADE)
GOOD = {"color": "red", "rooms": 3, "x1": 1.5}


def test_features_take_the_signatures_types():
    inputs = read_features([GOOD, {"color": "é", "rooms": 2.0, "x1": 2}], PREMADE_FORM)
    assert inputs["color"].tolist() == [b"red", "é".encode()]
    assert inputs["rooms"].dtype == INT64 and inputs["rooms"].tolist() == [3, 2]
    assert inputs["x1"].dtype == FLOAT and inputs["x1"].tolist() == [1.5, 2.0]


VECTOR = model_form.describe(
    SignatureSpec("s", PREDICT, (spec("v", DOUBLE, -1, 2), spec("on", BOOL, -1, 1)), ())
)


def test_features_of_several_values_and_booleans():
    inputs = read_features([{"v": [1, 2.5], "on": True}, {"v": [0, 0], "on": [False]}], VECTOR)
    assert inputs["v"].shape == (2, 2) and inputs["v"].dtype == DOUBLE
    assert inputs["on"].tolist() == [[True], [False]]


@pytest.mark.parametrize(
    "instances, form, message",
    [
        pytest.param([{**GOOD, "x1": "1.5"}], PREMADE_FORM,
                     "instances[0].x1: expected a number (float32), got the string '1.5'",
                     id="string-for-a-number"),
        pytest.param([GOOD, {**GOOD, "rooms": 2.5}], PREMADE_FORM,
                     "instances[1].rooms: expected an integer (int64), got the number 2.5",
                     id="fraction-for-an-integer"),
        pytest.param([{**GOOD, "x1": True}], PREMADE_FORM,
                     "instances[0].x1: expected a number (float32), got the boolean true",
                     id="boolean-for-a-number"),
        pytest.param([{**GOOD, "color": 7}], PREMADE_FORM,
                     "instances[0].color: expected a string, got the number 7",
                     id="number-for-a-string"),
        pytest.param([{**GOOD, "x1": None}], PREMADE_FORM,
                     "instances[0].x1: expected a number (float32), got null", id="null"),
        pytest.param([{**GOOD, "rooms": 2**63}], PREMADE_FORM,
                     f"instances[0].rooms: {2**63} does not fit int64", id="past-int64"),
        pytest.param([{**GOOD, "x1": 1e39}], PREMADE_FORM,
                     "instances[0].x1: 1e+39 is too large for float32", id="past-float32"),
        pytest.param([{"color": "red", "x1": 1.0}], PREMADE_FORM,
                     "instances[0]: missing feature rooms (integer, int64); the model takes "
                     "color (string), rooms (integer, int64), x1 (number, float32)",
                     id="missing"),
        pytest.param([{**GOOD, "colour": "red"}], PREMADE_FORM,
                     "instances[0]: unknown feature 'colour'; the model takes color", id="unknown"),
        pytest.param([[1.5, 3, "red"]], PREMADE_FORM,
                     "instances[0]: expected an object naming the features, got a list of 3",
                     id="not-an-object"),
        pytest.param([{**GOOD, "x1": [1.5]}], PREMADE_FORM,
                     "instances[0].x1: expected one number, got a list of 1", id="list-for-one"),
        pytest.param([{"v": [1, 2, 3], "on": True}], VECTOR,
                     "instances[0].v: expected a list of 2 (the feature takes 2 values), "
                     "got a list of 3", id="wrong-length"),
        pytest.param([{"v": [1, [2]], "on": True}], VECTOR,
                     "instances[0].v[1]: expected a number (float64), got a list of 1",
                     id="nested-too-deep"),
        pytest.param([{"v": [1, 2], "on": 1}], VECTOR,
                     "instances[0].on: expected a boolean (true or false), got the number 1",
                     id="number-for-a-boolean"),
    ],
)  # fmt: skip
def test_features_that_do_not_fit_are_refused_naming_instance_and_feature(instances, form, message):
    with pytest.raises(BadInput) as caught:
        read_features(instances, form)
    assert message in caught.value.message


def test_a_category_outside_the_vocabulary_is_served(client, backend):
    rows = ok_json(
        client.post("/predict/premade", json={"instances": [{**GOOD, "color": "ultraviolet"}]})
    )["predictions"]
    assert len(rows) == 1
    ((_, _, inputs),) = backend.inputs
    assert inputs["color"].tolist() == [b"ultraviolet"]


# --- answers -----------------------------------------------------------------------------


def test_a_premade_classifier_answers_labels_from_its_vocabulary(client):
    instances = [GOOD, {"color": "blue", "rooms": 9, "x1": -2.0}]
    answer = ok_json(client.post("/predict/premade", json={"instances": instances}))
    assert answer["model_name"] == "premade" and answer["model_version"] == "1"
    want = premade_answer("predict", read_features(instances, PREMADE_FORM))
    for row, probabilities, class_id in zip(
        answer["predictions"], want["probabilities"], want["class_ids"][:, 0], strict=True
    ):
        assert row["class_id"] == class_id
        assert row["label"] == VOCABULARY[class_id].decode()
        assert list(row["probabilities"]) == ["high", "low", "mid"]  # not labels.txt's a, b, c
        assert list(row["probabilities"].values()) == pytest.approx(probabilities.tolist())
    assert {row["label"] for row in answer["predictions"]} == {"high", "low"}


def answer(form, outputs, labels=()):
    return model_form.answer_rows(form, outputs, labels)


def test_class_names_that_are_only_ids_give_way_to_labels_txt():
    outputs = premade_answer("predict", read_features([GOOD], PREMADE_FORM))
    outputs["all_classes"] = np.array([[b"0", b"1", b"2"]], dtype=object)
    (row,) = answer(PREMADE_FORM, outputs, ("cat", "dog", "eel"))
    assert list(row["probabilities"]) == ["cat", "dog", "eel"]
    (row,) = answer(PREMADE_FORM, outputs, ("too", "few"))
    assert list(row["probabilities"]) == ["0", "1", "2"]


def test_labels_come_from_labels_txt_else_class_ids():
    form = model_form.describe(SHAPES)
    outputs = {"classes": np.array([1]), "probabilities": np.array([[0.2, 0.7, 0.1]], np.float32)}
    (row,) = answer(form, outputs, ("circle", "square", "tri"))
    assert row == {
        "class_id": 1,
        "label": "square",
        "probabilities": {"circle": pytest.approx(0.2), "square": pytest.approx(0.7),
                          "tri": pytest.approx(0.1)},
    }  # fmt: skip
    (row,) = answer(form, outputs, tuple("0123456789"))  # another width: the digits' fallback
    assert row["label"] == "1" and list(row["probabilities"]) == ["0", "1", "2"]


def test_a_single_probability_vector_is_a_classifier_only_while_it_holds_probabilities():
    form = model_form.describe(SOFTMAX)
    probabilities = np.array([[0.1, 0.6, 0.2, 0.1]], np.float32)
    (row,) = answer(form, {"dense": probabilities}, ("a", "b", "c", "d"))
    assert row["label"] == "b" and row["class_id"] == 1
    logits = np.array([[-3.0, 4.0, 1.0, 0.0]], np.float32)
    # Not probabilities: each instance's values (a regressor's of several values, say).
    (row,) = answer(form, {"dense": logits}, ("a", "b", "c", "d"))
    assert list(row) == ["value"] and row["value"].tolist() == logits[0].tolist()


def test_regressors_answer_values_and_anything_else_as_tf_serving_renders_it():
    form = model_form.describe(REGRESSOR)
    assert answer(form, {"predictions": np.array([[1.5], [2.0]], np.float32)}) == [
        {"value": 1.5},
        {"value": 2.0},
    ]
    rows = answer(
        model_form.describe(TOKENS),
        {"doubled": np.array([2, 4]), "upper": np.array([b"AB", b"C"], dtype=object)},
    )
    assert rows == [{"doubled": 2, "upper": "AB"}, {"doubled": 4, "upper": "C"}]


def test_regressor_and_tokens_through_the_app(client):
    answer = ok_json(
        client.post("/predict/regressor", json={"instances": [{"city": "x", "x1": 2}]})
    )
    assert answer["predictions"] == [{"value": 4.0}]
    rows = ok_json(client.post("/predict/tokens", json={"instances": [{"ids": 3, "words": "ab"}]}))
    assert rows["predictions"] == [{"doubled": 6, "upper": "AB"}]
    # Any other signature: TF Serving's row and columnar formats.
    rows = ok_json(client.post("/predict/ragged", json={"instances": [[1, 2, 3], [4, 5, 6]]}))
    assert rows["predictions"] == [{"value": 6.0}, {"value": 15.0}]
    rows = ok_json(client.post("/predict/ragged", json={"inputs": {"x": [[1, 2]]}}))
    assert rows["predictions"] == [{"value": 3.0}]


# --- tf.Examples -------------------------------------------------------------------------


def test_a_parsing_receivers_model_takes_features_as_tf_examples(client, backend):
    instances = [{"x1": 1.5, "rooms": 3, "color": "red"}, {"x1": 0.5, "rooms": 1, "color": "b"}]
    answer = ok_json(client.post("/predict/classifier_examples", json={"instances": instances}))
    assert [row["label"] for row in answer["predictions"]] == ["low", "low"]
    assert list(answer["predictions"][0]["probabilities"]) == ["high", "low", "mid"]
    ((_, signature_name, inputs),) = backend.inputs
    assert signature_name == "serving_default"
    assert inputs["inputs"].tolist() == [
        tf_example.encode_example({"x1": ("float", [1.5]), "rooms": ("int64", [3]),
                                 "color": ("bytes", [b"red"])}),
        tf_example.encode_example({"x1": ("float", [0.5]), "rooms": ("int64", [1]),
                                 "color": ("bytes", [b"b"])}),
    ]  # fmt: skip
    answer = ok_json(client.post("/predict/regressor_examples", json={"instances": instances}))
    assert answer["predictions"] == [{"value": 0.5}, {"value": 1.5}]


def test_a_feature_of_another_type_than_the_model_parses_says_how_to_write_it(client):
    message = error_message(
        client.post("/predict/typed_examples", json={"instances": [{"x1": 1}]}), 400
    )
    assert message.startswith("Name: <unknown>, Key: x1, Index: 0.  Data types don't match.")
    assert message.endswith("so write 1.0 for a float feature")


def test_an_example_feature_no_tf_example_holds_is_named(client):
    body = {"instances": [{"x1": 1.5}, {"x1": {"nested": 1}}]}
    message = error_message(client.post("/predict/classifier_examples", json=body), 400)
    assert message.startswith("instances[1].x1: a feature's values are strings")


# --- images of any size ------------------------------------------------------------------

RNG = np.random.default_rng(0)
PHOTO = RNG.integers(0, 256, (40, 30, 3)).astype(np.uint8)
SHAPES_INPUT = ImageInput(32, 32, 3, channel_axis=True)


def test_an_image_model_takes_uploads_resized_as_its_training_data(client, backend):
    files = [("files", ("photo.png", png_bytes(PHOTO), "image/png"))]
    (row,) = ok_json(client.post("/predict/shapes?include_pixels=true", files=files))["predictions"]
    want = image_to_input(png_bytes(PHOTO), SHAPES_INPUT)
    ((_, _, inputs),) = backend.inputs
    np.testing.assert_array_equal(inputs["image"], want[np.newaxis])
    assert row["file"] == "photo.png"
    assert np.array(row["pixels"]).shape == (32, 32, 3)
    np.testing.assert_array_equal(row["pixels"], np.rint(want * 255))
    assert row["label"] == ("circle" if want.mean() > 0.5 else "square")


def test_an_image_model_takes_pixel_arrays_and_base64_files(client, backend):
    pixels = RNG.integers(0, 256, (32, 32, 3))
    floats = np.full((32, 32, 3), 0.25)
    b64 = {"b64": base64.b64encode(png_bytes(PHOTO)).decode()}
    body = {"instances": [pixels.tolist(), b64, floats.tolist()]}
    rows = ok_json(client.post("/predict/shapes", json=body))["predictions"]
    assert len(rows) == 3 and "pixels" not in rows[0]
    ((_, _, inputs),) = backend.inputs
    np.testing.assert_array_equal(inputs["image"][0], (pixels / 255).astype(np.float32))
    np.testing.assert_array_equal(
        inputs["image"][1], image_to_input(png_bytes(PHOTO), SHAPES_INPUT)
    )
    np.testing.assert_array_equal(inputs["image"][2], floats.astype(np.float32))


@pytest.mark.parametrize(
    "instances, message",
    [
        pytest.param([np.zeros((28, 28)).tolist()],
                     "instances[0]: expected a 32x32x3 array of pixels (integers 0-255 or floats "
                     'in [0, 1]) or {"b64": "<base64 image file>"}, got shape 28x28', id="shape"),
        pytest.param([np.full((32, 32, 3), 256).tolist()],
                     "instances[0]: integer pixels must be 0-255", id="range"),
        pytest.param([np.zeros((32, 32, 3)).tolist(), np.full((32, 32, 3), 1.5).tolist()],
                     "instances[1]: float pixels must be in [0, 1]", id="float-range"),
        pytest.param([[[[True, 0, 0]] * 32] * 32], "instances[0][0][0][0]: expected a number, "
                     "got a boolean", id="boolean"),
        pytest.param([[[["a", 0, 0]] * 32] * 32], "got a ragged list, or one holding more than "
                     "numbers", id="string"),
        pytest.param(["pixels"], "got the string 'pixels'", id="a-string"),
        pytest.param([{"b64": "@@"}], "instances[0].b64: not valid base64", id="bad-base64"),
        pytest.param([{"b64": base64.b64encode(b"text").decode()}],
                     "instances[0]: not an image file", id="not-an-image"),
        pytest.param([{"url": "x"}], "instances[0]: expected an array of pixels or", id="object"),
    ],
)  # fmt: skip
def test_image_instances_that_do_not_fit(client, instances, message):
    assert message in error_message(
        client.post("/predict/shapes", json={"instances": instances}), 400
    )


@pytest.mark.parametrize(
    "path, kwargs, status, message",
    [
        pytest.param("/predict/nope", {"json": {"instances": [GOOD]}}, 404,
                     "Servable not found for request: Latest(nope)", id="unknown-model"),
        pytest.param("/predict/premade",
                     {"files": [("files", ("a.png", png_bytes(PHOTO), "image/png"))]}, 400,
                     "model premade takes named features, not image files", id="files-to-features"),
        pytest.param("/predict/two_predicts", {"json": {"instances": [GOOD]}}, 400,
                     "no \"serving_default\" signature and 2 predict signatures", id="no-choice"),
        pytest.param("/predict/premade", {"json": {"instances": []}}, 400,
                     "instances: is empty", id="empty"),
        pytest.param("/predict/premade", {"json": {"instances": {"x1": 1}}}, 400,
                     "instances: expected a list, one item per instance, got an object",
                     id="not-a-list"),
        pytest.param("/predict/premade", {"json": [GOOD]}, 400,
                     'the body must be a JSON object with "instances"', id="not-an-object"),
        pytest.param("/predict/premade", {"json": {"instances": [GOOD] * 17}}, 413,
                     "request has 17 images; the limit is 16", id="too-many"),
        pytest.param("/predict/premade", {"content": b"{"}, 400, "JSON Parse error", id="json"),
        pytest.param("/predict/ragged", {"json": {"instances": [[1.0, "x"]]}},
                     400, "Failed to process element: 0 of 'instances' list", id="tensors"),
    ],
)  # fmt: skip
def test_refusals(client, path, kwargs, status, message):
    assert message in error_message(client.post(path, **kwargs), status)


def test_the_default_model_keeps_its_answer_at_both_routes(client):
    pixels = RNG.integers(0, 256, (2, 28, 28)).astype(int).tolist()
    default = client.post("/predict", json={"instances": pixels})
    named = client.post(f"/predict/{MODEL_NAME}", json={"instances": pixels})
    assert default.status_code == named.status_code == 200
    assert default.content == named.content


# --- the page's description ---------------------------------------------------------------


def test_the_page_describes_each_model(client, backend):
    assert ok_json(client.get("/page/models"))["models"][0] == MODEL_NAME
    premade = ok_json(client.get("/page/models/premade"))
    assert premade["ready"] is True and premade["model_version"] == "1"
    assert premade["form"]["kind"] == "features" and premade["form"]["task"] == "classification"
    assert premade["form"]["signature_name"] == "predict"
    shapes = ok_json(client.get("/page/models/shapes"))["form"]
    assert shapes["image"]["preparation"] == "resized" and shapes["image"]["shape"] == [32, 32, 3]
    problem = ok_json(client.get("/page/models/two_predicts"))
    assert problem["form"] is None and "cannot choose" in problem["problem"]
    assert "Could not find" in error_message(client.get("/page/models/nope"), 404)
    backend.started = False
    waiting = ok_json(client.get("/page/models/premade"))
    assert waiting["ready"] is False and waiting["form"] is None and waiting["reason"]


def test_openapi_documents_the_model_route(client):
    paths = ok_json(client.get("/openapi.json"))["paths"]
    operation = paths["/predict/{name}"]["post"]
    assert [p["name"] for p in operation["parameters"]] == ["name", "invert", "include_pixels"]
    assert "multipart/form-data" in operation["requestBody"]["content"]
    assert {"400", "404", "413"} <= set(operation["responses"])
    assert "/page/models/{name}" in paths
