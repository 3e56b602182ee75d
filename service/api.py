"""HTTP routes: TF Serving's REST API, the friendly /predict, and operations endpoints."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
from fastapi import APIRouter, Query, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.datastructures import UploadFile

from service import codec
from service.errors import BadInput, ClientClosedRequest, PayloadTooLarge
from training.contract import CLASSES_KEY, PROBABILITIES_KEY, SIGNATURE_NAME, normalize_pixels
from training.images import INVERT_MODES

log = logging.getLogger("service.api")
router = APIRouter()


JSON = "application/json"


def json_response(content, status_code: int = 200) -> Response:
    return Response(codec.dumps(content), status_code=status_code, media_type=JSON)


INT64_MAX = 2**63 - 1


def _version(text: str | None) -> int | None:
    if text is None:
        return None
    # ASCII only: str.isdigit() also accepts '²' (int() then raises) and '１' (int() reads 1).
    if not (text.isascii() and text.isdigit()):
        raise BadInput(f"Malformed request: version must be a non-negative integer, got {text!r}")
    # TF Serving's versions are int64; longer strings would also overflow file names.
    if len(text) > 19 or int(text) > INT64_MAX:
        raise BadInput(f"Malformed request: version {text[:30]}... is out of range (int64)")
    return int(text)


async def read_body(request: Request) -> bytes:
    """The whole body, refusing more than MAX_BODY_BYTES before reading it all."""
    limit = request.app.state.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(
            f"request body is {declared} bytes; the limit is {limit} bytes (MAX_BODY_BYTES)"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(
                f"request body exceeds the limit of {limit} bytes (MAX_BODY_BYTES)"
            )
        chunks.append(chunk)
    body = b"".join(chunks)
    request._body = body  # lets request.form() parse what was already read
    return body


def _check_count(request: Request, count: int) -> None:
    codec.check_image_count(count, request.app.state.settings.max_images)


async def _wait_for_disconnect(request: Request) -> None:
    # The body is fully read by now, so the next message can only be the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, work):
    """Await `work`, cancelling it if the client disconnects first (frees its batch slot)."""
    handler = asyncio.current_task()
    disconnected = False

    def on_disconnect(watcher: asyncio.Task) -> None:
        nonlocal disconnected
        if not watcher.cancelled() and watcher.exception() is None:
            disconnected = True
            handler.cancel()

    # One watcher task and a callback: cheaper on the hot path than racing two tasks.
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    watcher.add_done_callback(on_disconnect)
    try:
        return await work
    except asyncio.CancelledError:
        if disconnected:
            raise ClientClosedRequest(
                "the client disconnected before the prediction was ready"
            ) from None
        raise
    finally:
        watcher.remove_done_callback(on_disconnect)
        watcher.cancel()


async def _predict(request: Request, name: str, images: np.ndarray, version, signature_name):
    _check_count(request, len(images))
    state = request.app.state
    prediction = await _unless_disconnected(
        request, state.backend.predict(name, images, version, signature_name)
    )
    state.metrics.images_per_request.observe(len(images))
    classes = prediction.outputs.get(CLASSES_KEY)
    if classes is not None:
        labels = state.backend.labels(prediction.version)
        for class_id, count in zip(*np.unique(classes, return_counts=True), strict=True):
            state.metrics.predictions.labels(name, labels[int(class_id)]).inc(int(count))
    return prediction


# --- operations ---------------------------------------------------------------------------


@router.get("/healthz", tags=["operations"], summary="The process is alive")
async def healthz():
    return json_response({"status": "ok"})


@router.get("/readyz", tags=["operations"], summary="200 once a model is loaded and answering")
async def readyz(request: Request):
    backend = request.app.state.backend
    if not backend.ready:
        return json_response({"error": f"not ready: {backend.not_ready_reason()}"}, 503)
    statuses = await backend.model_status(backend.model_name, None)
    return json_response(
        {
            "status": "ready",
            "model": backend.model_name,
            "version": statuses[0]["version"],
            "device": backend.device(),
        }
    )


@router.get("/metrics", tags=["operations"], summary="Prometheus metrics")
async def metrics(request: Request):
    state = request.app.state
    backend = state.backend
    if backend.ready:
        statuses = await backend.model_status(backend.model_name, None)
        state.metrics.model_version.clear()
        state.metrics.model_version.labels(backend.model_name, backend.device()).set(
            int(statuses[0]["version"])
        )
    return PlainTextResponse(
        generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST
    )


# --- TensorFlow Serving REST API ----------------------------------------------------------


async def _status(request: Request, name: str, version: str | None):
    statuses = await request.app.state.backend.model_status(name, _version(version))
    return json_response({"model_version_status": statuses})


@router.get("/v1/models/{name}", tags=["tf-serving"], summary="Model status (all versions)")
async def model_status(request: Request, name: str):
    return await _status(request, name, None)


@router.get("/v1/models/{name}/versions/{version}", tags=["tf-serving"], summary="Version status")
async def version_status(request: Request, name: str, version: str):
    return await _status(request, name, version)


async def _metadata(request: Request, name: str, version: str | None):
    backend = request.app.state.backend
    served, signature_def = await backend.metadata(name, _version(version))
    return json_response(
        {
            "model_spec": {"name": name, "signature_name": "", "version": str(served)},
            "metadata": {"signature_def": signature_def},
            # Not in TF Serving's answer (clients ignore the extra key): where the model runs.
            "device": backend.device(),
        }
    )


@router.get("/v1/models/{name}/metadata", tags=["tf-serving"], summary="Signatures (newest)")
async def model_metadata(request: Request, name: str):
    return await _metadata(request, name, None)


@router.get(
    "/v1/models/{name}/versions/{version}/metadata", tags=["tf-serving"], summary="Signatures"
)
async def version_metadata(request: Request, name: str, version: str):
    return await _metadata(request, name, version)


TF_SERVING_PREDICT_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            JSON: {
                "schema": {
                    "type": "object",
                    "properties": {
                        "signature_name": {"type": "string", "default": SIGNATURE_NAME},
                        "instances": {
                            "type": "array",
                            "description": "Row format: 28x28 float arrays, or {'image': array}",
                        },
                        "inputs": {
                            "description": "Columnar format: [n, 28, 28] or {'image': [n, 28, 28]}"
                        },
                    },
                },
                "example": {"instances": [[[0.0] * 28] * 28]},
            }
        },
    }
}


async def tf_serving_predict(request: Request, name: str, version: str | None) -> Response:
    """TF Serving's REST predict; also called directly by service.fastlane."""
    parsed_version = _version(version)
    signature_name, images, columnar = codec.parse_tf_serving_request(await read_body(request))
    prediction = await _predict(request, name, images, parsed_version, signature_name)
    outputs = prediction.outputs
    if columnar:
        return json_response({"outputs": outputs})
    keys = list(outputs)
    columns = zip(*(outputs[k] for k in keys), strict=True)
    rows = [dict(zip(keys, values, strict=True)) for values in columns]
    return json_response({"predictions": rows})


@router.post(
    "/v1/models/{name}:predict",
    tags=["tf-serving"],
    summary="Predict with the newest version",
    openapi_extra=TF_SERVING_PREDICT_DOC,
)
async def predict_latest(request: Request, name: str):
    return await tf_serving_predict(request, name, None)


@router.post(
    "/v1/models/{name}/versions/{version}:predict",
    tags=["tf-serving"],
    summary="Predict with one version",
    openapi_extra=TF_SERVING_PREDICT_DOC,
)
async def predict_version(request: Request, name: str, version: str):
    return await tf_serving_predict(request, name, version)


# --- for people ---------------------------------------------------------------------------

FRIENDLY_PREDICT_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            JSON: {
                "schema": {
                    "type": "object",
                    "required": ["instances"],
                    "properties": {
                        "instances": {
                            "type": "array",
                            "description": "28x28 arrays of pixels (integers 0-255 or floats in "
                            "[0, 1]), or {'b64': '<base64 PNG or JPEG>'}",
                        }
                    },
                },
                "example": {"instances": [[[0] * 28] * 28]},
            },
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "files": {
                            "type": "array",
                            "items": {"type": "string", "format": "binary"},
                            "description": "PNG or JPEG images of any size",
                        }
                    },
                }
            },
        },
    }
}


@router.post(
    "/predict",
    tags=["predict"],
    summary="Classify images: JSON pixel arrays or uploaded PNG/JPEG files",
    openapi_extra=FRIENDLY_PREDICT_DOC,
)
async def predict_friendly(
    request: Request,
    invert: str = Query(
        "auto",
        description="Uploaded/base64 images: invert to light-on-dark; 'auto' when the border "
        "is light",
    ),
):
    if invert not in INVERT_MODES:
        raise BadInput(f"invert: expected one of {', '.join(INVERT_MODES)}, got {invert!r}")
    body = await read_body(request)
    content_type = request.headers.get("content-type", "")
    files: list[str] | None = None
    if content_type.startswith("multipart/form-data"):
        images, files = await _uploaded_images(request, invert)
    else:
        # Any other type is read as JSON, as TF Serving does (`curl -d` says form-urlencoded).
        # In a thread: decoding base64 photos must not stall the event loop.
        images = await asyncio.to_thread(
            codec.parse_pixel_instances, body, invert, request.app.state.settings.max_images
        )
    state = request.app.state
    prediction = await _predict(request, state.settings.model_name, images, None, SIGNATURE_NAME)
    labels = state.backend.labels(prediction.version)
    rows = []
    for i, (class_id, probabilities) in enumerate(
        zip(prediction.outputs[CLASSES_KEY], prediction.outputs[PROBABILITIES_KEY], strict=True)
    ):
        row = {
            "class_id": int(class_id),
            "label": labels[int(class_id)],
            "probabilities": dict(zip(labels, probabilities, strict=True)),
        }
        if files is not None:
            row = {"file": files[i], **row}
        rows.append(row)
    return json_response(
        {
            "model_name": state.settings.model_name,
            "model_version": str(prediction.version),
            "predictions": rows,
        }
    )


async def _uploaded_images(request: Request, invert: str):
    limit = request.app.state.settings.max_images
    try:
        form = await request.form(
            max_files=limit + 1, max_part_size=request.app.state.settings.max_body_bytes
        )
    except Exception as err:  # multipart's parser raises several types for malformed bodies
        detail = str(getattr(err, "detail", err))
        if detail.startswith("Too many files"):
            # Starlette stops parsing at max_files: more than MAX_IMAGES + 1 files lands here.
            raise PayloadTooLarge(
                f"request has more than {limit + 1} images; the limit is {limit} per request "
                "(MAX_IMAGES)"
            ) from err
        raise BadInput(f"malformed multipart body: {detail}") from err
    uploads = [(key, value) for key, value in form.multi_items() if isinstance(value, UploadFile)]
    if not uploads:
        raise BadInput("multipart body has no file; send one or more images as 'files'")
    _check_count(request, len(uploads))
    files = [
        (upload.filename or f"files[{i}]", await upload.read())
        for i, (_, upload) in enumerate(uploads)
    ]

    def decode() -> np.ndarray:
        return np.stack(
            [
                codec.image_file_pixels(data, f"files[{i}] ({name})", invert)
                for i, (name, data) in enumerate(files)
            ]
        )

    # In a thread: decoding and resizing photos must not stall the event loop.
    pixels = await asyncio.to_thread(decode)
    return normalize_pixels(pixels), [name for name, _ in files]
