"""The Open Inference Protocol (KServe's V2) over HTTP, with the binary tensor data extension.

What `tritonclient`, KServe, MLServer and Triton's own tools speak: health, server and model
metadata, model readiness and inference, as kserve/open-inference-protocol's
specification/protocol/inference_rest.md defines them, and Triton's binary tensor data
extension (docs/protocol/extension_binary_data.md in triton-inference-server/server), which
tritonclient uses by default: a JSON header of `Inference-Header-Content-Length` bytes, then
each binary input's raw little-endian bytes in the order of `inputs`; outputs asked for with
`binary_data` (or all of them with `binary_data_output`) come back the same way.

A model is served through its `serving_default` signature, or its only one (a pre-made
Estimator's `predict`): named inputs of the signature's datatypes (BYTES for strings) and
shapes, metadata from it; the wire format is service/codecs/v2_rest.py's (the image
contract's model, `image` FP32 [-1, 28, 28], read by the fast path inside it). Errors are
`{"error": "..."}` with the
service's statuses (400 bad input, 404 unknown model or version, 413 over a limit, 503 not
ready). Pure numpy and orjson: nothing here imports TensorFlow.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from starlette.responses import Response

from artifact.contract import IMAGE_SHAPE, INPUT_KEY, SIGNATURE_NAME
from service import tracing
from service.codecs.compression import decompress_body
from service.codecs.signatures import IMAGE_ELEMENTS
from service.codecs.v2_metadata import (
    EXTENSIONS,
    render_model_config,
    render_model_metadata,
    serving_signature,
)
from service.codecs.v2_rest import (
    HEADER_LENGTH,
    OCTET_STREAM,
    parse_infer_request,
    render_infer_response,
)
from service.codecs.v2_tensors import INPUT_DATATYPE
from service.dataplane import DataPlane
from service.errors import NotReady, SignatureNotFound
from service.protocols.http import json_response, version_in_url
from service.routes import MODEL_READ, MODEL_WRITE, Answers, Body, Call, Route, admit_always
from service.security import PREDICT, STATUS
from service.types import SignatureSpec, VersionState

INFER_BODY = Body(
    {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "parameters": {"type": "object"},
            "inputs": {
                "type": "array",
                "description": "One input: {'name': 'image', 'datatype': 'FP32', "
                "'shape': [n, 28, 28], 'data': [...n*784 floats, flat or nested]}",
            },
            "outputs": {
                "type": "array",
                "description": "Optional: [{'name': 'classes'}, {'name': "
                "'probabilities', 'parameters': {'binary_data': true}}]",
            },
        },
    },
    {
        "inputs": [
            {
                "name": INPUT_KEY,
                "datatype": INPUT_DATATYPE,
                "shape": [1, *IMAGE_SHAPE],
                "data": [0.0] * IMAGE_ELEMENTS,
            }
        ]
    },
    {
        OCTET_STREAM: {
            "schema": {"type": "string", "format": "binary"},
            "description": "Binary tensor data extension: the JSON request, then raw "
            "little-endian tensors; the Inference-Header-Content-Length header gives the "
            "JSON's length (0: the body is one raw FP32 image batch).",
        }
    },
)

INFER_ANSWERS = Answers(
    ("application/json", OCTET_STREAM),
    {
        "type": "object",
        "properties": {
            "model_name": {"type": "string"},
            "model_version": {"type": "string"},
            "id": {"type": "string"},
            "outputs": {"type": "array", "items": {"type": "object"}},
        },
    },
    MODEL_WRITE,
)

INLINE_PARSE_BYTES = 64 * 1024


class OpenInferenceREST:
    """The /v2 routes over a data plane.

    Args:
        dataplane: what serves the model.
        server_name, server_version: what GET /v2 says the server is.
        max_body_bytes: the most a body may hold, decompressed too (MAX_BODY_BYTES).
    """

    def __init__(
        self, dataplane: DataPlane, server_name: str, server_version: str, max_body_bytes: int
    ):
        self.dataplane = dataplane
        self.max_body_bytes = max_body_bytes
        self.server_metadata_body = {
            "name": server_name,
            "version": server_version,
            "extensions": list(EXTENSIONS),
        }

    def routes(self) -> list[Route]:
        """The /v2 routes: health, server and model metadata, readiness, inference."""
        tags = ("open-inference-protocol",)

        def get(path: str, handler, summary: str, scope: str | None = STATUS, **more) -> Route:
            more.setdefault("answers", Answers(errors=MODEL_READ))
            return Route("GET", path, handler, summary, scope, tags, **more)

        admit = admit_always(self.dataplane.admit)
        infer: dict[str, Any] = {"body": INFER_BODY, "answers": INFER_ANSWERS,
                                 "before_body": admit, "protocol": "v2_rest"}  # fmt: skip
        probe: dict[str, Any] = {"probe": True, "answers": Answers(errors=(503,))}
        return [
            Route("POST", "/v2/models/{name}/infer", self.infer,
                  "Inference with the newest version", PREDICT, tags, **infer),
            Route("POST", "/v2/models/{name}/versions/{version}/infer", self.infer,
                  "Inference with one version", PREDICT, tags, **infer),
            get("/v2", self.server_metadata, "Server metadata and extensions",
                answers=Answers()),
            get("/v2/health/live", self.live, "200 while the process answers", None,
                probe=True),
            get("/v2/health/ready", self.ready, "200 once the model answers", None, **probe),
            get("/v2/models/{name}", self.model_metadata_latest, "Model metadata"),
            get("/v2/models/{name}/versions/{version}", self.model_metadata_version,
                "Model metadata of one version"),
            get("/v2/models/{name}/ready", self.model_ready_latest,
                "200 once the model answers"),
            get("/v2/models/{name}/config", self.model_config_latest,
                "Model configuration (Triton's model configuration extension)"),
            get("/v2/models/{name}/versions/{version}/config", self.model_config_version,
                "Model configuration of one version"),
            get("/v2/models/{name}/versions/{version}/ready", self.model_ready_version,
                "200 once the version answers"),
        ]  # fmt: skip

    # --- health and metadata ------------------------------------------------------------
    async def server_metadata(self, call: Call):
        return json_response(self.server_metadata_body)

    async def live(self, call: Call):
        return json_response({"live": True})

    async def ready(self, call: Call):
        readiness = self.dataplane.readiness()
        if not readiness.ready:
            raise NotReady(f"not ready: {readiness.reason}")
        return json_response({"ready": True})

    async def model_metadata_latest(self, call: Call, name: str):
        return await self.model_metadata(name, None)

    async def model_metadata_version(self, call: Call, name: str, version: str):
        return await self.model_metadata(name, version_in_url(version))

    async def model_metadata(self, name: str, version: int | None):
        metadata = await self.dataplane.metadata(name, version)
        statuses = await self.dataplane.model_status(name, None)
        available = sorted(s.version for s in statuses if s.state == VersionState.AVAILABLE)
        return json_response(render_model_metadata(metadata, available))

    async def model_config_latest(self, call: Call, name: str):
        return await self.model_config(name, None)

    async def model_config_version(self, call: Call, name: str, version: str):
        return await self.model_config(name, version_in_url(version))

    async def model_config(self, name: str, version: int | None):
        # max_batch_size is what one request may hold (MAX_IMAGES), what Triton's clients
        # (perf_analyzer, ...) read it for; BATCH_MAX_SIZE bounds the batches the service
        # merges requests into, which no client sends.
        metadata = await self.dataplane.metadata(name, version)
        return json_response(render_model_config(metadata, self.dataplane.max_images))

    async def model_ready_latest(self, call: Call, name: str):
        readiness = self.dataplane.model_readiness(name)  # NotFound: no such model
        if not readiness.ready:
            raise NotReady(f"model {name} is not ready: {readiness.reason}")
        return json_response({"name": name, "ready": True})

    async def model_ready_version(self, call: Call, name: str, version: str):
        number = version_in_url(version)
        (status,) = await self.dataplane.model_status(name, number)
        if status.state != VersionState.AVAILABLE:
            reason = f": {status.error_message}" if status.error_message else ""
            raise NotReady(
                f"version {number} of model {name} is not ready: {status.state.name}{reason}"
            )
        return json_response({"name": name, "ready": True})

    # --- inference ----------------------------------------------------------------------
    async def infer(self, call: Call, name: str, version: str | None = None) -> Response:
        """V2 inference, JSON or binary (a Call route: the door has read the body)."""
        parsed_version = version_in_url(version)
        body = call.body
        encoding = call.headers.get("content-encoding")
        parse = functools.partial(
            self._parse,
            body,
            encoding,
            call.headers.get(HEADER_LENGTH),
            call.reserve,
        )
        # A large or compressed body is parsed in a thread: it must not stall other clients'
        # requests.
        inline = len(body) <= INLINE_PARSE_BYTES and encoding in (None, "identity")
        signature_name, signature = await served_signature(self.dataplane, name, parsed_version)
        with tracing.span("parse"):
            parsed = parse(signature) if inline else await asyncio.to_thread(parse, signature)
        result = await self.dataplane.predict(name, parsed.inputs, parsed_version, signature_name)
        with tracing.span("render"):
            answer = render_infer_response(result, parsed)
        return Response(answer.body, media_type=answer.media_type, headers=answer.headers)

    def _parse(
        self, body: bytes, encoding: str | None, header_length: str | None, reserve, signature
    ):
        # Triton measures the header length and the body limit on the decompressed body,
        # which counts in the bodies in flight as the wire bytes do (`reserve`).
        body = decompress_body(body, encoding, self.max_body_bytes, reserve)
        return parse_infer_request(body, header_length, self.dataplane.check_image_count, signature)


async def served_signature(
    dataplane: DataPlane, name: str, version: int | None
) -> tuple[str, SignatureSpec]:
    """The signature the Open Inference Protocol serves for a model's version: its
    `serving_default`, or its only one.

    Raises:
        NotFound: no such model or version, or several signatures and no serving_default.
    """
    try:
        return SIGNATURE_NAME, await dataplane.signature(name, version, None, SIGNATURE_NAME)
    except SignatureNotFound:
        metadata = await dataplane.metadata(name, version)
        signature = serving_signature(metadata)
        return signature.name, signature
