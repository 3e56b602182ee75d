"""The friendly /predict/{model} for models of other contracts than Fashion-MNIST's, served
side by side from one model config by a real `python -m service` (conftest's `any_server`):
every answer held against `tf.saved_model.load` in this process, value for value.

The models (tests/support/any_models.py): a pre-made LinearClassifier with label_vocabulary
and a string categorical behind a raw receiver (only `predict`), the same through a parsing
receiver (tf.Examples), a DNNRegressor both ways, a CNN on 32x32x3 images trained on an image
folder, and a tf.Module with int64 and string inputs.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tensorflow as tf
from support.any_models import CITY_ROWS, ROWS
from support.helpers import error_message, ok_json, png_bytes
from support.tf_reference import columns, reference, serialized

from artifact.images import ImageInput, image_to_input
from artifact.repository import read_labels

TIMEOUT = 60.0
SHAPES_INPUT = ImageInput(32, 32, 3, channel_axis=True)
RNG = np.random.default_rng(0)


@pytest.fixture(scope="module")
def client(any_server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=any_server.url, timeout=TIMEOUT) as c:
        yield c


@pytest.fixture(scope="module")
def loaded(any_models):
    """Each model's SavedModel loaded in this process: the reference answers."""
    return {name: tf.saved_model.load(str(path / "1")) for name, path in any_models.items()}


def predict(client, model: str, body: dict | None = None, **kwargs) -> dict:
    return ok_json(client.post(f"/predict/{model}", json=body, **kwargs))


def assert_classified(rows: list[dict], probabilities: np.ndarray, names, class_ids) -> None:
    """Each row: the class id, its name and every probability by name, as TensorFlow's."""
    assert len(rows) == len(probabilities)
    for row, p, row_names, class_id in zip(rows, probabilities, names, class_ids, strict=True):
        row_names = [n.decode() if isinstance(n, bytes) else n for n in row_names]
        assert row["class_id"] == class_id
        assert row["label"] == row_names[class_id]
        assert list(row["probabilities"]) == row_names
        np.testing.assert_array_equal(np.array(list(row["probabilities"].values()), np.float32), p)


# --- tabular -------------------------------------------------------------------------------


def test_a_premade_classifier_answers_its_vocabularys_labels(client, loaded):
    answer = predict(client, "classifier", {"instances": ROWS})
    assert answer["model_name"] == "classifier" and answer["model_version"] == "1"
    want = reference(loaded, "classifier", "predict", **columns(ROWS))
    assert_classified(
        answer["predictions"], want["probabilities"], want["all_classes"], want["class_ids"][:, 0]
    )
    assert {row["label"] for row in answer["predictions"]} <= {"high", "low", "mid"}
    # /predict is the default model's: the config's first.
    assert ok_json(client.post("/predict", json={"instances": ROWS})) == answer


def test_a_regressor_answers_its_value(client, loaded):
    answer = predict(client, "regressor", {"instances": CITY_ROWS})
    want = reference(loaded, "regressor", "predict", **columns(CITY_ROWS))["predictions"][:, 0]
    values = np.array([row["value"] for row in answer["predictions"]], np.float32)
    np.testing.assert_array_equal(values, want)
    assert list(answer["predictions"][0]) == ["value"]


def test_parsing_receivers_take_the_same_features_as_tf_examples(client, loaded):
    answer = predict(client, "classifier_examples", {"instances": ROWS})
    want = reference(loaded, "classifier_examples", "serving_default", inputs=serialized(ROWS))
    assert_classified(
        answer["predictions"], want["scores"], want["classes"], want["scores"].argmax(axis=1)
    )
    # The same checkpoint as `classifier`'s, through the other receiver: the same answer.
    raw = predict(client, "classifier", {"instances": ROWS})["predictions"]
    assert [r["label"] for r in answer["predictions"]] == [r["label"] for r in raw]
    answer = predict(client, "regressor_examples", {"instances": CITY_ROWS})
    want = reference(loaded, "regressor_examples", "serving_default", inputs=serialized(CITY_ROWS))
    values = np.array([row["value"] for row in answer["predictions"]], np.float32)
    np.testing.assert_array_equal(values, want["outputs"][:, 0])


def test_a_model_of_named_tensors_answers_as_tf_serving_renders(client, loaded):
    answer = predict(
        client, "tokens", {"instances": [{"ids": 4, "words": "ab"}, {"ids": -1, "words": "é"}]}
    )
    want = reference(
        loaded,
        "tokens",
        "serving_default",
        ids=np.array([4, -1], np.int64),
        words=np.array([b"ab", "é".encode()], dtype=object),
    )
    rows = answer["predictions"]
    assert [row["doubled"] for row in rows] == want["doubled"].tolist()
    assert [row["upper"] for row in rows] == [w.decode() for w in want["upper"]]
    assert [base64.b64decode(row["echo_bytes"]["b64"]) for row in rows] == list(want["echo_bytes"])


# --- images --------------------------------------------------------------------------------


def test_a_32x32x3_model_takes_uploads_base64_and_pixel_arrays(client, loaded, any_models):
    photos = [RNG.integers(0, 256, (40, 30, 3)).astype(np.uint8) for _ in range(2)]
    photos[1][:, :, 1:] = 0  # a red one
    files = [("files", (f"{i}.png", png_bytes(p), "image/png")) for i, p in enumerate(photos)]
    prepared = np.stack([image_to_input(png_bytes(p), SHAPES_INPUT) for p in photos])
    want = reference(loaded, "shapes", "serving_default", image=prepared)
    labels = read_labels(any_models["shapes"] / "1")
    assert labels is not None and len(labels) == 3

    uploaded = predict(client, "shapes?include_pixels=true", files=files)["predictions"]
    assert [row["file"] for row in uploaded] == ["0.png", "1.png"]
    assert_classified(uploaded, want["probabilities"], [labels] * 2, want["classes"])
    for row, image in zip(uploaded, prepared, strict=True):
        np.testing.assert_array_equal(row["pixels"], np.rint(image * 255))

    b64 = [{"b64": base64.b64encode(png_bytes(p)).decode()} for p in photos]
    rows = predict(client, "shapes", {"instances": b64})["predictions"]
    assert_classified(rows, want["probabilities"], [labels] * 2, want["classes"])

    pixels = RNG.integers(0, 256, (32, 32, 3))
    rows = predict(client, "shapes", {"instances": [pixels.tolist()]})["predictions"]
    want = reference(
        loaded, "shapes", "serving_default", image=(pixels / 255).astype(np.float32)[None]
    )
    assert_classified(rows, want["probabilities"], [labels], want["classes"])


# --- bad input -----------------------------------------------------------------------------

BAD = [
    pytest.param("classifier", {"instances": [{**ROWS[0], "x1": "half"}]}, 400,
                 "instances[0].x1: expected a number (float32), got the string 'half'",
                 id="string-for-a-number"),
    pytest.param("classifier", {"instances": [ROWS[0], {**ROWS[1], "rooms": 1.5}]}, 400,
                 "instances[1].rooms: expected an integer (int64), got the number 1.5",
                 id="fraction-for-an-integer"),
    pytest.param("classifier", {"instances": [{k: v for k, v in ROWS[0].items() if k != "x2"}]},
                 400, "instances[0]: missing feature x2 (number, float32); the model takes "
                 "color (string), rooms (integer, int64), x1 (number, float32), x2 (number, "
                 "float32)", id="missing"),
    pytest.param("classifier", {"instances": [{**ROWS[0], "size": 3}]}, 400,
                 "instances[0]: unknown feature 'size'", id="unknown"),
    pytest.param("classifier", {"instances": [[0.5, 4.0, 3, "red"]]}, 400,
                 "instances[0]: expected an object naming the features", id="a-list"),
    pytest.param("shapes", {"instances": [np.zeros((28, 28)).tolist()]}, 400,
                 "instances[0]: expected a 32x32x3 array of pixels", id="image-shape"),
    pytest.param("shapes", {"instances": [np.full((32, 32, 3), 300).tolist()]}, 400,
                 "instances[0]: integer pixels must be 0-255", id="pixel-range"),
    pytest.param("regressor_examples", {"instances": [{**CITY_ROWS[0], "x1": 1}]}, 400,
                 "so write 1.0 for a float feature", id="int-for-a-float-example"),
    pytest.param("nope", {"instances": ROWS}, 404,
                 "Servable not found for request: Latest(nope)", id="unknown-model"),
]  # fmt: skip


@pytest.mark.parametrize("model, body, status, fragment", BAD)
def test_bad_input_is_refused_naming_what_and_where(client, model, body, status, fragment):
    assert fragment in error_message(client.post(f"/predict/{model}", json=body), status)


def test_image_files_sent_to_a_tabular_model_are_refused(client):
    files = [("files", ("a.png", png_bytes(np.zeros((8, 8), np.uint8)), "image/png"))]
    message = error_message(client.post("/predict/regressor", files=files), 400)
    assert message.startswith("model regressor takes named features, not image files")
