"""The settings that choose between TF Serving's behaviour and this service's stricter or
richer one (STRICT_NUMBERS, TFSERVING_EXTRA_KEYS), /v1 paths in any case, and the model
status keeping unloaded versions, as TF Serving keeps them.

The real app over a fake backend (tests/service/fakes.py); the registry over a fake loader.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import orjson
import pytest
from support.fakes import MODEL_NAME, FakeBackend, FakeLoader, app_client, write_version

from artifact.model_config import ModelEntry, Policy
from service.app import create_app
from service.backends.registry import VersionRegistry
from service.codecs import json_body, tfserving_json
from service.codecs.signatures import IMAGE_INPUT
from service.errors import BadInput
from service.settings import Settings
from service.types import SignatureSpec, VersionState, VersionStatus

PREDICT = f"/v1/models/{MODEL_NAME}:predict"
ROWS = [[0.5] * 28] * 28


# --- TFSERVING_EXTRA_KEYS -------------------------------------------------------------------


@pytest.mark.parametrize("extra_keys", [True, False])
def test_extra_keys_can_be_left_out(extra_keys):
    with app_client(FakeBackend(), tfserving_extra_keys=extra_keys) as client:
        rows = client.post(PREDICT, json={"instances": [ROWS]}).json()
        columns = client.post(PREDICT, json={"inputs": [ROWS]}).json()
        metadata = client.get(f"/v1/models/{MODEL_NAME}/metadata").json()
    if extra_keys:
        assert rows["model_version"] == columns["model_version"] == "1"
        assert metadata["device"] == "/CPU:0"
    else:
        assert set(rows) == {"predictions"}
        assert set(columns) == {"outputs"}
        assert set(metadata) == {"model_spec", "metadata"}


# --- STRICT_NUMBERS -------------------------------------------------------------------------


NAN_BODY = json.dumps({"instances": [[[float("nan")] * 28] * 28]}).encode()
PAST_FLOAT32 = json.dumps({"instances": [[[1e39] * 28] * 28]}).encode()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(NAN_BODY, "JSON Parse error", id="nan-literal"),
        pytest.param(PAST_FLOAT32, "instances[0]: values must be finite", id="past-float32"),
    ],
)
def test_strict_numbers_refuses_what_tf_serving_passes(content, message):
    with app_client(FakeBackend(), strict_numbers=True) as client:
        response = client.post(PREDICT, content=content)
    assert response.status_code == 400
    assert message in response.json()["error"]


class NonFiniteBackend(FakeBackend):
    """The fake backend, taking NaN and Inf as TensorFlow takes them: without a warning."""

    async def predict(self, *args, **kwargs):
        with np.errstate(invalid="ignore", over="ignore"):
            return await super().predict(*args, **kwargs)


@pytest.mark.parametrize("content", [NAN_BODY, PAST_FLOAT32], ids=["nan-literal", "past-float32"])
def test_by_default_they_reach_the_model(content):
    backend = NonFiniteBackend()
    with app_client(backend) as client:
        response = client.post(PREDICT, content=content)
    assert response.status_code == 200, response.text
    assert backend.calls == [(None, None, 1)]


def test_the_usual_body_stays_on_the_fast_path(monkeypatch):
    """Only a body orjson refuses and that holds NaN or Infinity is read by Python's json;
    the usual row body (large numbers included) never leaves simdjson."""
    read = []

    def refuse(body):
        read.append("orjson")
        raise orjson.JSONDecodeError("unexpected character", body.decode(), 0)

    monkeypatch.setattr(json_body.orjson, "loads", refuse)
    monkeypatch.setattr(json_body.json, "loads", lambda body: read.append("json"))
    signature = SignatureSpec("serving_default", "tensorflow/serving/predict", (IMAGE_INPUT,), ())
    for content in (json.dumps({"instances": [ROWS]}).encode(), PAST_FLOAT32):
        request = tfserving_json.read_predict_request(content, 8, strict=False)
        assert request.inputs(signature, 8).shape == (1, 28, 28)
    assert read == []
    with pytest.raises(BadInput):  # the stand-in json gives no object
        tfserving_json.read_predict_request(NAN_BODY, 8, strict=False)
    assert read == ["orjson", "json"]


# --- paths ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "template", "params"),
    [
        pytest.param("POST", "/V1/MODELS/Fashion:PREDICT", "/v1/models/{name}:predict", {"name": "Fashion"}, id="predict"),
        pytest.param("POST", "/v1/Models/M/Versions/3:Classify", "/v1/models/{name}/versions/{version}:classify", {"name": "M", "version": "3"}, id="version"),
        pytest.param("POST", "/V1/models/M/LABELS/Stable:regress", "/v1/models/{name}/labels/{label}:regress", {"name": "M", "label": "Stable"}, id="label"),
        pytest.param("GET", "/V1/MODELS/M/VERSIONS/3/METADATA", "/v1/models/{name}/versions/{version}/metadata", {"name": "M", "version": "3"}, id="metadata"),
        pytest.param("GET", "/V1/MODELS/M/ROLLOUT", "/v1/models/{name}/rollout", {"name": "M"}, id="rollout"),
        pytest.param("POST", "/V1/MODELS/M/FEEDBACK", "/v1/models/{name}/feedback", {"name": "M"}, id="feedback"),
        pytest.param("GET", "/V1/MODELS/METADATA", "/v1/models/{name}", {"name": "METADATA"}, id="a-model-named-metadata"),
        pytest.param("GET", "/v1/models/m", "/v1/models/{name}", {"name": "m"}, id="already"),
    ],
)  # fmt: skip
def test_v1_words_match_in_any_case_and_names_keep_theirs(method, path, template, params):
    table = create_app(Settings(), FakeBackend()).ingress.table
    found = table.match(method, path)
    assert (found.route.template, found.params) == (template, params)


@pytest.mark.parametrize("path", ["/V1/MODELS/M:Explain", "/V2/MODELS/M/INFER"])
def test_paths_that_are_no_route_in_any_case(path):
    table = create_app(Settings(), FakeBackend()).ingress.table
    assert table.match("POST", path) is None


def test_status_routes_match_in_any_case_too():
    with app_client(FakeBackend()) as client:
        assert client.get(f"/V1/MODELS/{MODEL_NAME}/ROLLOUT").json()["model"] == MODEL_NAME
        assert client.get(f"/V1/MODELS/{MODEL_NAME}").status_code == 200
        assert client.get(f"/v1/models/{MODEL_NAME.upper()}").status_code == 404


# --- model status history (the version registry) --------------------------------------------


def test_an_unloaded_version_stays_listed_in_end_with_ok(tmp_path):
    model_dir = tmp_path / MODEL_NAME
    write_version(model_dir, 1)
    registry = VersionRegistry(ModelEntry(MODEL_NAME, Path(model_dir), Policy(), {}), FakeLoader())

    async def run():
        await registry.refresh()
        write_version(model_dir, 2)
        await registry.refresh()  # latest 1: version 1 leaves
        await asyncio.sleep(0)
        unloaded = registry.version_status(1)
        shutil.rmtree(model_dir / "1")
        await registry.refresh()
        return unloaded, registry.version_status(1), registry.statuses()

    unloaded, deleted, statuses = asyncio.run(run())
    assert unloaded == deleted == VersionStatus(1, VersionState.END, "OK", "")
    assert statuses == [
        VersionStatus(2, VersionState.AVAILABLE),
        VersionStatus(1, VersionState.END),
    ]
