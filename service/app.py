"""The app factory: settings and a backend in, a FastAPI app with its data plane, protocol
adapters, metrics and error handling out."""

from __future__ import annotations

import asyncio
import contextlib
import gc

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from artifact.model_config import ConfigError
from service import errors
from service.backends.base import Backend
from service.config_watcher import ConfigWatcher
from service.dataplane import OVERLOADED, DataPlane
from service.directlane import DirectLane
from service.errors import ServiceError, error_response
from service.fastlane import FastLane
from service.metrics import Metrics, MetricsMiddleware
from service.openapi import document_responses
from service.protocols.docs import DocsAPI
from service.protocols.feedback import FeedbackAPI
from service.protocols.operations import Operations
from service.protocols.page import PageAPI
from service.protocols.people import PeopleAPI
from service.protocols.tfserving_rest import TFServingREST
from service.protocols.v2 import OpenInferenceREST
from service.security import SecurityMiddleware, read_tokens
from service.server import EarlyRefusal
from service.settings import Settings
from service.traffic import Traffic

SERVER_NAME = "estimator-serving"


class ServiceApp(FastAPI):
    """FastAPI with the service's own middleware in front of it.

    FastAPI checks its telemetry settings and runs its error and body-limit middleware on
    every request before any added middleware; on the hot path (the fast lane's predictions)
    those layers cost as much as the rest of the Python work. `outer_middleware` (pure ASGI
    classes and their options, innermost first) runs before all of it: metrics, access rules
    and the fast lane, which renders its own errors; every other request goes on through
    FastAPI as usual. It is assembled at the first call, so it can be changed until then.
    """

    outer_middleware: list[tuple[type, dict]] = []
    _outer = None

    async def __call__(self, scope, receive, send) -> None:
        if self._outer is None:
            app = super().__call__
            for middleware, options in self.outer_middleware:
                app = middleware(app, **options)
            self._outer = app
        scope["app"] = self
        await self._outer(scope, receive, send)


def create_app(settings: Settings, backend: Backend, serve_grpc: bool = False) -> FastAPI:
    """Build the service.

    Args:
        settings: the validated settings.
        backend: the model runtime (service.backends.factory.make_backend(settings) builds the
            one the settings name; tests pass fakes).
        serve_grpc: also serve TF Serving's gRPC API on HOST:GRPC_PORT, started and stopped with
            the app (the entry point asks for it unless GRPC_PORT is 0).
    """
    metrics = Metrics()
    traffic = Traffic(settings.canary_percent, settings.shadow_percent)
    prediction_log = None
    if settings.prediction_log_sampling_rate > 0:
        # Imported only when logging is on: TF Serving's protos import TensorFlow.
        from service.prediction_log import PredictionLogger

        prediction_log = PredictionLogger(
            settings.prediction_log_dir,
            settings.prediction_log_sampling_rate,
            settings.prediction_log_file_records,
            settings.prediction_log_max_bytes,
            metrics.registry,
        )
    dataplane = DataPlane(backend, metrics, settings.max_images, traffic, prediction_log)
    watcher = None
    if settings.model_config_file:
        watcher = ConfigWatcher(
            settings.model_config_file, settings.model_config_file_poll_seconds, backend
        )
    tokens = read_tokens(settings.auth_tokens_file) if settings.auth_tokens_file else None
    grpc_server = None
    if serve_grpc:
        # Imported only when asked for: TF Serving's protos import TensorFlow (seconds).
        from service.protocols.grpc_server import GRPCServer

        grpc_server = GRPCServer(
            dataplane,
            settings.host,
            settings.grpc_port,
            settings.grpc_max_message_bytes,
            tokens,
            share_port=settings.workers > 1,
            grace=settings.shutdown_timeout_seconds,
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        try:
            await dataplane.start()
        except ConfigError as err:
            # A config the backend cannot realize at start (a label to a version that does not
            # load): the entry point stops the server and exits 2 with this one line.
            report = app.state.on_startup_error
            if report is None:
                raise
            report(str(err))
            await dataplane.close()
            yield
            return
        # TF and the model leave ~280k long-lived objects (a full collection: ~160 ms here);
        # freezing them keeps collections under load, and their latency spikes, short.
        gc.collect()
        gc.freeze()
        if watcher is not None:
            watcher.start()
        await feedback.start()
        if prediction_log is not None:
            await asyncio.to_thread(prediction_log.start)
        try:
            if grpc_server is not None:
                # After the data plane, whose batcher lives on this loop, and on this loop too.
                await grpc_server.start()
            yield
        finally:
            if grpc_server is not None:
                await grpc_server.stop()
            if watcher is not None:
                await watcher.close()
            await dataplane.close()
            await feedback.close()
            if prediction_log is not None:
                await asyncio.to_thread(prediction_log.close)

    app = ServiceApp(
        title="Estimator serving",
        description="Classify 28x28 grayscale images with an exported TensorFlow Estimator. "
        "TensorFlow Serving's REST API under /v1, the Open Inference Protocol (KServe V2) "
        "under /v2, a friendlier /predict for people.",
        version="0.1.0",
        lifespan=lifespan,
        # Served from local files instead (DocsAPI): FastAPI's own pages load a CDN's scripts.
        docs_url=None,
        redoc_url=None,
    )
    tf_serving = TFServingREST(
        dataplane, settings.max_body_bytes, watcher, settings.body_timeout_seconds
    )
    people = PeopleAPI(
        dataplane,
        settings.max_body_bytes,
        settings.body_timeout_seconds,
        settings.max_request_pixels,
    )
    v2 = OpenInferenceREST(
        dataplane,
        settings.max_body_bytes,
        SERVER_NAME,
        app.version,
        settings.body_timeout_seconds,
    )
    feedback = FeedbackAPI(
        dataplane,
        settings.feedback_dir,
        settings.feedback_shard_images,
        settings.feedback_max_bytes,
        settings.max_body_bytes,
        settings.body_timeout_seconds,
        settings.max_request_pixels,
    )
    page = PageAPI(dataplane)
    docs = DocsAPI(app.openapi_url, app.title)
    for adapter in (Operations(dataplane), tf_serving, v2, people, feedback, page, docs):
        app.include_router(adapter.router)

    async def handle_error(request: Request, err: Exception):
        return error_response(request, err)

    # The specific classes are handled inside the app; Exception only at its outermost layer.
    for error_class in (ServiceError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(error_class, handle_error)

    fast_routes = tf_serving.fast_routes() + v2.fast_routes() + people.fast_routes()

    def refused(template: str) -> None:
        metrics.child(metrics.requests, template, "POST", "503").inc()
        errors.overload_log.refused(OVERLOADED)

    # For the server's protocol (service/server.py): predictions refused before the app, and
    # plain ones answered without it.
    app.state.refusal = EarlyRefusal(
        dataplane.overloaded, [route for route, _ in fast_routes], OVERLOADED, refused
    )
    app.state.direct_lane = DirectLane(
        fast_routes,
        metrics,
        tokens,
        error_response,
        settings.max_body_bytes,
        settings.body_timeout_seconds,
        dataplane.admit,
    )
    # Innermost first; all of them in front of FastAPI's own stack (ServiceApp).
    app.outer_middleware = [
        (
            FastLane,
            {
                "routes": fast_routes,
                "error_response": error_response,
                "max_body_bytes": settings.max_body_bytes,
                "body_timeout": settings.body_timeout_seconds,
                "admit": dataplane.admit,
            },
        ),  # fmt: skip
        (SecurityMiddleware, {"tokens": tokens, "allowed_origins": settings.allowed_origins()}),
        # Outermost: it counts and times every request, the fast lane's and refused ones too.
        (MetricsMiddleware, {"metrics": metrics}),
    ]
    document_responses(app)
    app.state.dataplane = dataplane  # for tests and tools; handlers get theirs explicitly
    app.state.config_watcher = watcher
    app.state.grpc_server = grpc_server
    app.state.startup_error = None
    app.state.on_startup_error = None
    return app
