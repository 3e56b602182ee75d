"""End to end against a real `python -m service` process: every endpoint, every client error.

The server (tests/live/service/conftest.py) serves a copy of the session's trained model with
MAX_IMAGES=16 and MAX_BODY_BYTES=200000, so the limit tests stay cheap.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.helpers import error_message, ok_json, png_bytes
from support.servers import MAX_BODY_BYTES, MAX_IMAGES, MODEL_NAME

from artifact import idx as data
from artifact.contract import FASHION_MNIST_LABELS

MODEL = f"/v1/models/{MODEL_NAME}"
PREDICT = f"{MODEL}:predict"
GRAY = [[0.5] * 28] * 28  # a valid model input (floats in [0, 1])
BLACK = [[0] * 28] * 28  # a valid /predict image (integer pixels)
SHORT = [[0.5] * 28] * 27  # one row missing


# --- helpers ------------------------------------------------------------------------------


def probabilities_of(body: dict) -> np.ndarray:
    """The [n, 10] probabilities of a /predict answer, in label order."""
    return np.array(
        [
            [row["probabilities"][label] for label in FASHION_MNIST_LABELS]
            for row in body["predictions"]
        ]
    )


def check_friendly_answer(body: dict, count: int) -> None:
    """The shape every /predict answer has: model, version and one labelled row per image."""
    assert body["model_name"] == MODEL_NAME
    assert body["model_version"] == "1"
    assert len(body["predictions"]) == count
    for row in body["predictions"]:
        assert isinstance(row["class_id"], int) and 0 <= row["class_id"] < 10
        assert row["label"] == FASHION_MNIST_LABELS[row["class_id"]]
        assert list(row["probabilities"]) == list(FASHION_MNIST_LABELS)
        values = np.array(list(row["probabilities"].values()))
        assert np.all(values >= 0)
        assert values.sum() == pytest.approx(1.0, abs=1e-4)
        assert row["label"] == max(row["probabilities"], key=row["probabilities"].get)


def check_row(row: dict) -> None:
    """One TF Serving row-format prediction: {"classes": int, "probabilities": [10 floats]}."""
    assert set(row) == {"classes", "probabilities"}
    assert isinstance(row["classes"], int)
    assert len(row["probabilities"]) == 10
    assert sum(row["probabilities"]) == pytest.approx(1.0, abs=1e-4)
    assert row["classes"] == int(np.argmax(row["probabilities"]))


def b64(data_bytes: bytes) -> dict:
    return {"b64": base64.b64encode(data_bytes).decode("ascii")}


def metric(text: str, sample_name: str, **labels: str) -> float:
    """The value of one Prometheus sample (0 when it does not exist yet)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == sample_name and all(
                sample.labels.get(k) == v for k, v in labels.items()
            ):
                return sample.value
    return 0.0


def metrics_text(client: httpx.Client) -> str:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


@pytest.fixture(scope="module")
def samples(trained_model) -> np.ndarray:
    """3 real Fashion-MNIST test images (uint8 [3, 28, 28]) with a dark border, as the data set
    has it (so invert=auto leaves them as they are)."""
    _, images, _ = data.load_split(trained_model.data_dir, "test")
    borders = [np.concatenate([im[0], im[-1], im[:, 0], im[:, -1]]).mean() for im in images]
    chosen = [i for i, border in enumerate(borders) if border < 64][:3]
    assert len(chosen) == 3
    return images[chosen]


@pytest.fixture(scope="module")
def reference(trained_model, samples) -> tuple[np.ndarray, np.ndarray]:
    """(classes, probabilities) from the SavedModel's serving signature, called directly."""
    import tensorflow as tf

    loaded = tf.saved_model.load(str(trained_model.version_path))
    outputs = loaded.signatures["serving_default"](image=tf.constant(samples / 255.0, tf.float32))
    probabilities = outputs["probabilities"].numpy()
    # A service that answered a constant would pass a comparison with a constant reference.
    assert np.abs(probabilities[0] - probabilities[1]).max() > 1e-3
    return outputs["classes"].numpy(), probabilities


# --- operations ---------------------------------------------------------------------------


def test_healthz(client):
    assert ok_json(client.get("/healthz")) == {"status": "ok"}


def test_readyz_names_model_version_and_device(client):
    assert ok_json(client.get("/readyz")) == {
        "status": "ready",
        "model": MODEL_NAME,
        "version": "1",
        "device": "/CPU:0",
    }


def test_docs_and_openapi(client):
    docs = client.get("/docs")
    assert docs.status_code == 200
    assert "swagger" in docs.text.lower()
    paths = ok_json(client.get("/openapi.json"))["paths"]
    for path in (
        "/predict",
        "/v1/models/{name}",
        "/v1/models/{name}/versions/{version}",
        "/v1/models/{name}/metadata",
        "/v1/models/{name}/versions/{version}/metadata",
        "/v1/models/{name}:predict",
        "/v1/models/{name}/versions/{version}:predict",
    ):
        assert path in paths, sorted(paths)
    assert "post" in paths["/predict"]
    assert "post" in paths["/v1/models/{name}:predict"]


def test_metrics(client, samples):
    before = metrics_text(client)
    assert client.get("/healthz").status_code == 200
    assert client.get("/v1/models/nope").status_code == 404
    answer = ok_json(client.post("/predict", json={"instances": samples[:2].tolist()}))
    after = metrics_text(client)

    def delta(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    requests = "http_requests_total"
    assert delta(requests, route="/healthz", method="GET", status="200") == 1
    assert delta(requests, route="/v1/models/{name}", method="GET", status="404") == 1
    assert delta(requests, route="/predict", method="POST", status="200") == 1
    assert metric(after, requests, route="/metrics", method="GET", status="200") >= 1

    assert "# TYPE http_request_duration_seconds histogram" in after
    latency = "http_request_duration_seconds"
    assert delta(f"{latency}_count", route="/predict") == 1
    assert metric(after, f"{latency}_sum", route="/predict") > 0
    assert metric(after, f"{latency}_bucket", route="/predict", le="+Inf") == metric(
        after, f"{latency}_count", route="/predict"
    )
    buckets = [
        s.value
        for f in text_string_to_metric_families(after)
        for s in f.samples
        if s.name == f"{latency}_bucket" and s.labels["route"] == "/predict"
    ]
    assert len(buckets) > 2 and buckets == sorted(buckets)

    labels = [row["label"] for row in answer["predictions"]]
    for label in set(labels):
        assert delta("predictions_total", model=MODEL_NAME, label=label) == labels.count(label)
    total = sum(
        delta("predictions_total", model=MODEL_NAME, label=label) for label in FASHION_MNIST_LABELS
    )
    assert total == 2
    assert delta("images_per_request_count") == 1
    assert metric(after, "model_version", model=MODEL_NAME, device="/CPU:0") == 1


# --- TF Serving REST API: status and metadata ---------------------------------------------

AVAILABLE_1 = {
    "model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
    ]
}


@pytest.mark.parametrize("path", [MODEL, f"{MODEL}/versions/1"])
def test_model_status(client, path):
    assert ok_json(client.get(path)) == AVAILABLE_1


@pytest.mark.parametrize("path", [f"{MODEL}/metadata", f"{MODEL}/versions/1/metadata"])
def test_model_metadata(client, path):
    body = ok_json(client.get(path))
    assert body["model_spec"] == {"name": MODEL_NAME, "signature_name": "", "version": "1"}
    assert body["device"] == "/CPU:0"
    signatures = body["metadata"]["signature_def"]["signature_def"]
    assert set(signatures) == {"serving_default", "classify"}
    for signature in signatures.values():
        assert signature["method_name"] == "tensorflow/serving/predict"
        (name,) = signature["inputs"]
        assert name == "image"
        image = signature["inputs"]["image"]
        assert image["dtype"] == "DT_FLOAT"
        assert [d["size"] for d in image["tensor_shape"]["dim"]] == ["-1", "28", "28"]
        outputs = signature["outputs"]
        assert set(outputs) == {"classes", "probabilities"}
        assert outputs["classes"]["dtype"] == "DT_INT64"
        assert [d["size"] for d in outputs["classes"]["tensor_shape"]["dim"]] == ["-1"]
        assert outputs["probabilities"]["dtype"] == "DT_FLOAT"
        sizes = [d["size"] for d in outputs["probabilities"]["tensor_shape"]["dim"]]
        assert sizes == ["-1", "10"]


# --- TF Serving REST API: predict ---------------------------------------------------------


def test_predict_row_format(client, samples, reference):
    floats = (samples / 255.0).tolist()
    body = ok_json(client.post(PREDICT, json={"instances": floats}))
    assert set(body) == {"predictions", "model_version"}
    assert len(body["predictions"]) == 3
    for row in body["predictions"]:
        check_row(row)
    classes, probabilities = reference
    assert [row["classes"] for row in body["predictions"]] == classes.tolist()
    got = np.array([row["probabilities"] for row in body["predictions"]])
    np.testing.assert_allclose(got, probabilities, atol=1e-5)

    named = ok_json(client.post(PREDICT, json={"instances": [{"image": im} for im in floats]}))
    assert named == body


@pytest.mark.parametrize("named", [False, True], ids=["tensor", "named"])
def test_predict_columnar_format(client, samples, reference, named):
    floats = (samples / 255.0).tolist()
    inputs = {"image": floats} if named else floats
    body = ok_json(client.post(PREDICT, json={"inputs": inputs}))
    assert set(body) == {"outputs", "model_version"}
    assert set(body["outputs"]) == {"classes", "probabilities"}
    classes, probabilities = reference
    assert body["outputs"]["classes"] == classes.tolist()
    np.testing.assert_allclose(body["outputs"]["probabilities"], probabilities, atol=1e-5)


@pytest.mark.parametrize(
    "path, signature",
    [
        (PREDICT, "classify"),
        (PREDICT, "serving_default"),
        (f"{MODEL}/versions/1:predict", None),
        (f"{MODEL}/versions/1:predict", "classify"),
    ],
)
def test_predict_signature_and_version(client, samples, reference, path, signature):
    request = {"instances": (samples / 255.0).tolist()}
    if signature is not None:
        request["signature_name"] = signature
    body = ok_json(client.post(path, json=request))
    for row in body["predictions"]:
        check_row(row)
    got = np.array([row["probabilities"] for row in body["predictions"]])
    np.testing.assert_allclose(got, reference[1], atol=1e-5)


# --- /predict -----------------------------------------------------------------------------


def test_friendly_predict_integer_and_float_pixels(client, samples, reference):
    ints = ok_json(client.post("/predict", json={"instances": samples.tolist()}))
    check_friendly_answer(ints, 3)
    assert "file" not in ints["predictions"][0]
    floats = ok_json(client.post("/predict", json={"instances": (samples / 255.0).tolist()}))
    check_friendly_answer(floats, 3)
    np.testing.assert_allclose(probabilities_of(ints), reference[1], atol=1e-5)
    np.testing.assert_allclose(probabilities_of(floats), reference[1], atol=1e-5)
    assert [row["class_id"] for row in ints["predictions"]] == reference[0].tolist()


def test_friendly_predict_reads_any_content_type_as_json(client, samples):
    # `curl -d @body.json` sends application/x-www-form-urlencoded.
    response = client.post(
        "/predict",
        content=json.dumps({"instances": samples[:1].tolist()}),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    check_friendly_answer(ok_json(response), 1)


def test_friendly_predict_b64_png(client, samples, reference):
    instances = [b64(png_bytes(im)) for im in samples]
    for invert in ("auto", "no"):
        body = ok_json(client.post(f"/predict?invert={invert}", json={"instances": instances}))
        check_friendly_answer(body, 3)
        np.testing.assert_allclose(probabilities_of(body), reference[1], atol=1e-5)
    # b64 and pixel instances may be mixed in one request.
    mixed = ok_json(
        client.post("/predict", json={"instances": [instances[0], samples[1].tolist()]})
    )
    np.testing.assert_allclose(probabilities_of(mixed), reference[1][:2], atol=1e-5)


def test_friendly_predict_reads_each_image_on_its_own(client, samples, reference):
    """Integer pixels in one instance do not change how another's floats are read."""
    floats = (samples[1] / 255.0).tolist()
    alone = [ok_json(client.post("/predict", json={"instances": [x]})) for x in
             (samples[0].tolist(), floats)]  # fmt: skip
    together = ok_json(client.post("/predict", json={"instances": [samples[0].tolist(), floats]}))
    expected = np.concatenate([probabilities_of(answer) for answer in alone])
    np.testing.assert_allclose(probabilities_of(together), expected, atol=1e-5)
    np.testing.assert_allclose(probabilities_of(together), reference[1][:2], atol=1e-5)


def test_empty_signature_name_means_the_default(client, samples, reference):
    body = {"signature_name": "", "instances": (samples[:1] / 255.0).tolist()}
    answer = ok_json(client.post(f"{MODEL}:predict", json=body))
    rows = np.array([row["probabilities"] for row in answer["predictions"]])
    np.testing.assert_allclose(rows, reference[1][:1], atol=1e-5)


def test_friendly_predict_png_uploads(client, samples, reference):
    files = [
        ("files", (f"image{i}.png", png_bytes(im), "image/png")) for i, im in enumerate(samples)
    ]
    body = ok_json(client.post("/predict", files=files))
    check_friendly_answer(body, 3)
    assert [row["file"] for row in body["predictions"]] == [
        "image0.png",
        "image1.png",
        "image2.png",
    ]
    np.testing.assert_allclose(probabilities_of(body), reference[1], atol=1e-5)


def test_friendly_predict_single_upload(client, samples, reference):
    files = {"files": ("one.png", png_bytes(samples[0]), "image/png")}
    body = ok_json(client.post("/predict", files=files))
    check_friendly_answer(body, 1)
    assert body["predictions"][0]["file"] == "one.png"
    np.testing.assert_allclose(probabilities_of(body), reference[1][:1], atol=1e-5)


def test_friendly_predict_inverts_dark_on_light_uploads(client, samples, reference):
    """A dark object on white (a product photo) is inverted back to Fashion-MNIST's look."""
    files = [
        ("files", (f"{i}.png", png_bytes(255 - im), "image/png")) for i, im in enumerate(samples)
    ]
    auto = ok_json(client.post("/predict", files=files))
    np.testing.assert_allclose(probabilities_of(auto), reference[1], atol=1e-5)
    forced = ok_json(client.post("/predict?invert=yes", files=files))
    np.testing.assert_allclose(probabilities_of(forced), reference[1], atol=1e-5)
    kept = ok_json(client.post("/predict?invert=no", files=files))
    assert not np.allclose(probabilities_of(kept), reference[1], atol=1e-3)


def test_friendly_predict_resizes_any_image(client):
    rows, cols = np.mgrid[0:60, 0:100]
    rgb = np.stack([rows * 4, cols * 2, (rows + cols) % 256], axis=-1).astype(np.uint8)
    gray = ((rows * cols) % 256).astype(np.uint8)
    files = [
        ("files", ("photo.png", png_bytes(rgb), "image/png")),
        ("files", ("photo.jpg", png_bytes(rgb, "JPEG"), "image/jpeg")),
        ("files", ("gray.png", png_bytes(gray), "image/png")),
    ]
    body = ok_json(client.post("/predict", files=files))
    check_friendly_answer(body, 3)
    assert [row["file"] for row in body["predictions"]] == ["photo.png", "photo.jpg", "gray.png"]


def test_consistency_across_every_input_path(client, samples, reference):
    """One set of images, five ways in: the same probabilities each time."""
    floats = (samples / 255.0).tolist()
    pngs = [png_bytes(im) for im in samples]
    tf_serving = ok_json(client.post(PREDICT, json={"instances": floats}))
    answers = {
        ":predict": np.array([row["probabilities"] for row in tf_serving["predictions"]]),
        "/predict ints": probabilities_of(
            ok_json(client.post("/predict", json={"instances": samples.tolist()}))
        ),
        "/predict upload": probabilities_of(
            ok_json(
                client.post(
                    "/predict",
                    files=[("files", (f"{i}.png", p, "image/png")) for i, p in enumerate(pngs)],
                )
            )
        ),
        "/predict b64": probabilities_of(
            ok_json(client.post("/predict", json={"instances": [b64(p) for p in pngs]}))
        ),
    }
    for path, probabilities in answers.items():
        assert probabilities.shape == (3, 10), path
        np.testing.assert_allclose(probabilities, reference[1], atol=1e-5, err_msg=path)


# --- errors -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One client error: the request, the status it must get, what the message must say."""

    id: str
    method: str
    path: str
    status: int
    says: tuple[str, ...]
    request: Callable[[], dict] = field(default=dict)


def raw(text: str) -> Callable[[], dict]:
    return lambda: {"content": text.encode(), "headers": {"content-type": "application/json"}}


def body(obj) -> Callable[[], dict]:
    return lambda: {"json": obj}


def replace_first(obj, old: str, new: str) -> Callable[[], dict]:
    """A JSON body with one number replaced by a literal json.dumps would not write."""
    return raw(json.dumps(obj).replace(old, new, 1))


def oversized_chunked() -> dict:
    """A body without Content-Length (chunked) that grows past MAX_BODY_BYTES."""

    def chunks():
        yield b'{"instances": ['
        for _ in range(MAX_BODY_BYTES // 10_000 + 5):
            yield b" " * 10_000
        yield b"]}"

    return {"content": chunks(), "headers": {"content-type": "application/json"}}


def upload(*names_and_bytes: tuple[str, bytes]) -> Callable[[], dict]:
    return lambda: {
        "files": [("files", (name, content, "image/png")) for name, content in names_and_bytes]
    }


TINY_PNG = png_bytes(np.zeros((28, 28), np.uint8))
OVERSIZED_BODY = b'{"instances": [' + b" " * (MAX_BODY_BYTES + 1000) + b"]}"
LIMIT = str(MAX_BODY_BYTES)

ERROR_CASES = [
    # Unknown model or version: 404.
    Case(
        "unknown-model-predict",
        "POST",
        "/v1/models/nope:predict",
        404,
        ("nope",),
        body({"instances": [GRAY]}),
    ),
    Case(
        "unknown-model-version-predict",
        "POST",
        "/v1/models/nope/versions/1:predict",
        404,
        ("nope",),
        body({"instances": [GRAY]}),
    ),
    Case("unknown-model-status", "GET", "/v1/models/nope", 404, ("nope",)),
    Case("unknown-model-metadata", "GET", "/v1/models/nope/metadata", 404, ("nope",)),
    Case(
        "unknown-version-predict",
        "POST",
        f"{MODEL}/versions/7:predict",
        404,
        ("7",),
        body({"instances": [GRAY]}),
    ),
    Case("unknown-version-status", "GET", f"{MODEL}/versions/7", 404, ("7",)),
    Case("unknown-version-metadata", "GET", f"{MODEL}/versions/7/metadata", 404, ("7",)),
    Case("version-zero", "GET", f"{MODEL}/versions/0", 404, ("0",)),
    # A version that is not a plain non-negative integer: 400.
    Case(
        "version-word-predict",
        "POST",
        f"{MODEL}/versions/abc:predict",
        400,
        ("version", "abc"),
        body({"instances": [GRAY]}),
    ),
    Case("version-word-status", "GET", f"{MODEL}/versions/abc", 400, ("version", "abc")),
    Case("version-word-metadata", "GET", f"{MODEL}/versions/abc/metadata", 400, ("version", "abc")),
    Case("version-negative", "GET", f"{MODEL}/versions/-1", 400, ("version", "-1")),
    Case(
        "version-float",
        "POST",
        f"{MODEL}/versions/1.0:predict",
        400,
        ("version",),
        body({"instances": [GRAY]}),
    ),
    Case("version-superscript-digit", "GET", f"{MODEL}/versions/%C2%B2", 400, ("version",)),
    Case("version-fullwidth-digit", "GET", f"{MODEL}/versions/%EF%BC%91", 400, ("version",)),
    # Bodies that are not JSON, or not the JSON TF Serving expects: 400.
    Case("malformed-json", "POST", PREDICT, 400, ("JSON",), raw('{"instances": [[')),
    Case(
        "truncated-json",
        "POST",
        PREDICT,
        400,
        ("JSON",),
        raw(json.dumps({"instances": [GRAY]})[:-7]),
    ),
    Case("not-json", "POST", PREDICT, 400, ("JSON",), raw("instances=1")),
    Case("empty-body", "POST", PREDICT, 400, ("empty",), raw("")),
    Case("top-level-array", "POST", PREDICT, 400, ("JSON object",), body([GRAY])),
    Case(
        "instances-and-inputs",
        "POST",
        PREDICT,
        400,
        ("both",),
        body({"instances": [GRAY], "inputs": [GRAY]}),
    ),
    Case(
        "neither-instances-nor-inputs",
        "POST",
        PREDICT,
        400,
        ("neither",),
        body({"signature_name": "serving_default"}),
    ),
    Case(
        "wrong-shape",
        "POST",
        PREDICT,
        400,
        ("instances[1]: expected", "(27, 28)"),
        body({"instances": [GRAY, SHORT]}),
    ),
    Case(
        "wrong-shape-named",
        "POST",
        PREDICT,
        400,
        ("instances[1]: expected", "(27, 28)"),
        body({"instances": [{"image": GRAY}, {"image": SHORT}]}),
    ),
    Case(
        "wrong-shape-columnar",
        "POST",
        PREDICT,
        400,
        ("inputs[0]", "(27, 28)"),
        body({"inputs": {"image": [SHORT]}}),
    ),
    Case(
        "strings",
        "POST",
        PREDICT,
        400,
        ("instances[0][0][0]", "str"),
        body({"instances": [[["a"] * 28] * 28]}),
    ),
    Case(
        "string-instance",
        "POST",
        PREDICT,
        400,
        ("instances[0]", "str"),
        body({"instances": ["an image"]}),
    ),
    Case(
        "booleans",
        "POST",
        PREDICT,
        400,
        ("instances[0][0][0]", "bool"),
        body({"instances": [[[True] * 28] * 28]}),
    ),
    Case(
        "nulls",
        "POST",
        PREDICT,
        400,
        ("instances[0][0][0]",),
        body({"instances": [[[None] * 28] * 28]}),
    ),
    Case(
        "one-image-not-a-list-of-images",
        "POST",
        PREDICT,
        400,
        ("instances[0]", "(28,)"),
        body({"instances": GRAY}),
    ),
    Case(
        "too-deeply-nested",
        "POST",
        PREDICT,
        400,
        ("instances[0]", "(1, 28, 28)"),
        body({"instances": [[GRAY]]}),
    ),
    Case("instances-a-number", "POST", PREDICT, 400, ("instances",), body({"instances": 5})),
    Case("empty-instances", "POST", PREDICT, 400, ("empty",), body({"instances": []})),
    Case("empty-inputs", "POST", PREDICT, 400, ("empty",), body({"inputs": []})),
    Case(
        "wrong-input-name",
        "POST",
        PREDICT,
        400,
        ("instances[0]", "'image'"),
        body({"instances": [{"img": GRAY}]}),
    ),
    Case(
        "missing-input-name",
        "POST",
        PREDICT,
        400,
        # TF Serving reads only the signature's input from a columnar object: a missing one is
        # an error, another key is not (tests/unit/service/test_tfserving_conformance.py).
        ("Missing named input: image", "'inputs'"),
        body({"inputs": {"x": [GRAY]}}),
    ),
    Case(
        "unknown-signature",
        "POST",
        PREDICT,
        400,
        ("nope",),
        body({"instances": [GRAY], "signature_name": "nope"}),
    ),
    Case(
        "signature-not-a-string",
        "POST",
        PREDICT,
        400,
        ("signature_name",),
        body({"instances": [GRAY], "signature_name": 5}),
    ),
    Case(
        "inf-in-float64",
        "POST",
        PREDICT,
        400,
        ("JSON",),
        replace_first({"instances": [GRAY]}, "0.5", "1e400"),
    ),
    # Limits: 413 with the limit in the message.
    Case(
        "too-many-images",
        "POST",
        PREDICT,
        413,
        (str(MAX_IMAGES), "MAX_IMAGES"),
        body({"instances": [BLACK] * (MAX_IMAGES + 1)}),
    ),
    Case(
        "body-too-large",
        "POST",
        PREDICT,
        413,
        (LIMIT, "MAX_BODY_BYTES"),
        lambda: {"content": OVERSIZED_BODY},
    ),
    Case(
        "body-too-large-chunked", "POST", PREDICT, 413, (LIMIT, "MAX_BODY_BYTES"), oversized_chunked
    ),
    # The friendly /predict.
    Case(
        "pixels-over-255",
        "POST",
        "/predict",
        400,
        ("instances[0]", "0-255"),
        body({"instances": [[[300] * 28] * 28]}),
    ),
    Case(
        "negative-pixels",
        "POST",
        "/predict",
        400,
        ("instances[1]", "0-255"),
        body({"instances": [BLACK, [[-1] * 28] * 28]}),
    ),
    Case(
        "float-pixels-over-1",
        "POST",
        "/predict",
        400,
        ("instances[0]", "[0, 1]"),
        body({"instances": [[[1.5] * 28] * 28]}),
    ),
    Case(
        "float-pixels-inf-in-float32",
        "POST",
        "/predict",
        400,
        ("instances[0]", "finite"),
        body({"instances": [[[1e39] * 28] * 28]}),
    ),
    Case(
        "friendly-nan",
        "POST",
        "/predict",
        400,
        ("JSON",),
        replace_first({"instances": [GRAY]}, "0.5", "NaN"),
    ),
    Case(
        "friendly-wrong-shape",
        "POST",
        "/predict",
        400,
        ("instances[0]", "(27, 28)"),
        body({"instances": [SHORT]}),
    ),
    Case(
        "friendly-no-instances", "POST", "/predict", 400, ("instances",), body({"inputs": [BLACK]})
    ),
    Case("friendly-malformed-json", "POST", "/predict", 400, ("JSON",), raw('{"instances": [')),
    Case(
        "invert-bogus",
        "POST",
        "/predict?invert=bogus",
        400,
        ("invert", "bogus"),
        body({"instances": [BLACK]}),
    ),
    Case(
        "b64-not-base64",
        "POST",
        "/predict",
        400,
        ("instances[0]", "base64"),
        body({"instances": [{"b64": "!!not base64!!"}]}),
    ),
    Case(
        "b64-not-an-image",
        "POST",
        "/predict",
        400,
        ("instances[1]", "image"),
        body({"instances": [BLACK, b64(b"hello, world")]}),
    ),
    Case(
        "mixed-b64-then-short-array",
        "POST",
        "/predict",
        400,
        ("instances[1]: expected", "(27, 28)"),
        body({"instances": [b64(TINY_PNG), SHORT]}),
    ),
    Case(
        "b64-extra-key",
        "POST",
        "/predict",
        400,
        ("instances[0]", "b64"),
        body({"instances": [{**b64(TINY_PNG), "x": 1}]}),
    ),
    Case(
        "upload-not-an-image",
        "POST",
        "/predict",
        400,
        ("files[0]", "notes.txt"),
        upload(("notes.txt", b"just some text")),
    ),
    Case(
        "second-upload-not-an-image",
        "POST",
        "/predict",
        400,
        ("files[1]", "notes.txt"),
        upload(("a.png", TINY_PNG), ("notes.txt", b"just some text")),
    ),
    Case(
        "truncated-png",
        "POST",
        "/predict",
        400,
        ("files[0]", "cut.png"),
        upload(("cut.png", TINY_PNG[:40])),
    ),
    Case(
        "multipart-without-files",
        "POST",
        "/predict",
        400,
        ("files",),
        lambda: {"data": {"note": "no files"}, "files": {"note2": (None, b"x")}},
    ),
    Case(
        "multipart-without-boundary",
        "POST",
        "/predict",
        400,
        ("multipart",),
        lambda: {"content": b"x", "headers": {"content-type": "multipart/form-data"}},
    ),
    Case(
        "friendly-too-many-images",
        "POST",
        "/predict",
        413,
        (str(MAX_IMAGES), "MAX_IMAGES"),
        body({"instances": [BLACK] * (MAX_IMAGES + 1)}),
    ),
    Case(
        # The count is checked before any image is decoded: these b64 items are not images.
        "friendly-too-many-b64-images",
        "POST",
        "/predict",
        413,
        (str(MAX_IMAGES), "MAX_IMAGES"),
        body({"instances": [{"b64": "bm90IGFuIGltYWdl"}] * (MAX_IMAGES + 1)}),
    ),
    Case(
        "version-out-of-int64-range",
        "POST",
        f"/v1/models/{MODEL_NAME}/versions/{'9' * 300}:predict",
        400,
        ("version", "out of range"),
        body({"instances": [GRAY]}),
    ),
    Case(
        "version-status-out-of-int64-range",
        "GET",
        f"/v1/models/{MODEL_NAME}/versions/{2**63}",
        400,
        ("version", "out of range"),
        lambda: {},
    ),
    Case(
        "huge-photo-upload",
        "POST",
        "/predict",
        400,
        ("files[0]", "megapixels"),
        upload(("huge.png", png_bytes(np.zeros((5000, 5000), np.uint8)))),
    ),
    Case(
        "one-upload-too-many",
        "POST",
        "/predict",
        413,
        (str(MAX_IMAGES), "MAX_IMAGES"),
        upload(*[(f"{i}.png", TINY_PNG) for i in range(MAX_IMAGES + 1)]),
    ),
    Case(
        "many-uploads-too-many",
        "POST",
        "/predict",
        413,
        (str(MAX_IMAGES), "MAX_IMAGES"),
        upload(*[(f"{i}.png", TINY_PNG) for i in range(3 * MAX_IMAGES)]),
    ),
    Case(
        "upload-body-too-large",
        "POST",
        "/predict",
        413,
        (LIMIT, "MAX_BODY_BYTES"),
        upload(("big.png", TINY_PNG + b"\0" * MAX_BODY_BYTES)),
    ),
    Case(
        "friendly-body-too-large",
        "POST",
        "/predict",
        413,
        (LIMIT, "MAX_BODY_BYTES"),
        lambda: {"content": OVERSIZED_BODY},
    ),
    # Routing.
    Case("unknown-route", "GET", "/nope", 404, ("Not Found",)),
    Case("wrong-method", "GET", "/predict", 405, ("Method Not Allowed",)),
]


def send(client: httpx.Client, case: Case) -> httpx.Response:
    return client.request(case.method, case.path, **case.request())


# TF Serving reads NaN and Infinity literals and values past float32's range (as inf) and
# passes them to the model (tensorflow_serving/util/json_tensor.cc): so does this service,
# unless STRICT_NUMBERS (tests/unit/service/test_tfserving_settings.py).
@pytest.mark.parametrize(
    ("content", "images"),
    [
        pytest.param(replace_first({"instances": [GRAY]}, "0.5", "NaN"), 1, id="nan-literal"),
        pytest.param(replace_first({"instances": [GRAY]}, "0.5", "Infinity"), 1, id="infinity"),
        pytest.param(body({"instances": [GRAY, SHORT + [[1e39] * 28]]}), 2, id="past-float32"),
        pytest.param(body({"inputs": [[[-1e39] * 28] * 28]}), 1, id="past-minus-float32"),
    ],
)
def test_non_finite_numbers_reach_the_model(client, content, images):
    response = client.post(PREDICT, **content())
    assert response.status_code == 200, response.text
    answer = response.json()  # Python's json reads the NaN TF Serving writes
    rows = answer.get("predictions") or answer["outputs"]["probabilities"]
    assert len(rows) == images


@pytest.mark.parametrize("case", ERROR_CASES, ids=[c.id for c in ERROR_CASES])
def test_client_error(client, case):
    message = error_message(send(client, case), case.status)
    for fragment in case.says:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_service_survives_client_errors_and_logs_them_below_error(client, server, samples):
    for case in ERROR_CASES:
        assert send(client, case).status_code == case.status, case.id
    body = ok_json(client.post(PREDICT, json={"instances": (samples / 255.0).tolist()}))
    assert len(body["predictions"]) == 3
    assert ok_json(client.get("/readyz"))["status"] == "ready"

    log = server.log()
    bad = [
        line
        for line in log.splitlines()
        if re.search(r"\b(ERROR|WARNING|CRITICAL)\b|Traceback|Exception|Warning:", line)
    ]
    assert not bad, "\n".join(bad)
    # Client errors are logged, at INFO.
    assert re.search(r"INFO service: POST /v1/models/fashion_mnist:predict -> 400: ", log)
    assert re.search(r"INFO service: POST /predict -> 413: ", log)
