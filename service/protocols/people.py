"""The friendly `POST /predict` for people: images in, class ids, labels and probabilities out.

JSON pixel arrays (integers 0-255 or floats in [0, 1]), base64 image files, or a multipart
upload of image files of any size; each answer row is `artifact.contract.prediction_rows`'
(the same batch prediction writes). With `include_pixels=true` each row also holds the image
as the model received it (28x28 integers 0-255, after the decoding, grayscale, scaling,
centring and inversion of artifact.images): the page shows it, no client re-implements it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading

import numpy as np

from artifact.contract import (
    CLASSES_KEY,
    PIXEL_MAX,
    PROBABILITIES_KEY,
    SIGNATURE_NAME,
    normalize_pixels,
    prediction_rows,
)
from artifact.images import INVERT_MODES
from service import codec
from service.dataplane import DataPlane
from service.errors import BadInput
from service.protocols.http import (
    JSON,
    Call,
    CallRoute,
    admit_always,
    form_request,
    image_form,
    json_response,
)

# JSON bodies up to this size without image files are parsed on the event loop: a few pixel
# arrays cost less than a thread hop.
INLINE_PARSE_BYTES = 64 * 1024

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


# The query's parameters, as the OpenAPI schema documents them.
QUERY = (
    {
        "name": "invert",
        "in": "query",
        "required": False,
        "description": "Uploaded/base64 images: invert to light-on-dark; 'auto' when the border "
        "is light",
        "schema": {"type": "string", "enum": list(INVERT_MODES), "default": "auto"},
    },
    {
        "name": "include_pixels",
        "in": "query",
        "required": False,
        "description": "Also answer each image as the model received it: 28x28 integers 0-255 "
        "('pixels')",
        "schema": {"type": "boolean", "default": False},
    },
)

# The words pydantic takes for a boolean, case aside: what FastAPI accepted when it parsed
# this query, so clients written then keep working.
BOOLEAN_WORDS = {
    **dict.fromkeys(("1", "on", "t", "true", "y", "yes"), True),
    **dict.fromkeys(("0", "off", "f", "false", "n", "no"), False),
}


class PeopleAPI:
    """`POST /predict` over a data plane.

    Image files are decoded on one thread of their own: a flood of large photos queues there,
    never on the event loop or in front of other clients' pixel arrays.

    Args:
        dataplane: what serves the model.
        max_body_bytes: largest request body (MAX_BODY_BYTES): the most one uploaded file
            may be.
        max_request_pixels: most pixels one request's image files may decode to.
        pixels_in_flight: the process's budget of pixels being decoded (MAX_PIXELS_IN_FLIGHT),
            shared with feedback; None: unbounded.
    """

    def __init__(
        self,
        dataplane: DataPlane,
        max_body_bytes: int,
        max_request_pixels: int = 48_000_000,
        pixels_in_flight: codec.PixelBudget | None = None,
    ):
        self.dataplane = dataplane
        self.max_body_bytes = max_body_bytes
        self.max_request_pixels = max_request_pixels
        self.pixels_in_flight = pixels_in_flight or codec.UNBOUNDED_PIXELS
        self.decoder = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="decode")

    def call_routes(self) -> list[CallRoute]:
        """`POST /predict`, answered by the door (service/door.py)."""
        return [
            CallRoute(
                "POST",
                "/predict",
                self.predict,
                "Classify images: JSON pixel arrays or uploaded PNG/JPEG files",
                ("predict",),
                PREDICT_DOC,
                admit_always(self.dataplane.admit),
                QUERY,
            )
        ]

    async def predict(self, call: Call):
        """The friendly prediction; its query read here (the last value of a repeated
        parameter wins)."""
        query = call.query
        include = query.get("include_pixels", "false").lower()
        if include not in BOOLEAN_WORDS:
            raise BadInput(
                "query.include_pixels: expected a boolean (true/false, 1/0, yes/no, on/off), "
                f"got {query['include_pixels']!r}"
            )
        return await self._predict(call, query.get("invert", "auto"), BOOLEAN_WORDS[include])

    async def _predict(self, call: Call, invert: str, include_pixels: bool):
        if invert not in INVERT_MODES:
            raise BadInput(f"invert: expected one of {', '.join(INVERT_MODES)}, got {invert!r}")
        body = call.body
        files: list[str] | None = None
        if call.headers.get("content-type", "").startswith("multipart/form-data"):
            images, files = await self._uploaded_images(call, invert)
        elif len(body) <= INLINE_PARSE_BYTES and b'"b64"' not in body:
            # Any other type is read as JSON, as TF Serving does (`curl -d` says
            # form-urlencoded). A few pixel arrays cost less than a thread hop.
            images = self._json_images(body, invert)
        else:
            # Large bodies and base64 photos on the decoding thread: never the event loop.
            images = await self._decode(self._json_images, body, invert)
        name = self.dataplane.model_name
        result = await self.dataplane.predict(name, images, None, SIGNATURE_NAME)
        rows = list(
            prediction_rows(
                result.outputs[CLASSES_KEY], result.outputs[PROBABILITIES_KEY], result.labels
            )
        )
        if include_pixels:
            received = np.rint(images * PIXEL_MAX).astype(np.uint8)
            rows = [{**row, "pixels": pixels} for row, pixels in zip(rows, received, strict=True)]
        if files is not None:
            rows = [{"file": file, **row} for file, row in zip(files, rows, strict=True)]
        return json_response(
            {"model_name": name, "model_version": str(result.version), "predictions": rows}
        )

    async def _decode(self, work, *args):
        """Run `work(*args, cancelled)` on the decoding thread; when the client leaves (the
        handler's task is cancelled), the images not yet decoded are not decoded."""
        cancelled = threading.Event()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.decoder, work, *args, cancelled)
        finally:
            cancelled.set()

    def _json_images(self, body: bytes, invert: str, cancelled=None) -> np.ndarray:
        simple = codec.simple_pixel_images(body, self.dataplane.max_images)
        if simple is not None:
            return codec.decode_pixel_images(simple)
        instances = codec.pixel_instances(codec.loads(body))
        # Counted before any image is decoded.
        self.dataplane.check_image_count(len(instances))
        return codec.decode_pixel_instances(
            instances, invert, self.max_request_pixels, cancelled, self.pixels_in_flight
        )

    async def _uploaded_images(self, call: Call, invert: str):
        _, uploads = await image_form(
            form_request(call), self.dataplane.max_images, self.max_body_bytes
        )
        names = [upload.filename or f"files[{i}]" for i, upload in enumerate(uploads)]
        files = [
            (f"files[{i}] ({name})", await upload.read())
            for i, (name, upload) in enumerate(zip(names, uploads, strict=True))
        ]
        decode = functools.partial(codec.decode_image_files, in_flight=self.pixels_in_flight)
        pixels = await self._decode(decode, files, invert, self.max_request_pixels)
        return normalize_pixels(pixels), names
