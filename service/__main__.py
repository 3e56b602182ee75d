"""`python -m service` and `tensorflow_model_server`: read the flags and the settings, check
them, and serve (`--help` lists them)."""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path

from pydantic import ValidationError

from artifact.feedback import check_writable_dir
from artifact.logs import LogConfigError, configure_logging, formatter_for
from artifact.model_config import ConfigError
from service import tracing
from service.cli import PROG, UsageError, build_parser, parse, version_text
from service.config_files import ServerFileError, read_server_files
from service.security import (
    TokenFileError,
    anonymous_refusal,
    open_access_notice,
    read_tokens,
)
from service.settings import Settings, config_variable, initial_entries, uses_object_storage
from service.workers import die_with_supervisor, supervise, worker_index


def main(argv: list[str] | None = None) -> int:
    """Check the command line and the settings, bind the port, and serve until stopped; the
    exit code (2 with one line on stderr for anything that cannot be used)."""
    try:
        command = parse(sys.argv[1:] if argv is None else argv)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if command.help:
        print(build_parser(program_name()).format_help(), end="")
        return 0
    if command.version:
        print(version_text(), end="")
        return 0
    for warning in command.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    os.environ.update(command.environment)
    try:
        settings = Settings()
    except ValidationError as err:
        for problem in err.errors():
            field = ".".join(str(p) for p in problem["loc"]).upper() or "settings"
            if field in command.flags:
                field = f"{command.flags[field]} ({field})"
            print(
                f"error: {field}: {problem['msg']} (got {problem.get('input')!r})", file=sys.stderr
            )
        return 2
    try:
        files = read_server_files(settings)
    except ServerFileError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if worker_index() is None:
        for warning in files.warnings:
            print(f"warning: {warning}", file=sys.stderr)
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
        print(f"error: {config_variable(settings)}: {err}", file=sys.stderr)
        return 2
    if uses_object_storage(models):
        from service.backends.sources import Sources

        cache = Sources(settings.model_cache_dir).cache_dir
        try:
            check_writable_dir(cache)
        except OSError as err:
            print(f"error: MODEL_CACHE_DIR: cannot write to {cache}: {err.strerror or err}",
                  file=sys.stderr)  # fmt: skip
            return 2
    if settings.auth_tokens_file:
        try:
            read_tokens(settings.auth_tokens_file)
        except TokenFileError as err:
            print(f"error: AUTH_TOKENS_FILE: {err}", file=sys.stderr)
            return 2
    refusal = anonymous_refusal(settings.host, settings.auth_tokens_file, settings.allow_anonymous)
    if refusal is not None:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    worker = worker_index()
    if worker is not None:
        die_with_supervisor()
    sock = None
    try:
        # Bound before anything slow, so a bad address is one line and exit code 2. A worker
        # shares the port with the others (the supervisor checked nobody else holds it).
        if settings.port:
            sock = listening_socket(settings.host, settings.port, share=worker is not None)
    except OSError as err:
        print(
            f"error: HOST, PORT: cannot listen on {settings.host}:{settings.port}: "
            f"{err.strerror or err}",
            file=sys.stderr,
        )
        return 2
    if settings.grpc_port:
        try:
            # gRPC binds its own socket once the model serves; a port taken is found now.
            listening_socket(settings.host, settings.grpc_port, share=worker is not None).close()
        except OSError as err:
            if sock is not None:
                sock.close()
            print(
                f"error: HOST, GRPC_PORT: cannot listen on {settings.host}:{settings.grpc_port}"
                f": {err.strerror or err}",
                file=sys.stderr,
            )
            return 2
    if settings.grpc_socket_path:
        unusable = socket_path_problem(settings.grpc_socket_path)
        if unusable is not None:
            if sock is not None:
                sock.close()
            print(f"error: GRPC_SOCKET_PATH: {unusable}", file=sys.stderr)
            return 2
    log_format = "json" if settings.json_logs(sys.stderr.isatty()) else "text"
    try:
        configure_logging(
            log_format,
            settings.log_level,
            settings.log_config,
            who="" if worker is None else f" [worker {worker}]",
            static=None if worker is None else {"worker": worker},
        )
    except LogConfigError as err:
        if sock is not None:
            sock.close()
        print(f"error: LOG_CONFIG: {err}", file=sys.stderr)
        return 2
    tracing_problem = tracing.environment_problem(os.environ)
    if tracing_problem is not None:
        if sock is not None:
            sock.close()
        print(f"error: {tracing_problem}", file=sys.stderr)
        return 2
    if settings.workers > 1 and worker is None:
        announce_access(settings)  # once: the supervisor's, not each worker's
        if sock is not None:
            sock.close()  # the workers bind their own, beside each other
        # Stopping: each worker's drain and shutdown, and a margin before it is killed.
        stop_seconds = settings.drain_seconds + settings.shutdown_timeout_seconds + 10
        return supervise(settings.workers, stop_seconds)
    # TensorFlow is imported here, quietly, before any module that needs it, without Keras.
    from artifact.quiet import quiet_tensorflow

    keep_keras_out()
    quiet_tensorflow(formatter=formatter_for(log_format))
    # Each process that serves (each worker) traces with a provider of its own.
    tracing.start()
    try:
        return serve(settings, models, sock, announce=worker is None)
    finally:
        tracing.stop()  # what is left is exported


def keep_keras_out() -> None:
    """Make `import keras` fail in this process, before TensorFlow is imported.

    The service serves SavedModels through `tf.saved_model.load` and needs no Keras, but
    TensorFlow 2.21 imports Keras 3 whole at its own import (for its optimizers' registrations,
    skipped when Keras cannot be imported): about a quarter of the import's CPU, 2 s of 8
    measured here, paid by every start and every worker. Estimator and Keras exports (through
    model_to_estimator) load and answer the same without it
    (tests/live/service/test_compatibility.py).
    """
    # None in sys.modules is the import system's "not importable"; typeshed types the
    # mapping's values as modules only.
    sys.modules.setdefault("keras", None)  # type: ignore[arg-type]


def announce_access(settings: Settings) -> None:
    """Say once, at start, when every endpoint is open (no AUTH_TOKENS_FILE)."""
    notice = open_access_notice(settings.host, settings.auth_tokens_file)
    if notice is not None:
        logging.getLogger("service").log(*notice)


def serve(settings: Settings, models, sock: socket.socket | None, announce: bool = True) -> int:
    """Build the backend and the service, and serve on the port `sock` holds (None: PORT=0, no
    HTTP) until stopped. With `announce`, say at start when every endpoint is open (a worker
    leaves that to its supervisor)."""
    from service.app import create_app
    from service.backends.device import DeviceError, configure_tensorflow
    from service.backends.factory import make_backend
    from service.server import run

    if settings.backend == "tensorflow":
        try:
            # Before the server starts, so a missing GPU is one clear line and exit code 2.
            configure_tensorflow(settings.device, *settings.tensorflow_threads(os.cpu_count()))
        except DeviceError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    if announce:
        # After the checks that stop the start with one line: then it is said to a server.
        announce_access(settings)
    try:
        service = create_app(
            settings,
            make_backend(settings, models),
            serve_grpc=bool(settings.grpc_port or settings.grpc_socket_path),
        )
    except ServerFileError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if sock is not None:
        scheme = "https" if settings.tls_cert_file else "http"
        logging.getLogger("service").info(
            "Listening on %s://%s:%s", scheme, settings.host, settings.port
        )
        # The server binds the port itself: the socket that held it since the start lets go.
        sock.close()
    else:
        logging.getLogger("service").info("No HTTP server (PORT=0): gRPC only")
    run(service, settings)
    if service.startup_error is not None:
        # The config could not be realized (a label to a version that does not load).
        print(f"error: MODEL_CONFIG_FILE: {service.startup_error}", file=sys.stderr)
        return 2
    return 0


def program_name() -> str:
    """The name `--help` shows: tensorflow_model_server when run by that name."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return name if name == "tensorflow_model_server" else PROG


def socket_path_problem(path: str) -> str | None:
    """Why gRPC cannot listen on a UNIX socket at `path`, or None. A socket file there is
    replaced (one a stopped server left); anything else is not."""
    target = Path(path)
    if not target.parent.is_dir():
        return f"{path}: its folder {target.parent} does not exist"
    if target.exists() and not target.is_socket():
        return f"{path}: exists and is not a socket"
    if not os.access(target.parent, os.W_OK | os.X_OK):
        return f"{path}: cannot create a socket in {target.parent}"
    # A UNIX socket's address holds at most 107 bytes (sun_path).
    if len(os.fsencode(path)) > 107:
        return f"{path}: longer than a UNIX socket's 107 bytes"
    return None


def listening_socket(host: str, port: int, share: bool = False) -> socket.socket:
    """A TCP socket bound to host:port (IPv4 or IPv6, as the host resolves): the port is held
    from the start, so a port taken is found before anything slow. With `share`, other sockets
    may bind the port too (SO_REUSEPORT: the workers)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if share:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


if __name__ == "__main__":
    sys.exit(main())
