"""Bodies in flight, memory bounded across requests (service/ingress.py, service/budgets.py):
hundreds of slow 8 MiB uploads to a real server process over a fake backend keep its resident
memory within MAX_BODY_BYTES_IN_FLIGHT. Live: a server process and 240 MiB through loopback
take seconds; the ingress's other checks are fast, in tests/unit/service/test_ingress.py.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

from support.fakes import MODEL_NAME
from support.helpers import open_upload
from support.servers import resident_bytes, wait_until_answering

V1 = f"/v1/models/{MODEL_NAME}"


SERVE_WITH_A_FAKE = """
import sys
sys.path[:0] = [{root!r}, {tests!r}]  # this checkout's service, not whatever is installed
from support.fakes import FakeBackend
from support.servers import free_port
from service.app import create_app
from service.server import run
from service.settings import Settings
settings = Settings(host="127.0.0.1", port=free_port(), max_body_bytes=8 * 1024 * 1024,
                    max_body_bytes_in_flight={budget}, body_timeout_seconds=600,
                    header_timeout_seconds=60)
print(settings.port, flush=True)
run(create_app(settings, FakeBackend()), settings)
"""


UPLOAD_BUDGET = 64 * 2**20  # MAX_BODY_BYTES_IN_FLIGHT of the server below


def test_hundreds_of_slow_8_mib_uploads_keep_memory_within_the_budget():
    """240 clients each declare an 8 MiB body (to :predict and to /predict) and send 1 MiB
    of it, then wait: the process
    holds at most MAX_BODY_BYTES_IN_FLIGHT (64 MiB) of them; the rest are refused before
    their bodies are read, so resident memory grows by less than the budget and a margin,
    where holding every upload would take 240 MiB."""
    tests = Path(__file__).parents[2]
    code = SERVE_WITH_A_FAKE.format(root=str(tests.parent), tests=str(tests), budget=UPLOAD_BUDGET)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    sockets = []
    try:
        port = int(proc.stdout.readline())
        url = f"http://127.0.0.1:{port}"
        wait_until_answering(url)
        before = resident_bytes(proc.pid)
        part = b" " * (1024 * 1024)
        refused = 0
        for i in range(240):
            sock = open_upload(url, (f"{V1}:predict", "/predict")[i % 2], 8 * 2**20, b"")
            sockets.append(sock)
            with contextlib.suppress(OSError):
                sock.sendall(part)
        for sock in sockets:
            sock.settimeout(0.2)
            with contextlib.suppress(OSError):
                if sock.recv(12).startswith(b"HTTP/1.1 503"):
                    refused += 1
        # The most it ever held, whenever that was: no timing in the measure.
        grown = resident_bytes(proc.pid, "VmHWM") - before
        # 64 MiB holds 8 of the 8 MiB bodies; every other one is refused.
        assert refused >= 232, refused
        assert grown < 112 * 2**20, f"resident memory grew by {grown / 2**20:.0f} MiB"
    finally:
        for sock in sockets:
            sock.close()
        proc.terminate()
        proc.wait(30)
