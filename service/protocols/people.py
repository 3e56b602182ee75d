"""The friendly `POST /predict` for people: images in, class ids, labels and probabilities out.

JSON pixel arrays (integers 0-255 or floats in [0, 1]), base64 image files, or a multipart
upload of image files of any size; each answer row is `artifact.contract.prediction_rows`'
(the same batch prediction writes).
"""

from __future__ import annotations

import asyncio

import numpy as np
from fastapi import APIRouter, Query
from starlette.datastructures import UploadFile
from starlette.requests import Request

from artifact.contract import (
    CLASSES_KEY,
    PROBABILITIES_KEY,
    SIGNATURE_NAME,
    normalize_pixels,
    prediction_rows,
)
from artifact.images import INVERT_MODES
from service import codec
from service.dataplane import DataPlane
from service.errors import BadInput, PayloadTooLarge
from service.protocols.http import JSON, json_response, read_body, unless_disconnected, with_body

PREDICT_DOC = {
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


class PeopleAPI:
    """`POST /predict` over a data plane.

    Args:
        dataplane: what serves the model.
        max_body_bytes: largest request body read (MAX_BODY_BYTES).
    """

    def __init__(self, dataplane: DataPlane, max_body_bytes: int):
        self.dataplane = dataplane
        self.max_body_bytes = max_body_bytes
        self.router = APIRouter(tags=["predict"])
        self.router.add_api_route(
            "/predict",
            self.predict,
            methods=["POST"],
            summary="Classify images: JSON pixel arrays or uploaded PNG/JPEG files",
            openapi_extra=PREDICT_DOC,
        )

    async def predict(
        self,
        request: Request,
        invert: str = Query(
            "auto",
            description="Uploaded/base64 images: invert to light-on-dark; 'auto' when the "
            "border is light",
        ),
    ):
        if invert not in INVERT_MODES:
            raise BadInput(f"invert: expected one of {', '.join(INVERT_MODES)}, got {invert!r}")
        body = await read_body(request, self.max_body_bytes)
        files: list[str] | None = None
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            images, files = await self._uploaded_images(with_body(request, body), invert)
        else:
            # Any other type is read as JSON, as TF Serving does (`curl -d` says
            # form-urlencoded). In a thread: base64 photos must not stall the event loop.
            images = await asyncio.to_thread(self._json_images, body, invert)
        name = self.dataplane.model_name
        result = await unless_disconnected(
            request, self.dataplane.predict(name, images, None, SIGNATURE_NAME)
        )
        rows = list(
            prediction_rows(
                result.outputs[CLASSES_KEY], result.outputs[PROBABILITIES_KEY], result.labels
            )
        )
        if files is not None:
            rows = [{"file": file, **row} for file, row in zip(files, rows, strict=True)]
        return json_response(
            {"model_name": name, "model_version": str(result.version), "predictions": rows}
        )

    def _json_images(self, body: bytes, invert: str) -> np.ndarray:
        instances = codec.pixel_instances(codec.loads(body))
        # Counted before any image is decoded.
        self.dataplane.check_image_count(len(instances))
        return codec.decode_pixel_instances(instances, invert)

    async def _uploaded_images(self, request: Request, invert: str):
        limit = self.dataplane.max_images
        try:
            form = await request.form(max_files=limit + 1, max_part_size=self.max_body_bytes)
        except Exception as err:  # multipart's parser raises several types for malformed bodies
            detail = str(getattr(err, "detail", err))
            if detail.startswith("Too many files"):
                # Starlette stops parsing at max_files: more than MAX_IMAGES + 1 files land here.
                raise PayloadTooLarge(
                    f"request has more than {limit + 1} images; the limit is {limit} per "
                    "request (MAX_IMAGES)"
                ) from err
            raise BadInput(f"malformed multipart body: {detail}") from err
        uploads = [value for _, value in form.multi_items() if isinstance(value, UploadFile)]
        if not uploads:
            raise BadInput("multipart body has no file; send one or more images as 'files'")
        self.dataplane.check_image_count(len(uploads))
        files = [
            (upload.filename or f"files[{i}]", await upload.read())
            for i, upload in enumerate(uploads)
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
