"""Who may call what over gRPC, decided from the call's metadata before its message is read.

One table (`METHOD_SCOPES`) says the token scope each method of GRPC_PORT's services needs,
and one interceptor (`TokenInterceptor`) enforces it for every service on the server, with
HTTP's token rule (service/security.py's `bearer_problem`, over the same `TokenFile`). A
refused call is answered from its metadata alone: the request message (up to
GRPC_MAX_MESSAGE_BYTES) is never deserialized, and no servicer runs.

A bearer token sent over plaintext gRPC (no TLS_CERT_FILE) is refused unless
GRPC_ALLOW_PLAINTEXT_TOKENS says the network is trusted (a mesh that encrypts, loopback):
anyone on the path could read it and replay it.
"""

from __future__ import annotations

import logging

import grpc

from service.errors import printable
from service.security import PREDICT, SCOPE, STATUS, bearer_problem

log = logging.getLogger("service.grpc")

TFS_PREDICTION = "/tensorflow.serving.PredictionService/"
TFS_MODEL = "/tensorflow.serving.ModelService/"
# The Open Inference Protocol's service (service/v2_proto.py's SERVICE).
V2 = "/inference.GRPCInferenceService/"

# The scope each method needs; None: open (the health methods, as /v2/health/* over HTTP).
METHOD_SCOPES: dict[str, str | None] = {
    **{
        TFS_PREDICTION + name: PREDICT
        for name in ("Predict", "Classify", "Regress", "MultiInference")
    },
    TFS_PREDICTION + "GetModelMetadata": STATUS,
    TFS_MODEL + "GetModelStatus": STATUS,
    TFS_MODEL + "HandleReloadConfigRequest": STATUS,
    V2 + "ServerLive": None,
    V2 + "ServerReady": None,
    V2 + "ModelReady": STATUS,
    V2 + "ServerMetadata": STATUS,
    V2 + "ModelMetadata": STATUS,
    V2 + "ModelInfer": PREDICT,
}
# A method missing from the table (a service added later) needs the widest scope, not none.
DEFAULT_SCOPE = PREDICT

PLAINTEXT_TOKEN = (
    "a bearer token was sent over plaintext gRPC, where anyone on the path can read it: "
    "this server refuses tokens without TLS (TLS_CERT_FILE, TLS_KEY_FILE); on a network that "
    "is encrypted already (a service mesh, loopback) set GRPC_ALLOW_PLAINTEXT_TOKENS=true"
)


# What a call to a method no service has is counted as (grpc_requests_total{method}): its
# name comes from the client, which must not grow the label set without bound.
OTHER_METHOD = "other"


def metric_name(method: str) -> str:
    """A gRPC method's name in the metrics: its own (`Predict`) for a method in the table,
    `other` for any other name a client sends."""
    return method.rsplit("/", 1)[-1] if method in METHOD_SCOPES else OTHER_METHOD


def scope_of_method(method: str) -> str | None:
    """The scope a gRPC method (`/package.Service/Method`) needs, or None when it is open."""
    return METHOD_SCOPES.get(method, DEFAULT_SCOPE)


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Every call's bearer token checked against its method's scope, before its message is
    deserialized: a refused call costs its metadata, not its message.

    Args:
        tokens: token -> scopes (a `TokenFile`), the HTTP side's own.
        refuse_plaintext: refuse any call that carries a token (the server has no TLS and
            GRPC_ALLOW_PLAINTEXT_TOKENS is off).
        count: `count(method_name, code_name)`, called for each refused call (the metrics'
            grpc_requests_total, which the servicers count for the calls they answer), with
            `metric_name`'s name for the method.
    """

    def __init__(self, tokens, refuse_plaintext: bool = False, count=None):
        self.tokens = tokens
        self.refuse_plaintext = refuse_plaintext
        self.count = count

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        header = ""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                header = value if isinstance(value, str) else value.decode("latin-1")
        refusal = self._refusal(method, header)
        if refusal is None:
            return await continuation(handler_call_details)
        code, message = refusal
        if self.count is not None:
            self.count(metric_name(method), code.name)
        log.info("gRPC %s -> %s: %s", printable(method), code.name, message)
        return _refusing_handler(code, message)

    def _refusal(self, method: str, header: str) -> tuple[grpc.StatusCode, str] | None:
        if self.refuse_plaintext and header:
            return grpc.StatusCode.UNAUTHENTICATED, PLAINTEXT_TOKEN
        needed = scope_of_method(method)
        if needed is None:
            return None
        problem = bearer_problem(self.tokens, header.encode("latin-1"), needed)
        if problem is None:
            return None
        kind, message = problem
        code = (
            grpc.StatusCode.PERMISSION_DENIED if kind == SCOPE else grpc.StatusCode.UNAUTHENTICATED
        )
        return code, message


def _refusing_handler(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    # No request_deserializer: the message stays the bytes gRPC received, never parsed.
    async def refuse(request, context):
        await context.abort(code, message)

    return grpc.unary_unary_rpc_method_handler(refuse)
