"""Memory bounded across requests, measured: a server process holds many large gRPC calls
and many slow image decodes at once, and its peak resident memory (VmHWM) stays within what
GRPC_MAX_CONCURRENT_RPCS and MAX_PIXELS_IN_FLIGHT let it hold.

Slow: a server process that imports TF Serving's protos (TensorFlow), and ~250 MB through
loopback. No model runs: the backend holds every call until the test lets them finish, and
the decoder holds each decoded photo until then too (a slow decoder, made deterministic).
"""

from __future__ import annotations

import concurrent.futures
import io
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
from PIL import Image
from support.fakes import MODEL_NAME
from support.servers import free_port, resident_bytes, wait_until_answering
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

TOKEN = "predictor-token-0123456789"
MiB = 2**20
GRPC_CALLS, GRPC_CAP = 24, 3
IMAGES_PER_CALL = 2000  # 6.3 MB of float32 per message
UPLOADS, PHOTO = 8, (4000, 3000)  # 12 megapixels, 36 MB once decoded as RGB
PIXELS_CAP = 2 * PHOTO[0] * PHOTO[1]  # two photos decoding at once
WAIT_SECONDS = 60.0
ROOT = Path(__file__).resolve().parents[3]

SERVE = """
import asyncio, io, sys, threading
sys.path[:0] = [{root!r}, {tests!r}]  # this checkout's service, whatever the working folder
from PIL import Image
from support.fakes import FakeBackend
from support.servers import free_port
from service.codecs import images
from service.server import run
from service.app import create_app
from service.settings import Settings

released = threading.Event()
loops = []

class HeldBackend(FakeBackend):
    # Every model call waits until the test says so (a line on stdin).
    async def predict(self, *args, **kwargs):
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        loops.append((loop, done))
        if released.is_set():
            done.set_result(None)
        await done
        return await super().predict(*args, **kwargs)

original = images.image_file_pixels

def slow_decode(data, where, invert):
    # A slow decoder: the photo decoded whole, and held until the test says so.
    image = Image.open(io.BytesIO(data))
    image.load()
    released.wait()
    return original(data, where, invert)

images.image_file_pixels = slow_decode

def release():
    sys.stdin.readline()
    released.set()
    for loop, done in list(loops):
        loop.call_soon_threadsafe(lambda d=done: d.done() or d.set_result(None))

threading.Thread(target=release, daemon=True).start()
settings = Settings(grpc_port={grpc_port}, auth_tokens_file={tokens!r},
                    grpc_allow_plaintext_tokens=True, grpc_max_concurrent_rpcs={grpc_cap},
                    max_images=4096, feedback_dir={feedback!r}, max_body_bytes=8 * 1024 * 1024,
                    max_request_pixels={request_pixels}, max_pixels_in_flight={pixels_cap})
settings = settings.model_copy(update={{"host": "127.0.0.1", "port": free_port()}})
backend = HeldBackend()
print(settings.port, flush=True)
run(create_app(settings, backend, serve_grpc=True), settings)
"""


def photo_png() -> bytes:
    """A 12-megapixel RGB photo that compresses to little: large only once decoded."""
    out = io.BytesIO()
    Image.new("RGB", PHOTO, (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


def wait_for(condition, what: str, seen) -> None:
    """Wait for a condition the server makes true (bounded; not a timing assertion)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; answered so far: {seen()}")
        time.sleep(0.01)


def refused_count(futures, refused) -> int:
    return sum(1 for f in futures if f.done() and refused(f))


def test_many_large_grpc_calls_and_slow_decodes_stay_within_the_caps(tmp_path):
    """24 gRPC Predict calls of 6.3 MB each and 8 uploads of a photo that decodes to 36 MB,
    all at once: the server serves 3 calls (GRPC_MAX_CONCURRENT_RPCS) and decodes 2 photos
    (MAX_PIXELS_IN_FLIGHT) and refuses the rest at once, so its peak resident memory grows
    by less than 200 MiB (151 MiB when written). Without the caps the same load held them
    all: ~24 x 13 MB (each message and its images) and 6 x 36 MB (the decoding threads);
    measured once with both caps lifted, 808 MiB."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN} predict,feedback,status\n")
    grpc_port = free_port()
    code = SERVE.format(
        root=str(ROOT),
        tests=str(ROOT / "tests"),
        grpc_port=grpc_port,
        tokens=str(tokens),
        grpc_cap=GRPC_CAP,
        feedback=str(tmp_path / "feedback"),
        request_pixels=PHOTO[0] * PHOTO[1],
        pixels_cap=PIXELS_CAP,
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL_NAME
    request.inputs["image"].dtype = 1  # DT_FLOAT
    for size in (IMAGES_PER_CALL, 28, 28):
        request.inputs["image"].tensor_shape.dim.add().size = size
    request.inputs["image"].tensor_content = np.zeros(
        (IMAGES_PER_CALL, 28, 28), np.float32
    ).tobytes()
    granted = (("authorization", f"Bearer {TOKEN}"),)
    photo = photo_png()
    try:
        url = f"http://127.0.0.1:{int(proc.stdout.readline())}"
        headers = {"authorization": f"Bearer {TOKEN}"}
        wait_until_answering(url)
        before = resident_bytes(proc.pid)
        with (
            grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel,
            concurrent.futures.ThreadPoolExecutor(UPLOADS) as pool,
            httpx.Client(base_url=url, headers=headers, timeout=WAIT_SECONDS) as http,
        ):
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            calls = [
                stub.Predict.future(request, metadata=granted, timeout=WAIT_SECONDS)
                for _ in range(GRPC_CALLS)
            ]
            feedback = f"/v1/models/{MODEL_NAME}/feedback"
            files = [("files", ("photo.png", photo, "image/png"))]
            uploads = [
                pool.submit(http.post, feedback, files=files, data={"labels": "1"})
                for _ in range(UPLOADS)
            ]

            def grpc_refused(call):
                return call.exception() is not None and (
                    call.exception().code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                )

            def upload_refused(upload):
                return upload.result().status_code == 503

            wait_for(
                lambda: refused_count(calls, grpc_refused) == GRPC_CALLS - GRPC_CAP,
                "the calls past GRPC_MAX_CONCURRENT_RPCS to be refused",
                lambda: [c.exception() and c.exception().code() for c in calls if c.done()],
            )
            wait_for(
                lambda: refused_count(uploads, upload_refused) == UPLOADS - 2,
                "the uploads past MAX_PIXELS_IN_FLIGHT to be refused",
                lambda: [u.result().status_code for u in uploads if u.done()],
            )
            # The most it ever held, whenever that was: no timing in the measure.
            grown = resident_bytes(proc.pid, "VmHWM") - before
            proc.stdin.write("release\n")
            proc.stdin.flush()
            served = [c for c in calls if not grpc_refused(c)]
            assert [c.result().model_spec.version.value for c in served] == [1] * GRPC_CAP
            kept = [u.result() for u in uploads if not upload_refused(u)]
            assert [u.status_code for u in kept] == [200, 200], [u.text for u in kept]
        assert grown < 200 * MiB, f"resident memory grew by {grown / MiB:.0f} MiB"
    finally:
        proc.kill()  # held calls would make a graceful stop wait for SHUTDOWN_TIMEOUT_SECONDS
        proc.wait(30)
