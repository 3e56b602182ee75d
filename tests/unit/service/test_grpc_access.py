"""The one table of gRPC methods' scopes and the token rule the interceptor applies
(service/protocols/grpc_access.py); the calls themselves: tests/live/service/test_grpc_hardening.py."""

from __future__ import annotations

import grpc
import pytest

from service import v2_proto
from service.protocols.grpc_access import (
    METHOD_SCOPES,
    PLAINTEXT_TOKEN,
    CallGuard,
    metric_name,
    scope_of_method,
)
from service.security import PREDICT, STATUS, token_digest

TOKENS = {
    token_digest("predictor-token-0123456789"): frozenset({PREDICT}),
    token_digest("watcher-token-0123456789"): frozenset({STATUS}),
}


def test_every_open_inference_method_has_its_scope():
    served = {f"/{v2_proto.SERVICE}/{name}" for name in v2_proto.METHODS}
    assert served <= set(METHOD_SCOPES)


@pytest.mark.parametrize(
    ("method", "scope"),
    [
        pytest.param("/tensorflow.serving.PredictionService/Predict", PREDICT, id="predict"),
        pytest.param("/tensorflow.serving.PredictionService/Classify", PREDICT, id="classify"),
        pytest.param("/tensorflow.serving.PredictionService/MultiInference", PREDICT, id="multi"),
        pytest.param(
            "/tensorflow.serving.PredictionService/GetModelMetadata", STATUS, id="metadata"
        ),
        pytest.param("/tensorflow.serving.ModelService/GetModelStatus", STATUS, id="status"),
        pytest.param("/inference.GRPCInferenceService/ModelInfer", PREDICT, id="v2-infer"),
        pytest.param("/inference.GRPCInferenceService/ModelMetadata", STATUS, id="v2-metadata"),
        pytest.param("/inference.GRPCInferenceService/ServerLive", None, id="v2-live"),
        pytest.param("/inference.GRPCInferenceService/ServerReady", None, id="v2-ready"),
        pytest.param("/some.Other/Method", PREDICT, id="unknown-needs-the-widest"),
    ],
)
def test_scope_of_method(method, scope):
    assert scope_of_method(method) == scope


@pytest.mark.parametrize(
    ("method", "header", "refuse_plaintext", "code"),
    [
        pytest.param("/inference.GRPCInferenceService/ModelInfer", "", False,
                     grpc.StatusCode.UNAUTHENTICATED, id="missing"),
        pytest.param("/inference.GRPCInferenceService/ModelInfer", "Bearer nope", False,
                     grpc.StatusCode.UNAUTHENTICATED, id="invalid"),
        pytest.param("/inference.GRPCInferenceService/ModelInfer",
                     "Bearer watcher-token-0123456789", False,
                     grpc.StatusCode.PERMISSION_DENIED, id="scope"),
        pytest.param("/inference.GRPCInferenceService/ModelInfer",
                     "Bearer predictor-token-0123456789", False, None, id="granted"),
        pytest.param("/inference.GRPCInferenceService/ServerLive", "", False, None, id="open"),
        pytest.param("/inference.GRPCInferenceService/ServerLive", "", True, None,
                     id="open-without-token-on-plaintext"),
        pytest.param("/inference.GRPCInferenceService/ModelInfer",
                     "Bearer predictor-token-0123456789", True,
                     grpc.StatusCode.UNAUTHENTICATED, id="plaintext-token"),
    ],
)  # fmt: skip
def test_the_token_rule(method, header, refuse_plaintext, code):
    refusal = CallGuard(TOKENS, refuse_plaintext)._refusal(method, header)
    assert (refusal and refusal[0]) == code
    if refuse_plaintext and header:
        assert refusal[1] == PLAINTEXT_TOKEN


@pytest.mark.parametrize(
    ("method", "name"),
    [
        pytest.param("/tensorflow.serving.PredictionService/Predict", "Predict", id="served"),
        pytest.param("/inference.GRPCInferenceService/ServerLive", "ServerLive", id="v2"),
        pytest.param("/made.Up/Method7", "other", id="made-up"),
        pytest.param("/made.Up/Predict", "other", id="served-name-elsewhere"),
        pytest.param("", "other", id="empty"),
    ],
)
def test_the_metrics_name_a_method_only_when_a_service_has_it(method, name):
    assert metric_name(method) == name
