"""The whole app over a fake backend (Starlette's TestClient, no TensorFlow): every route's
rendering, every error body, the metrics, and the queries the door's routes read."""

from __future__ import annotations

import base64
import threading

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.fakes import (
    MODEL_NAME,
    FakeBackend,
    GatedFakeBackend,
    app_client,
    threaded_server,
    toy_model,
    wait_until,
)
from support.helpers import error_message, ok_json, png_bytes

from artifact.contract import FASHION_MNIST_LABELS
from service.app import create_app
from service.settings import Settings

V1 = f"/v1/models/{MODEL_NAME}"
RNG = np.random.default_rng(0)
PIXELS = RNG.integers(0, 256, (3, 28, 28)).astype(np.uint8)
FLOATS = (PIXELS / 255.0).astype(np.float32)


@pytest.fixture
def backend():
    return FakeBackend(versions=(1, 2))


@pytest.fixture
def client(backend):
    with app_client(backend) as c:
        yield c


def expected(version, images):
    return toy_model(version, np.asarray(images, np.float32))


def metric(client, name: str, **labels) -> float:
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def test_operations(client):
    assert ok_json(client.get("/healthz")) == {"status": "ok"}
    assert ok_json(client.get("/readyz")) == {
        "status": "ready",
        "model": MODEL_NAME,
        "version": "2",
        "device": "/CPU:0",
    }


def test_not_ready_says_why():
    backend = FakeBackend(versions=())
    backend.reason = "no version under models/fashion_mnist"
    with app_client(backend) as client:
        assert error_message(client.get("/readyz"), 503) == (
            "not ready: no version under models/fashion_mnist"
        )
        message = error_message(
            client.post(f"{V1}:predict", json={"instances": FLOATS.tolist()}), 503
        )
        assert "no version under" in message


def test_status_and_metadata_render_as_tf_serving(client):
    assert ok_json(client.get(V1)) == {
        "model_version_status": [
            {
                "version": v,
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
            for v in ("2", "1")
        ]
    }
    assert [
        s["version"] for s in ok_json(client.get(f"{V1}/versions/1"))["model_version_status"]
    ] == ["1"]
    metadata = ok_json(client.get(f"{V1}/versions/1/metadata"))
    assert metadata["model_spec"] == {"name": MODEL_NAME, "signature_name": "", "version": "1"}
    assert metadata["metadata"]["signature_def"]["serving_default"] == {"version": 1.0}
    assert metadata["device"] == "/CPU:0"
    assert ok_json(client.get(f"{V1}/metadata"))["model_spec"]["version"] == "2"


def test_predict_row_and_columnar_formats(client):
    rows = ok_json(client.post(f"{V1}:predict", json={"instances": FLOATS.tolist()}))["predictions"]
    want = expected(2, FLOATS)
    assert [r["classes"] for r in rows] == want["classes"].tolist()
    np.testing.assert_allclose([r["probabilities"] for r in rows], want["probabilities"], atol=1e-6)
    named = [{"image": image} for image in FLOATS.tolist()]
    columnar = ok_json(
        client.post(f"{V1}/versions/1:predict", json={"inputs": {"image": FLOATS.tolist()}})
    )["outputs"]
    assert columnar["classes"] == expected(1, FLOATS)["classes"].tolist()
    rows = ok_json(client.post(f"{V1}:predict", json={"instances": named}))["predictions"]
    assert [r["classes"] for r in rows] == want["classes"].tolist()


def test_friendly_predict_json_b64_and_uploads(client):
    want = expected(2, FLOATS)
    answer = ok_json(client.post("/predict", json={"instances": PIXELS.astype(int).tolist()}))
    assert answer["model_name"] == MODEL_NAME and answer["model_version"] == "2"
    rows = answer["predictions"]
    assert [r["class_id"] for r in rows] == want["classes"].tolist()
    assert [r["label"] for r in rows] == [FASHION_MNIST_LABELS[c] for c in want["classes"]]
    assert list(rows[0]["probabilities"]) == list(FASHION_MNIST_LABELS)

    b64 = [{"b64": base64.b64encode(png_bytes(p)).decode()} for p in PIXELS]
    rows = ok_json(client.post("/predict?invert=no", json={"instances": b64}))["predictions"]
    assert [r["class_id"] for r in rows] == want["classes"].tolist()

    files = [("files", (f"{i}.png", png_bytes(p), "image/png")) for i, p in enumerate(PIXELS)]
    rows = ok_json(client.post("/predict?invert=no", files=files))["predictions"]
    assert [r["file"] for r in rows] == ["0.png", "1.png", "2.png"]
    assert [r["class_id"] for r in rows] == want["classes"].tolist()


CLIENT_ERRORS = [
    pytest.param("POST", "/v1/models/other:predict", {"instances": FLOATS.tolist()}, 404,
                 "Servable not found for request: Latest(other)", id="unknown-model"),
    pytest.param("POST", f"{V1}/versions/9:predict", {"instances": FLOATS.tolist()}, 404,
                 f"Servable not found for request: Specific({MODEL_NAME}, 9)", id="unknown-version"),
    pytest.param("POST", f"{V1}/versions/²:predict", {"instances": FLOATS.tolist()}, 400,
                 "version must be a non-negative integer, got '²'", id="unicode-digit-version"),
    pytest.param("GET", f"{V1}/versions/99999999999999999999", None, 400,
                 "out of range (int64)", id="version-past-int64"),
    pytest.param("GET", "/v1/models/other", None, 404,
                 "Could not find any versions of model other", id="unknown-model-status"),
    pytest.param("POST", f"{V1}:predict", {"instances": FLOATS[:1, :27].tolist()}, 400,
                 "instances[0]: expected a 28x28 array of numbers, got shape (27, 28)", id="shape"),
    pytest.param("POST", f"{V1}:predict", {"instances": [[["x"] * 28] * 28]}, 400,
                 "instances[0][0][0]: expected a number, got str 'x'", id="string-pixel"),
    pytest.param("POST", f"{V1}:predict", {"inputs": [], "instances": []}, 400,
                 "it has both", id="both-formats"),
    pytest.param("POST", f"{V1}:predict", {"instances": FLOATS.tolist(), "signature_name": "x"},
                 400, 'signature name: "x" not found', id="unknown-signature"),
    pytest.param("POST", f"{V1}:predict", {"instances": np.zeros((17, 28, 28)).tolist()}, 413,
                 "request has 17 images; the limit is 16 per request (MAX_IMAGES)", id="count"),
    pytest.param("POST", "/predict", {"instances": [[[300] * 28] * 28]}, 400,
                 "instances[0]: integer pixels must be 0-255", id="pixel-range"),
    pytest.param("POST", "/predict", {"instances": [PIXELS[0].tolist(), [[1.5] * 28] * 28]}, 400,
                 "instances[1]: float pixels must be in [0, 1]", id="float-range-second"),
    pytest.param("POST", "/predict", {"instances": [{"b64": "@@"}]}, 400,
                 "instances[0].b64: not valid base64", id="bad-base64"),
    pytest.param("POST", "/predict", {"instances": [{"b64": base64.b64encode(b"text").decode()}]},
                 400, "instances[0]: not an image file", id="not-an-image"),
    pytest.param("POST", "/predict?invert=maybe", {"instances": []}, 400,
                 "invert: expected one of auto, yes, no, got 'maybe'", id="invert"),
]  # fmt: skip


@pytest.mark.parametrize("method, path, body, status, fragment", CLIENT_ERRORS)
def test_client_errors(client, method, path, body, status, fragment):
    response = client.request(method, path, json=body)
    assert fragment in error_message(response, status)


def test_bodies_over_the_limit_are_refused_before_they_are_read(client):
    body = b"[" + b"0," * 150_000 + b"0]"
    message = error_message(client.post(f"{V1}:predict", content=body), 413)
    assert "the limit is 200000 bytes (MAX_BODY_BYTES)" in message


def test_metrics_count_requests_by_route_template(client, backend):
    for _ in range(3):
        client.post(f"{V1}:predict", json={"instances": FLOATS.tolist()})
    client.post(f"{V1}/versions/7:predict", json={"instances": FLOATS.tolist()})
    client.post("/predict", json={"instances": PIXELS.astype(int).tolist()})
    template = "/v1/models/{name}:predict"
    assert metric(client, "http_requests_total", route=template, status="200") == 3
    assert (
        metric(
            client,
            "http_requests_total",
            route="/v1/models/{name}/versions/{version}:predict",
            status="404",
        )
        == 1
    )
    assert metric(client, "http_requests_total", route="/predict", status="200") == 1
    classes = list(expected(2, FLOATS)["classes"])
    assert len(set(classes)) > 1, "the toy model must not answer one class for everything"
    for class_id in set(classes):
        # Three :predict requests and one /predict with the same images (the 404 counts none).
        count = metric(client, "predictions_total", label=FASHION_MNIST_LABELS[class_id])
        assert count == 4 * classes.count(class_id)
    assert metric(client, "images_per_request_count") == 4
    assert metric(client, "model_version", model=MODEL_NAME, device="/CPU:0") == 2


def test_metrics_count_made_up_methods_under_one_label(client):
    # A client's own method names must not grow the label set without bound.
    for method in ("BREW", "X-ONE", "X-TWO"):
        client.request(method, f"{V1}:predict")
    client.request("GET", f"{V1}:predict")
    template = "/v1/models/{name}:predict"
    assert metric(client, "http_requests_total", route=template, method="other") == 3
    assert metric(client, "http_requests_total", route=template, method="GET") == 1
    assert metric(client, "http_requests_total", method="BREW") == 0


@pytest.mark.parametrize(
    "query, with_pixels",
    [
        ("", False),
        ("?include_pixels=true", True),
        ("?include_pixels=YES", True),
        ("?include_pixels=0", False),
        ("?include_pixels=off&invert=no", False),
        ("?invert=no&invert=yes&include_pixels=1", True),
        ("?include_pixels=maybe", None),
        ("?include_pixels=", None),
        ("?invert=bogus", None),
        ("?unknown=1", False),
    ],
)
def test_predict_reads_its_query_with_pydantics_boolean_words(backend, query, with_pixels):
    """/predict's query is read by its handler alone, with the words FastAPI's Query(bool)
    took, so clients written against it keep working."""
    body = {"instances": PIXELS[:2].astype(int).tolist()}
    with app_client(backend) as client:
        response = client.post(f"/predict{query}", json=body)
    if with_pixels is None:
        message = error_message(response, 400)
        assert message.split(":")[0] in ("query.include_pixels", "invert"), message
    else:
        rows = ok_json(response)["predictions"]
        assert len(rows) == 2
        assert all(("pixels" in row) == with_pixels for row in rows)


def test_openapi_lists_every_route(client):
    paths = ok_json(client.get("/openapi.json"))["paths"]
    for path in (
        "/healthz",
        "/readyz",
        "/metrics",
        "/predict",
        "/v1/models/{name}",
        "/v1/models/{name}/versions/{version}",
        "/v1/models/{name}/metadata",
        "/v1/models/{name}/versions/{version}/metadata",
        "/v1/models/{name}:predict",
        "/v1/models/{name}/versions/{version}:predict",
    ):
        assert path in paths, path


# --- labels, rollout and TF Serving's URL rules ---------------------------------------------


@pytest.fixture
def labeled():
    backend = FakeBackend(versions=(1, 2, 3))
    backend.labels = {"stable": 2, "canary": 3}
    with app_client(backend) as c:
        yield c


def test_labels_in_urls_and_every_answer_says_which_version_answered(labeled):
    body = {"instances": FLOATS.tolist()}
    assert ok_json(labeled.post(f"{V1}:predict", json=body))["model_version"] == "2"
    assert ok_json(labeled.post(f"{V1}/labels/canary:predict", json=body))["model_version"] == "3"
    assert (
        ok_json(labeled.post(f"{V1}/versions/1:predict", json={"inputs": FLOATS.tolist()}))[
            "model_version"
        ]
        == "1"
    )
    assert ok_json(labeled.get(f"{V1}/labels/canary/metadata"))["model_spec"]["version"] == "3"
    # TF Serving's model status reads no label: every version (get_model_status_impl.cc).
    status = ok_json(labeled.get(f"{V1}/labels/stable"))["model_version_status"]
    assert [s["version"] for s in status] == ["3", "2", "1"]
    assert (
        ok_json(labeled.post("/predict", json={"instances": PIXELS[:1].astype(int).tolist()}))[
            "model_version"
        ]
        == "2"
    )


@pytest.mark.parametrize(
    "method, path, status, fragment",
    [
        pytest.param("POST", f"{V1}/labels/beta:predict", 400, "Unrecognized servable version label: beta", id="unknown-label"),
        pytest.param("POST", f"{V1}/labels/be-ta:predict", 400, "letters, digits and underscores", id="label-characters"),
        pytest.param("POST", f"{V1}/versions/2/labels/stable:predict", 400, f"Malformed request: POST {V1}/versions/2/labels/stable:predict", id="version-and-label"),
        pytest.param("GET", f"{V1}:predict", 400, f"Malformed request: GET {V1}:predict", id="wrong-method"),
        pytest.param("GET", "/v1/elsewhere", 400, "Malformed request: GET /v1/elsewhere", id="unknown-v1-path"),
        pytest.param("GET", "/elsewhere", 404, "Not Found", id="outside-v1-stays-404"),
        pytest.param("GET", "/v1/models/other/rollout", 404, "Could not find any versions of model other", id="rollout-unknown-model"),
    ],
)  # fmt: skip
def test_label_and_url_errors_as_tf_serving_words_them(labeled, method, path, status, fragment):
    response = labeled.request(method, path, json={"instances": FLOATS.tolist()})
    assert fragment in error_message(response, status)


def test_the_rollout_status(labeled):
    status = ok_json(labeled.get(f"{V1}/rollout"))
    assert status == {
        "model": MODEL_NAME,
        "serving_version": 2,
        "labels": {"stable": 2, "canary": 3},
        "canary_percent": 0.0,
        "shadow_percent": 0,
        "shadow": None,
        "config": None,
    }


def test_requests_in_flight_counts_requests_being_answered():
    """The gauge an autoscaler reads: the held requests, then none (the scrape counts itself)."""
    gated = GatedFakeBackend()
    app = create_app(Settings(model_name=MODEL_NAME), gated)

    def in_flight(client) -> float:
        families = text_string_to_metric_families(client.get("/metrics").text)
        (value,) = [
            s.value for f in families for s in f.samples if s.name == "http_requests_in_flight"
        ]
        return value

    with threaded_server(app) as (url, _), httpx.Client(base_url=url, timeout=30) as client:
        gated.gate.clear()
        posts = [
            threading.Thread(
                target=client.post,
                args=(f"{V1}:predict",),
                kwargs={"json": {"instances": FLOATS[:1].tolist()}},
            )
            for _ in range(3)
        ]
        try:
            for post in posts:
                post.start()
            wait_until(lambda: gated.calls_started == 3, "three requests in the model")
            assert in_flight(client) == 4
        finally:
            gated.gate.set()
            for post in posts:
                post.join(30)
        assert in_flight(client) == 1
