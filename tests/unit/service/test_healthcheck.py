"""The API image's HEALTHCHECK (service/healthcheck.py): /readyz on the port the service
listens on, the first process's --rest_api_port winning over PORT as the flag wins in the
service; gRPC's port taking a connection when REST is off."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest
from support.servers import free_port

from service import healthcheck


@pytest.mark.parametrize(
    "argv, name, value",
    [
        pytest.param(["python", "-m", "service", "--rest_api_port=8080"], "rest_api_port", "8080",
                     id="equals"),
        pytest.param(["x", "--rest_api_port", "9", "--rest_api_port=7"], "rest_api_port", "7",
                     id="last-wins"),
        pytest.param(["x", "--rest_api_port_x=1"], "rest_api_port", None, id="another-flag"),
        pytest.param(["x", "--port=9000", "--rest_api_port=8080"], "port", "9000", id="port"),
        pytest.param(["x", "--port"], "port", None, id="no-value"),
    ],
)  # fmt: skip
def test_a_flag_is_read_as_the_service_reads_it(argv, name, value):
    assert healthcheck.flag(argv, name) == value


class _Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/readyz" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def ready_port():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Ready)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_the_flag_wins_over_port(ready_port):
    argv = ["python", "-m", "service", f"--rest_api_port={ready_port}"]
    assert healthcheck.check(argv, {"PORT": str(free_port())})
    assert healthcheck.check([], {"PORT": str(ready_port)})
    with pytest.raises(OSError):
        healthcheck.check([], {"PORT": str(free_port())})


def test_with_rest_off_grpcs_port_must_take_a_connection():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert healthcheck.check(["x", "--rest_api_port=0", f"--port={port}"], {})
        assert healthcheck.check([], {"PORT": "0", "GRPC_PORT": str(port)})
    with pytest.raises(OSError):
        healthcheck.check([], {"PORT": "0", "GRPC_PORT": str(port)})


def test_the_first_processes_arguments_are_read_from_proc(tmp_path):
    cmdline = tmp_path / "cmdline"
    cmdline.write_bytes(b"/opt/venv/bin/python\0-m\0service\0--rest_api_port=8080\0")
    assert healthcheck.first_process_argv(cmdline) == [
        "/opt/venv/bin/python", "-m", "service", "--rest_api_port=8080"
    ]  # fmt: skip
    assert healthcheck.first_process_argv(tmp_path / "missing") == []
