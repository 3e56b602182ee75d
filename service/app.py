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
from service.api import raw_router, router
from service.backends import Backend
from service.errors import ServiceError
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
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    app.include_router(raw_router)
    app.include_router(router)

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, err: ServiceError):
        # A client's mistake is routine: INFO, never ERROR.
        level = logging.INFO if err.status < 500 else logging.WARNING
        log.log(level, "%s %s -> %s: %s", request.method, request.url.path, err.status, err.message)
        return _error(err.status, err.message)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, err: RequestValidationError):
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()
        )
        return _error(400, problems)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException):
        return _error(err.status_code, str(err.detail))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, err: Exception):
        log.exception("%s %s failed", request.method, request.url.path)
        return _error(500, f"internal error: {type(err).__name__}")

    return app
