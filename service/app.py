"""The app factory: settings and a backend in, a FastAPI app with its data plane, protocol
adapters, metrics and error handling out."""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.backends.base import Backend
from service.dataplane import DataPlane
from service.errors import ServiceError, error_response
from service.fastlane import FastLane
from service.metrics import Metrics, MetricsMiddleware
from service.protocols.operations import Operations
from service.protocols.page import PageAPI
from service.protocols.people import PeopleAPI
from service.protocols.tfserving_rest import TFServingREST
from service.settings import Settings


def create_app(settings: Settings, backend: Backend) -> FastAPI:
    """Build the service.

    Args:
        settings: the validated settings.
        backend: the model runtime (service.backends.factory.make_backend(settings) builds the
            one the settings name; tests pass fakes).
    """
    metrics = Metrics()
    dataplane = DataPlane(backend, metrics, settings.max_images)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await dataplane.start()
        # TF and the model leave ~280k long-lived objects (a full collection: ~160 ms here);
        # freezing them keeps collections under load, and their latency spikes, short.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await dataplane.close()

    app = FastAPI(
        title="Estimator serving",
        description="Classify 28x28 grayscale images with an exported TensorFlow Estimator. "
        "TensorFlow Serving's REST API under /v1, a friendlier /predict for people.",
        version="0.1.0",
        lifespan=lifespan,
    )
    tf_serving = TFServingREST(dataplane, settings.max_body_bytes)
    people = PeopleAPI(dataplane, settings.max_body_bytes)
    page = PageAPI(settings.model_name, Path(settings.model_base_path) / settings.model_name)
    for adapter in (Operations(dataplane), tf_serving, people, page):
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
    return app
