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
from service.backends.base import Backend
from service.config_watcher import ConfigWatcher
from service.dataplane import DataPlane
from service.errors import ServiceError, error_response
from service.fastlane import FastLane
from service.metrics import Metrics, MetricsMiddleware
from service.protocols.feedback import FeedbackAPI
from service.protocols.operations import Operations
from service.protocols.people import PeopleAPI
from service.protocols.tfserving_rest import TFServingREST
from service.settings import Settings
from service.traffic import Traffic


def create_app(settings: Settings, backend: Backend) -> FastAPI:
    """Build the service.

    Args:
        settings: the validated settings.
        backend: the model runtime (service.backends.factory.make_backend(settings) builds the
            one the settings name; tests pass fakes).
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
            yield
        finally:
            if watcher is not None:
                await watcher.close()
            await dataplane.close()
            await feedback.close()
            if prediction_log is not None:
                await asyncio.to_thread(prediction_log.close)

    app = FastAPI(
        title="Estimator serving",
        description="Classify 28x28 grayscale images with an exported TensorFlow Estimator. "
        "TensorFlow Serving's REST API under /v1, a friendlier /predict for people.",
        version="0.1.0",
        lifespan=lifespan,
    )
    tf_serving = TFServingREST(dataplane, settings.max_body_bytes, watcher)
    people = PeopleAPI(dataplane, settings.max_body_bytes)
    feedback = FeedbackAPI(
        dataplane,
        settings.feedback_dir,
        settings.feedback_shard_images,
        settings.feedback_max_bytes,
        settings.max_body_bytes,
    )
    for adapter in (Operations(dataplane), tf_serving, people, feedback):
        app.include_router(adapter.router)

    async def handle_error(request: Request, err: Exception):
        return error_response(request, err)

    # The specific classes are handled inside the app; Exception only at its outermost layer.
    for error_class in (ServiceError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(error_class, handle_error)

    app.add_middleware(FastLane, routes=tf_serving.fast_routes(), error_response=error_response)
    # Added last, so outermost: it counts the fast lane's requests too.
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.state.dataplane = dataplane  # for tests and tools; handlers get theirs explicitly
    app.state.config_watcher = watcher
    app.state.startup_error = None
    app.state.on_startup_error = None
    return app
