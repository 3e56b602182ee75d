"""Service errors: one base with an HTTP status; bodies in TF Serving's {"error": "..."} form."""

from __future__ import annotations

import logging

import orjson
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

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


# --- rendering ------------------------------------------------------------------------------


def _error_body(status: int, message: str) -> Response:
    return Response(
        orjson.dumps({"error": message}), status_code=status, media_type="application/json"
    )


def error_response(request: Request, err: Exception) -> Response:
    """Any exception as TF Serving's {"error": "..."} body with the right status.

    A client's mistake is routine: logged at INFO, never ERROR; a bug is logged with its
    traceback and answered 500 without details.
    """
    if isinstance(err, ServiceError):
        level = logging.INFO if err.status < 500 else logging.WARNING
        log.log(level, "%s %s -> %s: %s", request.method, request.url.path, err.status, err.message)
        return _error_body(err.status, err.message)
    if isinstance(err, RequestValidationError):
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()
        )
        return _error_body(400, problems)
    if isinstance(err, StarletteHTTPException):
        if err.status_code in (404, 405) and request.url.path.startswith("/v1/"):
            # TF Serving answers any /v1 URL it cannot parse (a version and a label at once,
            # a method a route does not take) with 400 and these words.
            return _error_body(400, f"Malformed request: {request.method} {request.url.path}")
        return _error_body(err.status_code, str(err.detail))
    log.error("%s %s failed", request.method, request.url.path, exc_info=err)
    return _error_body(500, f"internal error: {type(err).__name__}")
