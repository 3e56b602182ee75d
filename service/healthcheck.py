"""The API image's HEALTHCHECK: `python -m service.healthcheck` exits 0 when the service in
this container is ready (1 otherwise).

It asks /readyz on the port the service listens on: the `--rest_api_port` of the container's
first process (a manifest written for TF Serving passes its ports as flags, which win over the
environment), else PORT. With no HTTP (port 0) it checks that gRPC's port (`--port`, else
GRPC_PORT) takes a connection. Standard library only, and nothing of the service imported: it
runs every few seconds beside it.
"""

from __future__ import annotations

import os
import socket
import ssl
import sys
import urllib.request
from pathlib import Path

TIMEOUT_SECONDS = 4.0


def flag(argv: list[str], name: str) -> str | None:
    """The last value of `--name=value` or `--name value` in argv (TF Serving's syntax and
    argparse's), or None."""
    value = None
    for at, argument in enumerate(argv):
        if argument.startswith(f"--{name}="):
            value = argument.split("=", 1)[1]
        elif argument == f"--{name}" and at + 1 < len(argv):
            value = argv[at + 1]
    return value


def first_process_argv(proc: Path = Path("/proc/1/cmdline")) -> list[str]:
    """The container's first process's arguments (empty when they cannot be read)."""
    try:
        return [part.decode() for part in proc.read_bytes().split(b"\0") if part]
    except (OSError, UnicodeDecodeError):
        return []


def check(argv: list[str], environ: dict[str, str]) -> bool:
    """Whether the service is ready, reading its ports as `argv` and `environ` give them."""
    port = int(flag(argv, "rest_api_port") or environ.get("PORT", "8501"))
    if port == 0:
        grpc_port = int(flag(argv, "port") or environ.get("GRPC_PORT", "8500"))
        with socket.create_connection(("127.0.0.1", grpc_port), timeout=TIMEOUT_SECONDS):
            return True
    scheme, context = "http", None
    if environ.get("TLS_CERT_FILE"):
        # Its own certificate, asked on loopback: the check is of readiness, not identity.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        scheme = "https"
    url = f"{scheme}://127.0.0.1:{port}/readyz"
    with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS, context=context) as answer:
        return answer.status == 200


def main() -> int:
    try:
        return 0 if check(first_process_argv(), dict(os.environ)) else 1
    except (OSError, ValueError) as err:
        print(f"not ready: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
