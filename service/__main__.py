"""`python -m service`: read settings from the environment and serve with uvicorn."""

from __future__ import annotations

import logging
import socket
import sys

from pydantic import ValidationError

from artifact.feedback import check_writable_dir
from artifact.model_config import ConfigError
from service.config_watcher import initial_entries
from service.settings import Settings


def main() -> int:
    try:
        settings = Settings()
    except ValidationError as err:
        for problem in err.errors():
            field = ".".join(str(p) for p in problem["loc"]).upper() or "settings"
            print(
                f"error: {field}: {problem['msg']} (got {problem.get('input')!r})", file=sys.stderr
            )
        return 2
    for variable, folder in (
        ("FEEDBACK_DIR", settings.feedback_dir),
        ("PREDICTION_LOG_DIR", settings.prediction_log_dir),
    ):
        if folder:
            try:
                check_writable_dir(folder)
            except OSError as err:
                print(f"error: {variable}: cannot write to {folder}: {err.strerror or err}",
                      file=sys.stderr)  # fmt: skip
                return 2
    try:
        models = initial_entries(settings)
    except ConfigError as err:
        print(f"error: MODEL_CONFIG_FILE: {err}", file=sys.stderr)
        return 2
    try:
        # Bound before anything slow, so a bad address is one line and exit code 2.
        sock = listening_socket(settings.host, settings.port)
    except OSError as err:
        print(
            f"error: HOST, PORT: cannot listen on {settings.host}:{settings.port}: "
            f"{err.strerror or err}",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # TensorFlow is imported here, quietly, before any module that needs it.
    from artifact.quiet import quiet_tensorflow

    quiet_tensorflow()
    return serve(settings, models, sock)


def serve(settings: Settings, models, sock: socket.socket) -> int:
    """Build the backend and the app, and run uvicorn on the bound socket until stopped."""
    import uvicorn

    from service.app import create_app
    from service.backends.device import DeviceError, configure_tensorflow
    from service.backends.factory import make_backend

    if settings.backend == "tensorflow":
        try:
            # Before uvicorn starts, so a missing GPU is one clear line and exit code 2.
            configure_tensorflow(
                settings.device, settings.intra_op_threads, settings.inter_op_threads
            )
        except DeviceError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    app = create_app(settings, make_backend(settings, models))
    config = uvicorn.Config(
        app,
        loop="uvloop",
        http="httptools",
        log_level=settings.log_level,
        # Let in-flight requests finish on SIGTERM/Ctrl-C before the model is closed.
        timeout_graceful_shutdown=30,
    )
    server = uvicorn.Server(config)

    def stop_at_start(problem: str) -> None:
        app.state.startup_error = problem
        server.should_exit = True

    app.state.on_startup_error = stop_at_start
    logging.getLogger("service").info("Listening on http://%s:%s", settings.host, settings.port)
    server.run(sockets=[sock])
    if app.state.startup_error is not None:
        # The config could not be realized (a label to a version that does not load).
        print(f"error: MODEL_CONFIG_FILE: {app.state.startup_error}", file=sys.stderr)
        return 2
    return 0


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (IPv4 or IPv6, as the host resolves); uvicorn listens."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


if __name__ == "__main__":
    sys.exit(main())
