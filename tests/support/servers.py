"""Free loopback ports, and real `python -m service` processes started on them.

The one place tests get a port from and start the service from (the fast tier's in-process
uvicorn over fakes is `fakes.threaded_server`, which binds its own socket). Plain helpers, no
fixtures: tests/live/service/conftest.py holds the shared server fixtures.
"""

from __future__ import annotations

import ast
import functools
import os
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from support.helpers import REPO_ROOT
from support.sides import service_python

MODEL_NAME = "fashion_mnist"
MAX_IMAGES = 16
MAX_BODY_BYTES = 200_000
# TensorFlow 2.21's import alone took 6 s on a quiet machine and up to a minute with both test
# sides and a training run on the two cores: a start that takes longer than this is a failure.
START_TIMEOUT_SECONDS = 120.0
STOP_TIMEOUT_SECONDS = 30.0


@functools.cache
def settings_vars() -> frozenset[str]:
    """The environment variables the service reads (its Settings fields, upper-cased).

    Read from service/settings.py's source, not by importing it: the training side's tests
    start the service too, from an interpreter without its packages (support/sides.py).
    tests/unit/service/test_settings.py holds this to `Settings.model_fields`.
    """
    tree = ast.parse((REPO_ROOT / "service" / "settings.py").read_text(encoding="utf-8"))
    (settings,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings"]
    return frozenset(
        statement.target.id.upper()
        for statement in settings.body
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
    )


def free_ports(count: int) -> list[int]:
    """Distinct loopback ports nobody listens on right now (all held open until all are chosen).

    Another process may take one before the test binds it: `start_server` retries once.
    """
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    (port,) = free_ports(1)
    return port


def service_env(**overrides: str) -> dict[str, str]:
    """The environment for `python -m service`: ours minus any service settings and
    OpenTelemetry's variables (which turn tracing on), plus these."""
    # A developer's shell (say DEVICE=gpu or PORT=8000) must not change what the tests start.
    ignored = settings_vars()
    env = {
        k: v
        for k, v in os.environ.items()
        if k.upper() not in ignored and not k.upper().startswith("OTEL_")
    }
    env["PYTHONUNBUFFERED"] = "1"
    # No test listens on TF Serving's well-known port: those that test gRPC give a free one.
    env["GRPC_PORT"] = "0"
    env.update(overrides)
    return env


def run_service(
    timeout: float = 120.0, args: tuple[str, ...] = (), **overrides: str
) -> subprocess.CompletedProcess:
    """Run `python -m service` with `args` to completion (for settings or arguments that must
    make it exit).

    On a free port unless PORT is given: some refusals come after the port is bound, and the
    default port (8000) may be anyone's.
    """
    return subprocess.run(
        [service_python(), "-m", "service", *args],
        cwd=REPO_ROOT,
        env=service_env(**{"PORT": str(free_port()), **overrides}),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class Server:
    """One `python -m service` subprocess with its output captured to a file.

    Args:
        grpc: serve TF Serving's gRPC API too, on a free port of its own (`grpc_port`);
            otherwise gRPC is off unless settings give GRPC_PORT.
        settings: the service's environment variables (PORT is always a free port).
    """

    def __init__(self, log_path: Path, grpc: bool = False, **settings: str):
        self.log_path = log_path
        self.settings = settings
        self.port, grpc_port = free_ports(2)
        self.grpc_port = grpc_port if grpc else None
        # With TLS_CERT_FILE the service speaks HTTPS; its own certificate is the one to trust.
        cert = settings.get("TLS_CERT_FILE")
        self.verify = ssl.create_default_context(cafile=cert) if cert else True
        self.url = f"{'https' if cert else 'http'}://127.0.0.1:{self.port}"
        defaults = {
            "MODEL_NAME": MODEL_NAME,
            "HOST": "127.0.0.1",
            "MAX_IMAGES": str(MAX_IMAGES),
            "MAX_BODY_BYTES": str(MAX_BODY_BYTES),
            "MODEL_POLL_SECONDS": "0",
            "LOG_LEVEL": "info",
            # Stopping a test server needs no drain (the tests of draining set their own).
            "DRAIN_SECONDS": "0",
        }
        ports = {"PORT": str(self.port)} | ({"GRPC_PORT": str(grpc_port)} if grpc else {})
        env = service_env(**{**defaults, **settings, **ports})
        self._log_file = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [service_python(), "-m", "service"],
            cwd=REPO_ROOT,
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        """Everything the server printed so far (stdout and stderr interleaved)."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_until(self, path: str, timeout: float = START_TIMEOUT_SECONDS) -> None:
        """Poll GET path until it answers 200; fail with the server's output if it dies."""
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.url, timeout=5.0, verify=self.verify) as client:
            while True:
                code = self.process.poll()
                if code is not None:
                    pytest.fail(
                        f"the service exited with code {code} before {path} answered 200; "
                        f"its output:\n{self.log()}"
                    )
                try:
                    if client.get(path).status_code == 200:
                        return
                except httpx.TransportError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(
                        f"the service did not answer 200 on {path} within {timeout:.0f} s; "
                        f"its output:\n{self.log()}"
                    )
                time.sleep(0.2)

    def stop(self) -> int:
        """SIGTERM, wait for the graceful shutdown (kill if it hangs); the exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log_file.close()
        return self.process.returncode


def start_server(
    log_path: Path, wait_for: str = "/readyz", grpc: bool = False, **settings: str
) -> Server:
    """Start a server (see `Server`) and wait until `wait_for` answers 200; retry once, on
    other ports, when another process took one of them first."""
    for attempt in range(2):
        server = Server(log_path, grpc=grpc, **settings)
        try:
            server.wait_until(wait_for)
            return server
        except pytest.fail.Exception:
            server.stop()
            if attempt == 0 and "address already in use" in server.log().lower():
                continue
            raise
    raise AssertionError("unreachable")


def model_config(models: dict[str, Path]) -> str:
    """TF Serving's model config text serving every model of `models` (name -> its folder)."""
    entries = "".join(
        f'  config {{ name: "{name}" base_path: "{path}" model_platform: "tensorflow" }}\n'
        for name, path in models.items()
    )
    return f"model_config_list {{\n{entries}}}\n"


def serve_models(models: dict[str, Path], root: Path, **settings: str) -> Server:
    """`python -m service` serving every model of `models` (name -> its folder) from one model
    config written under root, gRPC on; its log in root."""
    config = root / "models.config"
    config.write_text(model_config(models))
    return start_server(root / "server.log", grpc=True, MODEL_CONFIG_FILE=str(config), **settings)


def copy_repository(trained_model, destination: Path) -> Path:
    """A private copy of the trained model's repository; returns the new MODEL_BASE_PATH."""
    base = destination / "models"
    shutil.copytree(trained_model.export_base.parent, base)
    return base


def add_version(model_dir: Path, source: str, target: str) -> Path:
    """Copy version `source` to `target` atomically: build under a hidden name, then rename."""
    staging = model_dir / f".staging-{target}"
    shutil.copytree(model_dir / source, staging)
    os.rename(staging, model_dir / target)
    return model_dir / target


def wait_for(condition, what: str, server: Server, timeout: float = 60.0):
    """Poll until condition() is truthy (bounded); fail with the server's output otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if server.process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}; the service's output:\n{server.log()}")
        time.sleep(0.1)


def wait_until_answering(url: str, path: str = "/healthz", timeout: float = 60.0) -> None:
    """Wait (bounded) until a server just started answers `path` with 200."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + path, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url}{path} did not answer 200 within {timeout:g} s")
        time.sleep(0.05)


def resident_bytes(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory now (VmRSS), or the most it ever had (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field}")
