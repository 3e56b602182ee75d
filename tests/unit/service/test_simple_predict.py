"""The friendly /predict decodes image files off the event loop (service/protocols/
simple_predict.py): where a file is decoded follows from what the body's JSON holds once read,
not from how its bytes are spelled. A `"b64"` key written with JSON escapes
(`"\\u0062\\u0036\\u0034"`) once moved the decoding of every such file onto the event loop,
stalling every other client (#33, finding 7).

Fast tier: the app over fakes; where each file was decoded is recorded by the decoder.
"""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
from support.fakes import MODEL_NAME, AnyFakeBackend, FakeModel, app_client
from support.helpers import ok_json, png_bytes

from service.codecs import images, pixels
from service.types import SignatureSpec, TensorSpec

FLOAT, INT64 = np.dtype(np.float32), np.dtype(np.int64)
# An image model of another shape than the image contract's: decoded by image_file_input.
SMALL = SignatureSpec(
    "serving_default",
    "tensorflow/serving/predict",
    (TensorSpec("pixels", FLOAT, (-1, 8, 8)),),
    (TensorSpec("classes", INT64, (-1,)), TensorSpec("probabilities", FLOAT, (-1, 2))),
)


def small_answer(signature_name, inputs):
    mean = inputs["pixels"].reshape(len(inputs["pixels"]), -1).mean(axis=1)
    probabilities = np.stack([mean, 1 - mean], axis=1).astype(np.float32)
    return {"classes": probabilities.argmax(axis=1), "probabilities": probabilities}


# (the model, the decoder its files go through)
MODELS = [
    pytest.param(MODEL_NAME, "image_file_pixels", id="the-image-contract"),
    pytest.param("small", "image_file_input", id="another-image-model"),
]
KEYS = [
    pytest.param('"b64"', id="plain-key"),
    pytest.param('"\\u0062\\u0036\\u0034"', id="escaped-key"),
    pytest.param('"b\\u0036\\u0034"', id="partly-escaped-key"),
]


@pytest.fixture(scope="module")
def client():
    backend = AnyFakeBackend({"small": FakeModel({"serving_default": SMALL}, small_answer)})
    with app_client(backend) as c:
        yield c


def where_it_runs(function, ran_on: list[str]):
    """`function`, recording where each call ran: the event loop, or a worker thread."""

    def recording(*args):
        try:
            asyncio.get_running_loop()
            ran_on.append("the event loop")
        except RuntimeError:
            ran_on.append("a worker thread")
        return function(*args)

    return recording


def body_with_key(key: str) -> bytes:
    """A small body (well under INLINE_PARSE_BYTES) of one PNG, its `b64` key as given."""
    png = base64.b64encode(png_bytes(np.full((28, 28), 200, np.uint8))).decode()
    return f'{{"instances": [{{{key}: "{png}"}}]}}'.encode()


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("model, decoder", MODELS)
def test_image_files_are_decoded_off_the_event_loop_however_their_key_is_spelled(
    client, monkeypatch, model, decoder, key
):
    ran_on: list[str] = []
    monkeypatch.setattr(images, decoder, where_it_runs(getattr(images, decoder), ran_on))
    answer = ok_json(client.post(f"/predict/{model}", content=body_with_key(key)))
    assert len(answer["predictions"]) == 1
    assert ran_on == ["a worker thread"]


@pytest.mark.parametrize("model, decoder", MODELS)
def test_an_escaped_key_is_answered_as_the_plain_one(client, model, decoder):
    plain = client.post(f"/predict/{model}", content=body_with_key('"b64"'))
    escaped = client.post(f"/predict/{model}", content=body_with_key('"\\u0062\\u0036\\u0034"'))
    assert (escaped.status_code, escaped.content) == (plain.status_code, plain.content)
    assert plain.status_code == 200


@pytest.mark.parametrize(
    "model, reader",
    [
        pytest.param(MODEL_NAME, "pixel_images", id="the-image-contract"),
        pytest.param("small", "pixel_array", id="another-image-model"),
    ],
)
def test_pixel_arrays_alone_are_read_on_the_event_loop(client, monkeypatch, model, reader):
    """No file, no thread hop: a few pixel arrays cost less than one."""
    ran_on: list[str] = []
    monkeypatch.setattr(pixels, reader, where_it_runs(getattr(pixels, reader), ran_on))
    size = 28 if model == MODEL_NAME else 8
    body = {"instances": [np.zeros((size, size), int).tolist()]}
    assert len(ok_json(client.post(f"/predict/{model}", json=body))["predictions"]) == 1
    assert ran_on == ["the event loop"]
