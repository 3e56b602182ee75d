"""Plain helpers several test files share (fixtures live in the conftest.py files)."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import io
import json
import logging
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


def tree(root: Path) -> dict[str, tuple]:
    """Every file and folder under root (root too), links not followed: kind, mode, size,
    mtime in ns, content hash. Equal before and after: not a file, mode or timestamp changed."""
    found = {}
    for path in [root, *sorted(root.rglob("*"))]:
        stat = path.lstat()
        regular = path.is_file() and not path.is_symlink()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if regular else None
        found[str(path.relative_to(root))] = (
            path.is_dir(), stat.st_mode, stat.st_size, stat.st_mtime_ns, digest
        )  # fmt: skip
    return found


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


def _as_text(line: str) -> str:
    """A line as text: a JSON log line (`--log-format json`, as the shipped CronJobs run) is
    its message, and one that says `error:` must be logged at ERROR."""
    if not line.startswith("{"):
        return line
    record = json.loads(line)
    message = record["message"]
    if message.startswith("error: "):
        assert record["level"] == "ERROR", line
    return message


def assert_one_error_line(err: str, *fragments: str) -> str:
    """Assert a command wrote exactly one `error: ...` line holding every fragment (as text,
    or as the message of one JSON log line); the line."""
    lines = [_as_text(line) for line in err.splitlines() if line.strip()]
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


def response_complete(data: bytes) -> bool:
    """Whether raw bytes hold a whole HTTP answer: its head, and the body its Content-Length
    says."""
    head, found, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", head)
    return bool(found and length and len(body) >= int(length.group(1)))


def open_upload(url: str, path: str, length: int, first: bytes) -> socket.socket:
    """A connection that declared a body of `length` bytes and sent only `first` of it."""
    host, port = url.split("//")[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n".encode()
        + first
    )
    return sock


def certificate_authority() -> dict[str, bytes]:
    """A CA, a server certificate it signed (localhost, 127.0.0.1) and a client certificate it
    signed, with their keys, as PEM: ca, server_cert, server_key, client_cert, client_key
    (mutual TLS, SSL_CONFIG_FILE's client_verify)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def sign(subject, key, issuer, issuer_key, ca=False, san=None):
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san is not None:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    def pem_key(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())  # fmt: skip

    ca_key, server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = sign(name("test CA"), ca_key, name("test CA"), ca_key, ca=True)
    server = sign(name("localhost"), server_key, ca.subject, ca_key,
                  san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])  # fmt: skip
    client = sign(name("client"), client_key, ca.subject, ca_key)
    encoding = serialization.Encoding.PEM
    return {
        "ca": ca.public_bytes(encoding),
        "server_cert": server.public_bytes(encoding),
        "server_key": pem_key(server_key),
        "client_cert": client.public_bytes(encoding),
        "client_key": pem_key(client_key),
    }


def self_signed(tmp_path):
    """A self-signed certificate for 127.0.0.1 and its key, as PEM files: (cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@contextlib.contextmanager
def logged(name: str, level: int = logging.INFO):
    """The records a logger (and its children) emits at `level` or above, caught by a handler
    on the logger itself: what the code logs, whatever the suite's earlier tests and
    libraries did to the root logger and its handlers (caplog listens at the root)."""
    logger = logging.getLogger(name)
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Collect(level)
    saved = logger.level, logger.disabled
    logging.disable(logging.NOTSET)
    logger.setLevel(level)
    logger.disabled = False
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.disabled = saved[1]
