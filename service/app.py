"""The app factory: settings in, a FastAPI app with its backend, metrics and error handling out."""

from __future__ import annotations

import contextlib
import gc
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from service import codec
from service.api import router
from service.backends import Backend
from service.errors import ServiceError
from service.fastlane import PredictFastLane
from service.metrics import Metrics, MetricsMiddleware
from service.settings import Settings

log = logging.getLogger("service")


def make_backend(settings: Settings) -> Backend:
    """The backend the settings ask for.

    BACKEND=tfserving forwards every call to TF Serving, which batches on its side
    (--enable_batching), so no batcher sits in front of it here: one would serialize the calls.
    """
    if settings.backend == "tfserving":
        from service.backends.tfserving import TFServingBackend

        return TFServingBackend(
            settings.model_name,
            settings.model_base_path,
            settings.tfserving_grpc_address,
            settings.tfserving_deadline_seconds,
        )
    from service.backends.inprocess import InProcessBackend

    backend = InProcessBackend(
        settings.model_name,
        settings.model_base_path,
        device=settings.device,
        intra_op_threads=settings.intra_op_threads,
        inter_op_threads=settings.inter_op_threads,
        poll_seconds=settings.model_poll_seconds,
    )
    if settings.batch_max_size > 1:
        from service.batching import BatchingBackend

        backend = BatchingBackend(
            backend, settings.batch_max_size, settings.batch_timeout_ms, settings.batch_max_queue
        )
    return backend


def _error(status: int, message: str) -> Response:
    return Response(
        codec.dumps({"error": message}), status_code=status, media_type="application/json"
    )


def error_response(request: Request, err: Exception) -> Response:
    """Any exception as TF Serving's {"error": "..."} body with the right status."""
    if isinstance(err, ServiceError):
        # A client's mistake is routine: INFO, never ERROR.
        level = logging.INFO if err.status < 500 else logging.WARNING
        log.log(level, "%s %s -> %s: %s", request.method, request.url.path, err.status, err.message)
        return _error(err.status, err.message)
    if isinstance(err, RequestValidationError):
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()
        )
        return _error(400, problems)
    if isinstance(err, StarletteHTTPException):
        return _error(err.status_code, str(err.detail))
    log.error("%s %s failed", request.method, request.url.path, exc_info=err)
    return _error(500, f"internal error: {type(err).__name__}")


def create_app(settings: Settings, backend: Backend | None = None) -> FastAPI:
    """Build the service.

    Args:
        settings: the validated settings.
        backend: a ready-made backend (tests); by default the one settings.backend names.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await app.state.backend.start()
        # TF and the model leave ~280k long-lived objects (a full collection: ~160 ms here);
        # freezing them keeps collections under load, and their latency spikes, short.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await app.state.backend.close()

    app = FastAPI(
        title="Estimator serving",
        description="Classify 28x28 grayscale images with an exported TensorFlow Estimator. "
        "TensorFlow Serving's REST API under /v1, a friendlier /predict for people.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.backend = backend or make_backend(settings)
    app.state.metrics = Metrics()
    app.include_router(router)

    async def handle_error(request: Request, err: Exception):
        return error_response(request, err)

    # The specific classes are handled inside the app; Exception only at its outermost layer.
    for error_class in (ServiceError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(error_class, handle_error)

    predict_routes = {route.path: route for route in router.routes}
    app.add_middleware(
        PredictFastLane,
        routes={
            False: predict_routes["/v1/models/{name}:predict"],
            True: predict_routes["/v1/models/{name}/versions/{version}:predict"],
        },
        error_response=error_response,
    )
    # Added last, so outermost: it counts the fast lane's requests too.
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    return app
