"""Service errors: one base with an HTTP status; bodies in TF Serving's {"error": "..."} form."""

from __future__ import annotations

import logging
import re
import time

import orjson
from starlette.responses import Response

from artifact.model_config import LABEL_PATTERN

log = logging.getLogger("service")


class ServiceError(Exception):
    """Base error; `status` is the HTTP status the client gets."""

    status = 500

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class BadInput(ServiceError):
    """The request is malformed or its tensors have the wrong shape, type or values."""

    status = 400


class NotFound(ServiceError):
    """Unknown model, version or signature target."""

    status = 404


class PayloadTooLarge(ServiceError):
    """Body or image count over the configured limit."""

    status = 413


class TooManyRequests(ServiceError):
    """The backend is out of capacity (TF Serving's RESOURCE_EXHAUSTED)."""

    status = 429


class RateLimited(TooManyRequests):
    """A client past its rate; `retry_after`: whole seconds until it may send again."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class NotReady(ServiceError):
    """No model is loaded yet, or the backend is unreachable."""

    status = 503


class UpstreamError(ServiceError):
    """The backend failed in a way that is not the client's fault."""

    status = 502


class UpstreamTimeout(ServiceError):
    """The backend did not answer within the deadline."""

    status = 504


class Overloaded(ServiceError):
    """The batching queue is full: refuse at once rather than queue without bound."""

    status = 503


# What a full batching queue answers, at the door (DataPlane.admit, before the body is read)
# and at the queue itself (a request admitted while its body came, when the queue filled).
OVERLOADED = (
    "the service is overloaded (the batching queue is full, BATCH_MAX_QUEUE); retry shortly"
)


class BodiesInFlight(Overloaded):
    """The process holds MAX_BODY_BYTES_IN_FLIGHT of request bodies already: refuse the next
    before reading it (memory bounded across requests, not only per request)."""


class PixelsInFlight(Overloaded):
    """Image files of other requests are being decoded to MAX_PIXELS_IN_FLIGHT pixels
    already: refuse the next before decoding it (decoded images bounded across requests)."""


# What an overloaded service tells clients to wait before they try again (Retry-After).
RETRY_AFTER_SECONDS = "1"


class RefusalLog:
    """Overload refusals logged as a rate: the first at once, then at most one line per
    `interval` seconds saying how many were refused since the last line. A line for each
    refused request would cost the most exactly when the service has least to spare, and
    bury every other line; the metrics count each one (status 503, gRPC UNAVAILABLE)."""

    def __init__(self, interval: float = 10.0):
        self.interval = interval
        self._count = 0
        self._last: float | None = None

    def refused(self, message: str) -> None:
        self._count += 1
        now = time.monotonic()
        if self._last is not None and now - self._last < self.interval:
            return
        since = "" if self._last is None else f" in the last {now - self._last:.0f} s"
        log.warning("overloaded: refused %d request(s)%s: %s", self._count, since, message)
        self._count, self._last = 0, now


overload_log = RefusalLog()


class ClientClosedRequest(ServiceError):
    """The client went away before its answer was ready (nginx's 499; nobody reads it)."""

    status = 499


class InsufficientStorage(ServiceError):
    """The feedback store has no room (FEEDBACK_MAX_BYTES, a full disk) or cannot be written."""

    status = 507


# The rest of TF Serving's gRPC-to-HTTP mapping (service/backends/tfserving.py).


class Conflict(ServiceError):
    """TF Serving answered ALREADY_EXISTS or ABORTED."""

    status = 409


class Forbidden(ServiceError):
    """TF Serving answered PERMISSION_DENIED."""

    status = 403


class Unauthorized(ServiceError):
    """TF Serving answered UNAUTHENTICATED."""

    status = 401


class UpstreamInternal(ServiceError):
    """TF Serving failed inside (UNKNOWN, INTERNAL, DATA_LOSS): 500, as its REST API says."""

    status = 500


class NotImplementedUpstream(ServiceError):
    """TF Serving does not implement the call (UNIMPLEMENTED)."""

    status = 501


class RequestTimeout(ServiceError):
    """The client did not send its request in time (BODY_TIMEOUT_SECONDS)."""

    status = 408


def check_image_count(count: int, limit: int) -> None:
    """PayloadTooLarge naming the limit when a request holds more than `limit` images."""
    if count > limit:
        raise PayloadTooLarge(
            f"request has {count} images; the limit is {limit} per request (MAX_IMAGES)"
        )


class SignatureNotFound(BadInput):
    """The version has no signature of the name a request gives (or, naming none, no
    `serving_default`); gRPC answers it with TF Serving's FAILED_PRECONDITION words."""

    def __init__(self, signature_name: str, available):
        super().__init__(signature_not_found(signature_name, available))
        self.signature_name = signature_name


def signature_not_found(signature_name: str, available) -> str:
    """TF Serving's REST words for a signature the version does not have
    (model_servers/http_rest_api_handler.cc, GetInfoMap), and the ones it has."""
    return (
        f'Serving signature name: "{signature_name}" not found in signature def; '
        f"this model has {sorted(available)}"
    )


def check_label_name(label: str) -> None:
    """BadInput unless a version label is TF Serving's `[a-zA-Z0-9_]+`."""
    if not LABEL_PATTERN.match(label):
        raise BadInput(
            f"Malformed request: version label must be letters, digits and underscores, "
            f"got {label[:40]!r}"
        )


# gRPC status (by name) -> error: the mapping TF Serving's HTTP server applies to its own
# statuses (tensorflow_serving/model_servers/http_server.cc, ToHTTPStatusCode). The client
# backend (service/backends/tfserving.py) reads it forwards, the gRPC server
# (service/protocols/grpc_server.py) backwards. Names, not grpc.StatusCode: this module
# imports no gRPC.
GRPC_ERRORS: dict[str, type[ServiceError]] = {
    "CANCELLED": ClientClosedRequest,  # 499
    "UNKNOWN": UpstreamInternal,  # 500
    "INVALID_ARGUMENT": BadInput,  # 400
    "DEADLINE_EXCEEDED": UpstreamTimeout,  # 504
    "NOT_FOUND": NotFound,  # 404
    "ALREADY_EXISTS": Conflict,  # 409
    "PERMISSION_DENIED": Forbidden,  # 403
    "RESOURCE_EXHAUSTED": TooManyRequests,  # 429
    "FAILED_PRECONDITION": BadInput,  # 400
    "ABORTED": Conflict,  # 409
    "OUT_OF_RANGE": BadInput,  # 400
    "UNIMPLEMENTED": NotImplementedUpstream,  # 501
    "INTERNAL": UpstreamInternal,  # 500
    "UNAVAILABLE": NotReady,  # 503
    "DATA_LOSS": UpstreamInternal,  # 500
    "UNAUTHENTICATED": Unauthorized,  # 401
}


# --- rendering ------------------------------------------------------------------------------


# Directories of absolute paths in messages (a file path keeps only its name): an error body
# says what is wrong without mapping the server's filesystem.
_PATH_DIRS = re.compile(r"(?<![\w.:/])/(?:[\w.\-]+/)+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def redact_paths(text: str) -> str:
    """`text` with the folders of absolute paths left out: `/srv/models/m/3/x.pb` -> `x.pb`."""
    return _PATH_DIRS.sub("", text)


def printable(text: str) -> str:
    """`text` safe for one log line: control characters (a newline in a URL) escaped."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def _error_body(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps({"error": message}),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def error_response(method: str, path: str, err: Exception) -> Response:
    """Any exception as TF Serving's {"error": "..."} body with the right status, for a
    request of `method` on `path`.

    A client's mistake is routine: logged at INFO, never ERROR; a bug is logged with its
    traceback and answered 500 without details. Logged values are escaped, so one request
    writes one line; bodies name no server folder.
    """
    if isinstance(err, Overloaded):
        overload_log.refused(err.message)
        return _error_body(err.status, err.message, {"Retry-After": RETRY_AFTER_SECONDS})
    if isinstance(err, ServiceError):
        level = logging.INFO if err.status < 500 else logging.WARNING
        if log.isEnabledFor(level):
            log.log(level, "%s %s -> %s: %s", printable(method), printable(path), err.status,
                    printable(err.message))  # fmt: skip
        headers = None
        if isinstance(err, RateLimited):
            headers = {"Retry-After": str(err.retry_after)}
        # A client's mistake is about what it sent; the server's own failures (a version that
        # does not load, a reason it is not ready) may name its files: not their folders.
        message = err.message if err.status < 500 else redact_paths(err.message)
        return _error_body(err.status, message, headers)
    log.error("%s %s failed", printable(method), printable(path), exc_info=err)
    return _error_body(500, f"internal error: {type(err).__name__}")
