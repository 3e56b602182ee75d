"""The app factory: settings and a backend in, a `Service` out: the ASGI app (the ingress over
every protocol's routes) with its data plane, protocol adapters, metrics and budgets.

It knows nothing of the server that runs it (service/server.py, started by
service/__main__.py): the runner takes what it needs from the `Service` it is handed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from artifact.model_config import ConfigError
from service.backends.base import Backend
from service.budgets import BodyBudget, PixelBudget
from service.cli import SERVER_NAME, VERSION
from service.config_files import GRPCTLS, ServerFileError, read_server_files
from service.config_watcher import ConfigWatcher
from service.dataplane import DataPlane
from service.ingress import Ingress
from service.metrics import Metrics
from service.openapi import openapi_document
from service.protocols.docs import DocsAPI
from service.protocols.feedback import FeedbackAPI, SenderRates
from service.protocols.operations import Operations
from service.protocols.page import PageAPI
from service.protocols.simple_predict import PeopleAPI
from service.protocols.tfserving_rest import TFServingREST
from service.protocols.v2 import OpenInferenceREST
from service.routes import NoSuchMethod, RouteSource, RouteTable
from service.security import Access, TokenFile, allowed_hosts, enforces_hosts
from service.settings import Settings
from service.traffic import Traffic

if TYPE_CHECKING:  # imported where they are made: TF Serving's protos import TensorFlow
    from service.prediction_log import PredictionLogger
    from service.protocols.grpc_server import GRPCServer

log = logging.getLogger("service")

TITLE = "Estimator serving"
DESCRIPTION = (
    "Serve TensorFlow Estimator exports (any SavedModel signature). TensorFlow Serving's REST "
    "API under /v1, the Open Inference Protocol (KServe V2) under /v2, a friendlier /predict "
    "for people."
)


@dataclasses.dataclass
class Service:
    """What `create_app` builds: an ASGI app (call it as one), and what its runner needs.

    Attributes:
        ingress: the ASGI app the server runs (service/ingress.py).
        dataplane: the data plane every protocol calls (the drain turns its readiness off).
        grpc_server: TF Serving's gRPC API, started and stopped with the app; None when off.
        on_startup_error: called with the problem when the models' config cannot be realized
            at start (the runner stops the server and exits 2); None: the start fails.
        startup_error: that problem, once it happened.
    """

    dataplane: DataPlane
    grpc_server: GRPCServer | None = None
    ingress: Ingress = dataclasses.field(init=False)
    on_startup_error: Callable[[str], None] | None = None
    startup_error: str | None = None

    async def __call__(self, scope, receive, send) -> None:
        await self.ingress(scope, receive, send)

    def start_draining(self) -> None:
        """The process is about to stop: readiness turns false at once, and every answer from
        now on closes its connection (requests are still served until the listener
        closes)."""
        self.dataplane.start_draining()
        self.ingress.draining = True


@dataclasses.dataclass
class _Parts:
    """What the lifespan starts and stops."""

    dataplane: DataPlane
    watcher: ConfigWatcher | None
    feedback: FeedbackAPI
    prediction_log: PredictionLogger | None
    grpc_server: GRPCServer | None


def create_app(settings: Settings, backend: Backend, serve_grpc: bool = False) -> Service:
    """Build the service.

    Args:
        settings: the validated settings.
        backend: the model runtime (service.backends.factory.make_backend(settings) builds the
            one the settings name; tests pass fakes).
        serve_grpc: also serve TF Serving's gRPC API on HOST:GRPC_PORT, started and stopped with
            the app (the entry point asks for it unless GRPC_PORT is 0 and GRPC_SOCKET_PATH
            unset), on those and GRPC_SOCKET_PATH.

    Raises:
        ServerFileError: a TF Serving config file the settings name cannot be used
            (service/config_files.py), or MONITORING_CONFIG_FILE's path is a route's already.
    """
    files = read_server_files(settings)
    metrics = Metrics()
    dataplane, prediction_log = _dataplane(settings, backend, metrics)
    tokens = None
    if settings.auth_tokens_file:
        # One TokenFile for HTTP and gRPC: both see a rotation at the same moment.
        tokens = TokenFile(settings.auth_tokens_file, settings.auth_tokens_check_seconds)
    watcher = None
    if settings.model_config_file:
        watcher = ConfigWatcher(
            settings.model_config_file, settings.model_config_file_poll_seconds, backend
        )
    # One budget of pixels being decoded for /predict and feedback (MAX_PIXELS_IN_FLIGHT).
    pixels_in_flight = PixelBudget(settings.max_pixels_in_flight)
    feedback = FeedbackAPI(
        dataplane,
        settings.feedback_dir,
        settings.feedback_shard_images,
        settings.feedback_max_bytes,
        settings.max_body_bytes,
        settings.max_request_pixels,
        pixels_in_flight,
        settings.feedback_sender_share,
        SenderRates(settings.feedback_rate_per_minute, settings.feedback_burst_images),
    )
    # Request bytes held at once, HTTP and gRPC together (MAX_BODY_BYTES_IN_FLIGHT).
    body_budget = BodyBudget(settings.max_body_bytes_in_flight)
    grpc_server = None
    if serve_grpc:
        grpc_server = _grpc_server(
            settings, dataplane, tokens, body_budget, files.grpc_tls or _tls_pair(settings),
            _config_reloader(backend, watcher),
        )  # fmt: skip
    parts = _Parts(dataplane, watcher, feedback, prediction_log, grpc_server)
    service = Service(dataplane, grpc_server)
    tf_serving = TFServingREST(
        dataplane, watcher, settings.strict_numbers, settings.tfserving_extra_keys
    )
    people = PeopleAPI(
        dataplane, settings.max_body_bytes, settings.max_request_pixels, pixels_in_flight
    )
    v2 = OpenInferenceREST(dataplane, SERVER_NAME, VERSION, settings.max_body_bytes)
    operations = Operations(dataplane)
    protocols: list[RouteSource] = [
        tf_serving,
        v2,
        people,
        feedback,
        operations,
        PageAPI(dataplane),
    ]
    routes = [route for protocol in protocols for route in protocol.routes()]
    # Written from the same routes the ingress dispatches on, the docs' own included.
    docs = DocsAPI(lambda: openapi_document(table, TITLE, VERSION, DESCRIPTION), TITLE)
    table = RouteTable([*routes, *docs.routes()])
    if files.prometheus_path is not None and files.prometheus_path != "/metrics":
        if _answers(table, files.prometheus_path):
            raise ServerFileError(
                f"MONITORING_CONFIG_FILE: prometheus_config.path {files.prometheus_path} is "
                "one of the service's own paths; choose another"
            )
        table = RouteTable([*table.routes, operations.metrics_route(files.prometheus_path)])
    hosts = settings.allowed_host_names()
    access = Access(
        tokens,
        settings.allowed_origins(),
        allowed_hosts(settings.host, hosts),
        enforce_hosts=enforces_hosts(settings.host, hosts),
    )
    service.ingress = Ingress(
        table,
        metrics,
        access,
        settings.max_body_bytes,
        settings.body_timeout_seconds,
        body_budget,
        lifespan=_lifespan(parts, service),
        unmatched={"/v1": tf_serving.malformed_url},
        request_timeout=settings.request_timeout_seconds,
    )
    return service


def _answers(table: RouteTable, path: str) -> bool:
    """Whether a route of the table answers `path` (for some method)."""
    try:
        return table.match("GET", path) is not None
    except NoSuchMethod:
        return True


def _config_reloader(backend: Backend, watcher: ConfigWatcher | None):
    """What gRPC's HandleReloadConfigRequest calls with a new config's entries: through the
    config watcher when MODEL_CONFIG_FILE is watched (its status says what was applied, from
    where), else the backend's own apply. None when another server loads the models
    (BACKEND=tfserving: a reload goes to TF Serving itself)."""
    if not backend.loads_models:
        return None

    async def reload(entries) -> list[str]:
        if watcher is not None:
            return await watcher.apply(entries, "HandleReloadConfigRequest")
        return await backend.apply_config(entries)

    return reload


def _dataplane(
    settings: Settings, backend: Backend, metrics: Metrics
) -> tuple[DataPlane, PredictionLogger | None]:
    """The data plane, with canary/shadow traffic and, when sampled, its prediction logger
    (started and stopped by the lifespan); (data plane, logger or None)."""
    traffic = Traffic(settings.canary_percent, settings.shadow_percent)
    prediction_log = None
    # The settings refuse a sampling rate without a folder.
    log_dir = settings.prediction_log_dir
    if settings.prediction_log_sampling_rate > 0 and log_dir:
        # Imported only when logging is on: TF Serving's protos import TensorFlow.
        from service.prediction_log import PredictionLogger

        prediction_log = PredictionLogger(
            log_dir,
            settings.prediction_log_sampling_rate,
            settings.prediction_log_file_records,
            settings.prediction_log_max_bytes,
            metrics.registry,
        )
    dataplane = DataPlane(backend, metrics, settings.max_images, traffic, prediction_log)
    return dataplane, prediction_log


def _grpc_server(
    settings: Settings,
    dataplane: DataPlane,
    tokens,
    body_budget: BodyBudget,
    tls: GRPCTLS | None,
    reload_config,
):
    # Imported only when asked for: TF Serving's protos import TensorFlow (seconds).
    from service.protocols.grpc_server import GRPCServer
    from service.protocols.v2_grpc import OpenInferenceGRPC

    return GRPCServer(
        dataplane,
        settings.host,
        settings.grpc_port,
        settings.grpc_max_message_bytes,
        tokens,
        share_port=settings.workers > 1,
        grace=settings.shutdown_timeout_seconds,
        services=[OpenInferenceGRPC(dataplane, SERVER_NAME, VERSION)],
        tensor_content=settings.grpc_tensor_content,
        strict_numbers=settings.strict_numbers,
        tls=tls,
        socket_path=settings.grpc_socket_path,
        reload_config=reload_config,
        allow_plaintext_tokens=settings.grpc_allow_plaintext_tokens,
        max_concurrent_rpcs=settings.grpc_max_concurrent_rpcs,
        body_budget=body_budget,
        receive_timeout=settings.body_timeout_seconds,
    )


def _tls_pair(settings: Settings) -> GRPCTLS | None:
    """TLS_CERT_FILE and TLS_KEY_FILE for gRPC (no client certificates); None without them."""
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    chain = Path(settings.tls_cert_file).read_bytes()
    return GRPCTLS(chain, Path(settings.tls_key_file).read_bytes())


def _lifespan(parts: _Parts, service: Service):
    """Start the models, the config watcher, the feedback store, the prediction log and gRPC
    (in that order), and stop them in reverse."""

    @contextlib.asynccontextmanager
    async def lifespan():
        try:
            await parts.dataplane.start()
        except ConfigError as err:
            # A config the backend cannot realize at start (a label to a version that does not
            # load): the runner stops the server and exits 2 with this one line.
            if service.on_startup_error is None:
                raise
            service.startup_error = str(err)
            service.on_startup_error(str(err))
            await parts.dataplane.close()
            yield
            return
        # TF and the model leave ~280k long-lived objects (a full collection: ~160 ms here);
        # freezing them keeps collections under load, and their latency spikes, short.
        gc.collect()
        gc.freeze()
        if parts.watcher is not None:
            parts.watcher.start()
        await parts.feedback.start()
        if parts.prediction_log is not None:
            await asyncio.to_thread(parts.prediction_log.start)
        try:
            if parts.grpc_server is not None:
                # After the data plane, whose batcher lives on this loop, and on this loop too.
                await parts.grpc_server.start()
            yield
        finally:
            if parts.grpc_server is not None:
                await parts.grpc_server.stop()
            if parts.watcher is not None:
                await parts.watcher.close()
            await parts.dataplane.close()
            await parts.feedback.close()
            if parts.prediction_log is not None:
                await asyncio.to_thread(parts.prediction_log.close)
            log.info("Shut down: the models, the feedback store and gRPC are closed")

    return lifespan
