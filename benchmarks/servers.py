"""The service's ASGI app on another HTTP server, for the comparison of servers
(`python -m benchmarks.ab CHECKOUT --servers ...`): the same app, settings and model as
`python -m service` builds, run by the server named, with its usual options for one process.

    python benchmarks/servers.py SERVER      # PYTHONPATH=<checkout>, settings from the environment

Run as a script, so the checkout's own packages (PYTHONPATH) are the ones measured. SERVER is
one of SERVERS. The service itself ships one of them (service/server.py); the others
run here only to be measured beside it (their packages are in requirements-dev.in). With
BENCH_CONSTANT_MODEL=1 the SavedModel's call answers a constant of its shapes
(benchmarks/ab.py's --constant-model).
"""

from __future__ import annotations

import asyncio
import os
import sys

SERVERS = ("uvicorn-httptools", "uvicorn-h11", "granian", "granian-uvloop", "hypercorn")


def constant_run(self, inputs, signature_name="serving_default"):
    """The SavedModel's call as --constant-model replaces it: every class 0, at probability
    0.1 each."""
    import numpy as np

    n = len(inputs) if isinstance(inputs, np.ndarray) else len(next(iter(inputs.values())))
    return {"classes": np.zeros(n, np.int64), "probabilities": np.full((n, 10), 0.1, np.float32)}


def build_service():
    """The app `python -m service` would serve, from the environment's settings."""
    sys.modules.setdefault("keras", None)  # as service/__main__.py keeps Keras out
    from artifact.quiet import quiet_tensorflow

    quiet_tensorflow()
    if os.environ.get("BENCH_CONSTANT_MODEL"):
        import artifact.saved_model

        artifact.saved_model.SavedModelPredictor.run = constant_run
    from service.app import create_app
    from service.backends.device import configure_tensorflow
    from service.backends.factory import make_backend
    from service.settings import Settings, initial_entries

    settings = Settings()
    configure_tensorflow(settings.device, *settings.tensorflow_threads(os.cpu_count()))
    backend = make_backend(settings, initial_entries(settings))
    return create_app(settings, backend, serve_grpc=False), settings


def main(server: str) -> None:
    service, settings = build_service()
    host, port = settings.host, settings.port
    if server.startswith("uvicorn-"):
        import uvicorn

        uvicorn.run(service, host=host, port=port, http=server.split("-", 1)[1], loop="asyncio",
                    access_log=False, log_level="warning", lifespan="on")  # fmt: skip
    elif server.startswith("granian"):
        from granian.constants import HTTPModes, Interfaces
        from granian.server.embed import Server

        async def serve() -> None:
            embedded = Server(service, address=host, port=port, interface=Interfaces.ASGI,
                              http=HTTPModes.http1, websockets=False, log_access=False)  # fmt: skip
            await embedded.serve()

        if server == "granian-uvloop":
            import uvloop

            uvloop.run(serve())
        else:
            asyncio.run(serve())
    elif server == "hypercorn":
        from hypercorn.asyncio import serve
        from hypercorn.config import Config

        config = Config()
        config.bind = [f"{host}:{port}"]
        config.accesslog = None
        asyncio.run(serve(service, config))
    else:
        raise SystemExit(f"unknown server {server!r}; one of {', '.join(SERVERS)}")


if __name__ == "__main__":
    main(sys.argv[1])
