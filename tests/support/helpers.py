"""Plain helpers several test files share (fixtures live in the conftest.py files)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import socket
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

# The checkout under test: tests/support/helpers.py is two folders below it.
REPO_ROOT = Path(__file__).resolve().parents[2]


def png_bytes(pixels: np.ndarray, fmt: str = "PNG", mode: str | None = None) -> bytes:
    """uint8 pixels (grayscale [h, w] or RGB [h, w, 3]) encoded as an image file.

    Args:
        fmt: Pillow's format name (PNG, JPEG, GIF, ...).
        mode: convert to this Pillow mode first ("RGB" makes a gray image a color file).
    """
    image = Image.fromarray(pixels)
    if mode is not None:
        image = image.convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


def assert_one_error_line(err: str, *fragments: str) -> str:
    """Assert a command wrote exactly one `error: ...` line holding every fragment; the line."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert "Traceback" not in err
    return lines[0]


def error_message(response: httpx.Response, status: int) -> str:
    """Assert a TF Serving style error body {"error": "..."} with this status; the message."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    assert isinstance(body["error"], str) and body["error"], body
    return body["error"]


def ok_json(response: httpx.Response) -> dict:
    """Assert a 200 JSON answer; its body."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    return response.json()


def require_tool(command: str, package: str) -> None:
    """A Debian tool a test drives. Missing where `make setup` installs it (as root): the test
    fails, since setup went wrong. Missing for a user who cannot install it: skipped, saying
    what to run."""
    if shutil.which(command):
        return
    if os.geteuid() == 0:
        pytest.fail(f"{command} not found: run `make setup` (it installs Debian's {package})")
    pytest.skip(f"{command} not found and this user cannot install it: run "
                f"`sudo apt-get install {package}`")  # fmt: skip


# --- raw HTTP/1.1 over a socket, for what an HTTP client library would not send ---------------


def raw_exchange(
    url: str, data: bytes, read_timeout: float = 30.0, one_response: bool = False
) -> bytes:
    """Send raw bytes to the server and read what it answers until it closes (or, with
    one_response, until one whole response has come: the connection may stay open)."""
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=read_timeout) as sock:
        # The server may close before it has read everything: what it said counts.
        with contextlib.suppress(OSError):
            sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
            if one_response and response_complete(b"".join(chunks)):
                break
    return b"".join(chunks)


def response_complete(data: bytes) -> bool:
    head, found, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", head)
    return bool(found and length and len(body) >= int(length.group(1)))


def http_answers(data: bytes) -> list[tuple[bytes, bytes]]:
    """(head, body) of each whole response in a byte stream (bodies by content-length)."""
    answers = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?im)^content-length:\s*(\d+)", head).group(1))
        answers.append((head.lower(), rest[:length]))
        data = rest[length:]
    return answers
