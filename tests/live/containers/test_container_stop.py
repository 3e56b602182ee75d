"""`podman stop` drains the api container: /readyz turns 503 while the listener stays open,
a request already in flight is answered, and the container exits 0 within the grace period."""

from __future__ import annotations

import json
import socket
import subprocess
import time

import httpx
import pytest
from support.containers import inspect, podman, podman_tool, start_api
from support.helpers import REPO_ROOT
from support.servers import MODEL_NAME

BODY = (REPO_ROOT / "examples" / "predict.json").read_bytes()
# docker-compose.yml's stop_grace_period and the Deployment's terminationGracePeriodSeconds.
GRACE_SECONDS = 40
DRAIN_TIMEOUT_SECONDS = 30.0


@pytest.fixture
def draining_api(images, repository, tokens, run_id):
    tokens_dir, token = tokens
    container = start_api(
        f"{run_id}-stop", images["api"], repository, tokens_dir, token,
        DRAIN_SECONDS="3", SHUTDOWN_TIMEOUT_SECONDS="20",
    )  # fmt: skip
    yield container
    podman("rm", "--force", "--time", "0", container.name, check=False)


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """(status, body) of one HTTP/1.1 answer with a Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before an answer: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "the connection closed in the middle of the answer"
        body += chunk
    return int(lines[0].split()[1]), body


def test_podman_stop_drains_answers_the_request_in_flight_and_exits_0(draining_api):
    api = draining_api
    sock = socket.create_connection(("127.0.0.1", api.http_port), timeout=30)
    half = len(BODY) // 2
    # A request the server has begun: its headers and half its body sent.
    sock.sendall(
        f"POST /v1/models/{MODEL_NAME}:predict HTTP/1.1\r\nHost: api\r\n"
        f"Authorization: Bearer {api.token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(BODY)}\r\n\r\n".encode()
        + BODY[:half]
    )
    stop = subprocess.Popen(
        ["podman", "stop", "--time", str(GRACE_SECONDS), api.name],
        env=podman_tool.podman_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + DRAIN_TIMEOUT_SECONDS
        while httpx.get(f"{api.url}/readyz", timeout=5).status_code != 503:
            assert time.monotonic() < deadline, f"/readyz never said draining:\n{api.logs()}"
            time.sleep(0.1)
        sock.sendall(BODY[half:])
        status, body = read_response(sock)
    finally:
        sock.close()
        output, _ = stop.communicate(timeout=GRACE_SECONDS + 30)
    assert status == 200, body
    assert len(json.loads(body)["predictions"]) == 1
    assert stop.returncode == 0, output
    state = inspect(api.name)["State"]
    assert not state["Running"] and state["ExitCode"] == 0, (state, api.logs())
    assert "draining" in api.logs().lower()
