"""TensorFlow Serving's REST API (g3doc/api_rest.md): model status, metadata and predict.

A client written for TF Serving works unchanged against this service: the same URLs, the
row (`instances`) and columnar (`inputs`) formats, and TF Serving's `{"error": "..."}` bodies.
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

from fastapi import APIRouter
from google.protobuf.json_format import MessageToDict
from starlette.responses import Response

from artifact.contract import SIGNATURE_NAME
from service import codec
from service.dataplane import DataPlane
from service.errors import redact_paths
from service.protocols.http import (
    JSON,
    Call,
    CallRoute,
    admit_always,
    json_response,
    label_in_url,
    version_in_url,
)
from service.types import ModelMetadata, VersionStatus

# Bodies up to this size (a few images) are parsed on the event loop: a thread hop costs more
# than they do.
INLINE_PARSE_BYTES = 64 * 1024

PREDICT_DOC = {
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


def render_status(statuses: list[VersionStatus]) -> dict:
    """GetModelStatus as TF Serving's REST API renders it."""
    return {
        "model_version_status": [
            {
                "version": str(s.version),
                "state": s.state.name,
                "status": {
                    "error_code": s.error_code,
                    "error_message": redact_paths(s.error_message),
                },
            }
            for s in statuses
        ]
    }


def render_metadata(metadata: ModelMetadata, device: str) -> dict:
    """GetModelMetadata as TF Serving's REST API renders it, plus where the model runs."""
    signature_def = MessageToDict(
        metadata.signature_defs,
        preserving_proto_field_name=True,
        including_default_value_fields=True,
    )
    return {
        "model_spec": {
            "name": metadata.name,
            "signature_name": "",
            "version": str(metadata.version),
        },
        "metadata": {"signature_def": signature_def},
        # Not in TF Serving's answer (clients ignore the extra key): where the model runs.
        "device": device,
    }


class TFServingREST:
    """The /v1 routes over a data plane: TF Serving's, plus `/v1/models/{name:name}/rollout`.

    A version is named in the URL by number (`/versions/3`) or by label (`/labels/stable`),
    never both; a request naming neither goes to the serving version (or to the canary, for
    its share). Every predict answer says which version answered (`model_version`, a key TF
    Serving's clients ignore).

    Args:
        dataplane: what serves the models.
        config: the model config watcher, for the rollout status (None with the shortcut).
    """

    def __init__(self, dataplane: DataPlane, config=None):
        self.dataplane = dataplane
        self.config = config
        self.router = APIRouter(tags=["tf-serving"])
        r = self.router
        r.add_api_route(
            "/v1/models/{name:name}", self.model_status, summary="Model status (all versions)"
        )
        r.add_api_route(
            "/v1/models/{name:name}/versions/{version}",
            self.version_status,
            summary="Version status",
        )
        r.add_api_route(
            "/v1/models/{name:name}/labels/{label:name}",
            self.label_status,
            summary="Labeled version status",
        )
        r.add_api_route(
            "/v1/models/{name:name}/metadata", self.model_metadata, summary="Signatures (serving)"
        )
        r.add_api_route(
            "/v1/models/{name:name}/versions/{version}/metadata",
            self.version_metadata,
            summary="Signatures of a version",
        )
        r.add_api_route(
            "/v1/models/{name:name}/labels/{label:name}/metadata",
            self.label_metadata,
            summary="Signatures of a labeled version",
        )
        r.add_api_route(
            "/v1/models/{name:name}/rollout",
            self.rollout,
            summary="Serving version, labels, canary and shadow traffic (not in TF Serving)",
            tags=["rollout"],
        )

    def call_routes(self) -> list[CallRoute]:
        """The predict routes, answered by the door (service/door.py) with `predict`."""
        before_body = admit_always(self.dataplane.admit)
        return [
            CallRoute(
                "POST", path, self.predict, summary, ("tf-serving",), PREDICT_DOC, before_body
            )  # fmt: skip
            for path, summary in (
                ("/v1/models/{name:name}:predict", "Predict with the serving version"),
                ("/v1/models/{name:name}/versions/{version}:predict", "Predict with one version"),
                (
                    "/v1/models/{name:name}/labels/{label:name}:predict",
                    "Predict with a labeled version",
                ),
            )
        ]

    async def model_status(self, name: str):
        return json_response(render_status(await self.dataplane.model_status(name, None)))

    async def version_status(self, name: str, version: str):
        statuses = await self.dataplane.model_status(name, version_in_url(version))
        return json_response(render_status(statuses))

    async def label_status(self, name: str, label: str):
        label_in_url(label)
        return json_response(render_status(await self.dataplane.model_status(name, None, label)))

    async def model_metadata(self, name: str):
        return self._metadata(await self.dataplane.metadata(name, None))

    async def version_metadata(self, name: str, version: str):
        return self._metadata(await self.dataplane.metadata(name, version_in_url(version)))

    async def label_metadata(self, name: str, label: str):
        label_in_url(label)
        return self._metadata(await self.dataplane.metadata(name, None, label))

    def _metadata(self, metadata: ModelMetadata) -> Response:
        return json_response(render_metadata(metadata, self.dataplane.device()))

    async def rollout(self, name: str):
        status = self.dataplane.rollout(name)
        config = self.config.status() if self.config is not None else None
        if config is not None:
            # Named, not located: the status says which file, not where the server keeps it.
            config["file"] = Path(config["file"]).name
            config["error"] = config["error"] and redact_paths(config["error"])
        status["config"] = config
        return json_response(status)

    async def predict(
        self, call: Call, name: str, version: str | None = None, label: str | None = None
    ) -> Response:
        """TF Serving's REST predict (a Call route: the door has read the body)."""
        parsed_version = version_in_url(version)
        label_in_url(label)
        body = call.body
        parse = functools.partial(codec.parse_tf_serving_request, body, self.dataplane.max_images)
        # A large body is parsed in a thread: it must not stall other clients' requests.
        large = len(body) > INLINE_PARSE_BYTES
        signature_name, images, columnar = await asyncio.to_thread(parse) if large else parse()
        result = await self.dataplane.predict(name, images, parsed_version, signature_name, label)
        outputs = result.outputs
        if columnar:
            return json_response({"outputs": outputs, "model_version": str(result.version)})
        keys = list(outputs)
        rows = [dict(zip(keys, row, strict=True)) for row in zip(*outputs.values(), strict=True)]
        return json_response({"predictions": rows, "model_version": str(result.version)})
