"""The Open Inference Protocol over gRPC: `inference.GRPCInferenceService`.

What `tritonclient.grpc` and KServe's and MLServer's gRPC clients call, as
kserve/open-inference-protocol's specification/protocol/inference_grpc.md defines it:
ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata and ModelInfer, with
`raw_input_contents` and `raw_output_contents`. It is served on GRPC_PORT beside TF Serving's
services (service/protocols/grpc_server.py): the same server, port, bearer tokens, admission,
metrics (`grpc_requests_total{method}`) and data plane. The tensors are read by the HTTP
route's rules (service/codecs/v2_grpc.py, v2_tensors.py), so a bad request gets the same
words over both.

A model is served through its `serving_default` signature, or its only one: named inputs of
its datatypes (BYTES for strings), typed `contents` or raw. Errors are gRPC statuses:
INVALID_ARGUMENT for a bad request, NOT_FOUND for an unknown model or version, UNAVAILABLE
while not ready or when the batching queue is full, RESOURCE_EXHAUSTED over MAX_IMAGES.
"""

from __future__ import annotations

import asyncio
import functools

import grpc

from service import v2_proto
from service.codecs.v2_grpc import parse_grpc_infer_request, render_grpc_infer_response
from service.codecs.v2_metadata import EXTENSIONS, render_model_metadata
from service.dataplane import DataPlane
from service.errors import BadInput
from service.protocols.grpc_server import _rpc
from service.protocols.http import version_in_url
from service.protocols.v2 import served_signature
from service.types import VersionState

# Requests up to this size (a few images) are parsed on the event loop: a thread hop costs
# more than they do.
INLINE_PARSE_BYTES = 64 * 1024


def _model_name(name: str, field: str) -> str:
    if not name:
        raise BadInput(f"{field} is empty: name the model")
    return name


def _version(text: str) -> int | None:
    # Empty: the version the server chooses (the specification's words); else digits, as in
    # the HTTP routes' URLs.
    return version_in_url(text) if text else None


class OpenInferenceGRPC:
    """`inference.GRPCInferenceService` over a data plane.

    Args:
        dataplane: what serves the model (the HTTP adapters' own).
        server_name, server_version: what ServerMetadata says the server is.

    Tokens are checked for every service on the server, from one table of the methods'
    scopes (service/protocols/grpc_access.py): health open, metadata `status`, ModelInfer
    `predict`.
    """

    def __init__(
        self,
        dataplane: DataPlane,
        server_name: str,
        server_version: str,
    ):
        self.dataplane = dataplane
        self.server_metadata = v2_proto.ServerMetadataResponse(
            name=server_name, version=server_version, extensions=EXTENSIONS
        )

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Register every method of the service on a gRPC server."""
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                getattr(self, name),
                request_deserializer=request_class.FromString,
                response_serializer=response_class.SerializeToString,
            )
            for name, (request_class, response_class) in v2_proto.METHODS.items()
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(v2_proto.SERVICE, handlers),)
        )

    # --- health and metadata ------------------------------------------------------------
    @_rpc
    async def ServerLive(self, request, context):  # noqa: N802 - the protocol's method name
        return v2_proto.ServerLiveResponse(live=True)

    @_rpc
    async def ServerReady(self, request, context):  # noqa: N802
        # A bool to say it, as Triton and KServe answer (HTTP's 503 has no such field).
        return v2_proto.ServerReadyResponse(ready=self.dataplane.readiness().ready)

    @_rpc
    async def ModelReady(self, request, context):  # noqa: N802
        name = _model_name(request.name, "name")
        version = _version(request.version)
        if version is None:
            ready = self.dataplane.model_readiness(name).ready  # NotFound: no such model
        else:
            (status,) = await self.dataplane.model_status(name, version)  # NotFound
            ready = status.state == VersionState.AVAILABLE
        return v2_proto.ModelReadyResponse(ready=ready)

    @_rpc
    async def ServerMetadata(self, request, context):  # noqa: N802
        return self.server_metadata

    @_rpc
    async def ModelMetadata(self, request, context):  # noqa: N802
        name = _model_name(request.name, "name")
        metadata = await self.dataplane.metadata(name, _version(request.version))
        statuses = await self.dataplane.model_status(name, None)
        available = sorted(s.version for s in statuses if s.state == VersionState.AVAILABLE)
        answer = render_model_metadata(metadata, available)
        response = v2_proto.ModelMetadataResponse(
            name=answer["name"], versions=answer["versions"], platform=answer["platform"]
        )
        for key in ("inputs", "outputs"):
            for tensor in answer[key]:
                getattr(response, key).add(**tensor)
        return response

    # --- inference ----------------------------------------------------------------------
    @_rpc
    async def ModelInfer(self, request, context):  # noqa: N802
        self.dataplane.admit()  # a full queue refuses before the tensors are decoded
        name = _model_name(request.model_name, "model_name")
        version = _version(request.model_version)
        signature_name, signature = await served_signature(self.dataplane, name, version)
        parse = functools.partial(
            parse_grpc_infer_request, request, self.dataplane.check_image_count, signature
        )
        # A large request is parsed in a thread: it must not stall other clients' requests.
        inline = request.ByteSize() <= INLINE_PARSE_BYTES
        parsed = parse() if inline else await asyncio.to_thread(parse)
        result = await self.dataplane.predict(name, parsed.inputs, version, signature_name)
        return render_grpc_infer_response(result, parsed)
