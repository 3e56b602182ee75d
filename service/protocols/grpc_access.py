"""Who may call what over gRPC, decided from the call's metadata before its message is read,
and how long a call may take to send its message.

One table (`METHOD_SCOPES`) says the token scope each method of GRPC_PORT's services needs,
and one interceptor (`CallGuard`) enforces it for every service on the server, with HTTP's
token rule (service/security.py's `bearer_problem`, over the same `TokenFile`). A refused
call is answered from its metadata alone, at once: the server does not wait for its request
message (up to GRPC_MAX_MESSAGE_BYTES), never deserializes it, and runs no servicer. So a
client without a token cannot hold one of GRPC_MAX_CONCURRENT_RPCS by opening calls that
never send their message.

A call that is let through must send its message within `receive_timeout`
(BODY_TIMEOUT_SECONDS, HTTP's for a request body); past it the call ends with
DEADLINE_EXCEEDED and its slot is free. gRPC itself waits for a unary call's message for as
long as the client likes: the guard serves each unary method as a client-streaming one that
reads the first message under a timer, then calls the method's own handler with it.

Every call is given a request id, as an HTTP request is (the client's `x-request-id` metadata
when it is a good one, else a new one), sent back in its trailing metadata whatever its
status, and carried by the log records made while it is answered; and, refused or answered,
an access line as HTTP's (method `gRPC`, the method's full name as its path).

A bearer token sent over plaintext gRPC (no TLS_CERT_FILE) is refused unless
GRPC_ALLOW_PLAINTEXT_TOKENS says the network is trusted (a mesh that encrypts, loopback):
anyone on the path could read it and replay it.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from artifact.logs import RequestLog, current_request, request_id_of, trace_id_of
from service import tracing
from service.errors import GRPC_ERRORS, UpstreamInternal, printable
from service.security import PREDICT, SCOPE, STATUS, bearer_problem

log = logging.getLogger("service.grpc")
# One line per call at INFO, as HTTP's (service/ingress.py).
access_log = logging.getLogger("service.access")

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


# The trailing metadata key every call's request id is sent back in (HTTP's X-Request-ID).
REQUEST_ID_KEY = "x-request-id"
# A call's message must come within this long by default (BODY_TIMEOUT_SECONDS's default).
RECEIVE_TIMEOUT_SECONDS = 30.0


class CallGuard(grpc.aio.ServerInterceptor):
    """Every call's bearer token checked against its method's scope, before its message is
    read (a refused call costs its metadata, not its message, and ends at once); every call
    let through given `receive_timeout` seconds to send its message.

    Args:
        tokens: token digest -> scopes (a `TokenFile`), the HTTP side's own; None: no token
            is asked for.
        refuse_plaintext: refuse any call that carries a token (the server has no TLS and
            GRPC_ALLOW_PLAINTEXT_TOKENS is off).
        count: `count(method_name, code_name)`, called for each refused call (the metrics'
            grpc_requests_total, which the servicers count for the calls they answer), with
            `metric_name`'s name for the method.
        receive_timeout: seconds a call may take to send its request message
            (BODY_TIMEOUT_SECONDS).
    """

    def __init__(
        self,
        tokens=None,
        refuse_plaintext: bool = False,
        count=None,
        receive_timeout: float = RECEIVE_TIMEOUT_SECONDS,
    ):
        self.tokens = tokens
        self.refuse_plaintext = refuse_plaintext
        self.count = count
        self.receive_timeout = receive_timeout
        # Each served method's guarded handler, made once (the methods are the services').
        self._guarded: dict[str, grpc.RpcMethodHandler | None] = {}

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        header = ""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                header = value if isinstance(value, str) else value.decode("latin-1")
        refusal = self._refusal(method, header)
        if refusal is None:
            guarded = self._guarded.get(method)
            if guarded is None:
                handler = await continuation(handler_call_details)
                guarded = receiving_within(handler, self.receive_timeout, method)
                if handler is not None:  # a method no service has: not kept
                    self._guarded[method] = guarded
            return guarded
        code, message = refusal
        if self.count is not None:
            self.count(metric_name(method), code.name)
        log.info("gRPC %s -> %s: %s", printable(method), code.name, message)
        return _refusing_handler(code, message, method)

    def _refusal(self, method: str, header: str) -> tuple[grpc.StatusCode, str] | None:
        if self.refuse_plaintext and header:
            return grpc.StatusCode.UNAUTHENTICATED, PLAINTEXT_TOKEN
        if self.tokens is None:
            return None
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


# The codes a client's own request causes: its span is not marked as an error.
CLIENT_CODE_NAMES = frozenset(
    {
        "OK",
        "CANCELLED",
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "FAILED_PRECONDITION",
        "OUT_OF_RANGE",
        "UNAUTHENTICATED",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "ALREADY_EXISTS",
    }
)


def receiving_within(handler, seconds: float, method: str = ""):
    """A unary-unary method's handler as a client-streaming one that waits at most `seconds`
    for the request message, then answers as the method does; other handlers (and None, a
    method no service has) as they are. Each call gets its request id and, once answered, its
    access line (`method`: the method's full name).

    The client sees no difference: a unary call is one message and a half-close either way.
    """
    if handler is None or handler.request_streaming or handler.response_streaming:
        return handler
    answer = handler.unary_unary

    async def receive_then_answer(requests, context):
        started = time.perf_counter()
        request = call_request_log(context, method)
        token = current_request.set(request)
        code = "UNKNOWN"
        traced = None
        if tracing.tracer is not None:
            carrier = {
                key: value
                for key, value in context.invocation_metadata() or ()
                if key == "traceparent" or key == "tracestate"
            }
            attributes = {"rpc.system": "grpc", "rpc.method": method}
            attributes["request.id"] = request.request_id
            traced = tracing.request_span(method, carrier, attributes)
            request.trace_id = tracing.trace_id(traced[0])
        try:
            response = await _receive_then_answer(context)
            code = "OK"
            return response
        except asyncio.CancelledError:
            code = "CANCELLED"  # the client left, or its deadline passed
            raise
        except BaseException:
            code = _code_name(context.code())
            raise
        finally:
            write_access_line(request, code, started)
            if traced is not None:
                ended = {
                    "rpc.grpc.status_code": code,
                    "model": request.model,
                    "model.version": request.version,
                    "model.signature": request.signature,
                }
                tracing.end_request(*traced, ended, error=code not in CLIENT_CODE_NAMES)
            current_request.reset(token)

    async def _receive_then_answer(context):
        try:
            async with asyncio.timeout(seconds):
                # The context's own read: no async generator around it (`requests` is one).
                request = await context.read()
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the request message did not arrive within {seconds:g} s (BODY_TIMEOUT_SECONDS)",
            )
        if request is grpc.aio.EOF:  # a half-close with no message: not a unary call
            await context.abort(
                grpc.StatusCode.INTERNAL, "the call ended without its request message"
            )
        return await answer(request, context)

    return grpc.stream_unary_rpc_method_handler(
        receive_then_answer,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def call_request_log(context, method: str) -> RequestLog:
    """A call's log record, as HTTP's (service/ingress.py): its id (the client's `x-request-id`
    metadata when it is a good one, else a new one), the trace id of its `traceparent`, the
    method (`path`) and the client; the id is sent back in the call's trailing metadata,
    `x-request-id`, whatever its status."""
    sent = traceparent = None
    for key, value in context.invocation_metadata() or ():
        if key == "x-request-id":
            sent = value
        elif key == "traceparent":
            traceparent = value
    peer = context.peer() or "-"
    # grpc's peer is `ipv4:127.0.0.1:5000`, `ipv6:[::1]:5000` or `unix:/path`.
    client = peer.split(":", 1)[1] if peer.startswith(("ipv4:", "ipv6:")) else peer
    request = RequestLog(request_id_of(sent), trace_id_of(traceparent), "gRPC", method, client)
    context.set_trailing_metadata(((REQUEST_ID_KEY, request.request_id),))
    return request


def write_access_line(request: RequestLog, code: str, started: float) -> None:
    """A call's access line, as an HTTP request's: `status` is the HTTP status TF Serving's
    table gives the gRPC code (service/errors.py: GRPC_ERRORS; OK is 200), which the line's
    message names."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    request.status = 200 if code == "OK" else GRPC_ERRORS.get(code, UpstreamInternal).status
    request.duration_ms = round((time.perf_counter() - started) * 1000, 3)
    access_log.info('%s - "gRPC %s" %s', request.client, printable(request.path or ""), code,
                    extra={"request": request})  # fmt: skip


def _code_name(code) -> str:
    """The name of the status a call was ended with (context.code(): a StatusCode, or None
    when the handler raised without setting one, which gRPC answers UNKNOWN)."""
    return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"


def _refusing_handler(code: grpc.StatusCode, message: str, method: str) -> grpc.RpcMethodHandler:
    # Client-streaming, and nothing read: the call ends now, whether or not its message ever
    # comes, and the bytes gRPC received are never parsed.
    async def refuse(requests, context):
        started = time.perf_counter()
        request = call_request_log(context, method)
        write_access_line(request, code.name, started)
        await context.abort(code, message)

    return grpc.stream_unary_rpc_method_handler(refuse)
