"""TensorFlow Serving's REST API (g3doc/api_rest.md): model status, metadata and predict.

A client written for TF Serving works unchanged against this service: the same URLs, the
row (`instances`) and columnar (`inputs`) formats, and TF Serving's `{"error": "..."}` bodies.
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import numpy as np
import orjson
from fastapi import APIRouter
from google.protobuf.json_format import MessageToDict
from starlette.responses import Response

from artifact.contract import SIGNATURE_NAME
from service import codec
from service.dataplane import DataPlane
from service.errors import BadInput, redact_paths
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


# TF Serving writes non-finite floats as these literals (util/json_tensor.cc, WriteDecimal);
# orjson alone would write null.
NAN, INFINITY, MINUS_INFINITY = (orjson.Fragment(t) for t in (b"NaN", b"Infinity", b"-Infinity"))


def with_non_finite_literals(array: np.ndarray):
    """An output as it is, or, when it holds NaN or Inf, as nested lists in which those are
    written as TF Serving writes them (`NaN`, `Infinity`, `-Infinity`)."""
    if array.dtype.kind != "f" or np.isfinite(array).all():
        return array
    holder = np.empty(array.size, dtype=object)
    holder[:] = [
        v if np.isfinite(v) else NAN if np.isnan(v) else INFINITY if v > 0 else MINUS_INFINITY
        for v in array.ravel()
    ]
    return holder.reshape(array.shape).tolist()


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


def render_metadata(metadata: ModelMetadata, device: str | None) -> dict:
    """GetModelMetadata as TF Serving's REST API renders it, plus where the model runs
    (unless `device` is None)."""
    signature_def = MessageToDict(
        metadata.signature_defs,
        preserving_proto_field_name=True,
        including_default_value_fields=True,
    )
    answer = {
        "model_spec": {
            "name": metadata.name,
            "signature_name": "",
            "version": str(metadata.version),
        },
        "metadata": {"signature_def": signature_def},
    }
    if device is not None:
        # Not in TF Serving's answer (most clients ignore the extra key): where the model runs.
        answer["device"] = device
    return answer


class TFServingREST:
    """The /v1 routes over a data plane: TF Serving's, plus `/v1/models/{name:name}/rollout`.

    A version is named in the URL by number (`/versions/3`) or by label (`/labels/stable`),
    never both; a request naming neither goes to the serving version (or to the canary, for
    its share). Every predict answer says which version answered (`model_version`, a key TF
    Serving does not send), unless `extra_keys` is off.

    Args:
        dataplane: what serves the models.
        config: the model config watcher, for the rollout status (None with the shortcut).
        strict_numbers: STRICT_NUMBERS: refuse NaN, Infinity and values past float32's range.
        extra_keys: TFSERVING_EXTRA_KEYS: `model_version` in predict answers, `device` in
            metadata.
    """

    def __init__(
        self,
        dataplane: DataPlane,
        config=None,
        strict_numbers: bool = False,
        extra_keys: bool = True,
    ):
        self.dataplane = dataplane
        self.config = config
        self.strict_numbers = strict_numbers
        self.extra_keys = extra_keys
        self.router = APIRouter(tags=["tf-serving"])
        r = self.router
        r.add_api_route("/v1/models", self.no_model_name, summary="Model status needs a model name")
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

    async def no_model_name(self):
        # TF Serving's words (model_servers/http_rest_api_handler.cc): it does not list models.
        raise BadInput("Missing model name in request.")

    async def model_status(self, name: str):
        return json_response(render_status(await self.dataplane.model_status(name, None)))

    async def version_status(self, name: str, version: str):
        statuses = await self.dataplane.model_status(name, version_in_url(version))
        return json_response(render_status(statuses))

    async def label_status(self, name: str, label: str):
        # TF Serving's GetModelStatus reads no label (model_servers/get_model_status_impl.cc):
        # every version is answered, whatever the label.
        return json_response(render_status(await self.dataplane.model_status(name, None)))

    async def model_metadata(self, name: str):
        return self._metadata(await self.dataplane.metadata(name, None))

    async def version_metadata(self, name: str, version: str):
        return self._metadata(await self.dataplane.metadata(name, version_in_url(version)))

    async def label_metadata(self, name: str, label: str):
        label_in_url(label)
        return self._metadata(await self.dataplane.metadata(name, None, label))

    def _metadata(self, metadata: ModelMetadata) -> Response:
        device = self.dataplane.device() if self.extra_keys else None
        return json_response(render_metadata(metadata, device))

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
        """TF Serving's REST predict (a Call route: the door has read the body).

        In TF Serving's order (model_servers/http_rest_api_handler.cc, util/json_tensor.cc):
        the URL, the body's JSON and `signature_name`, then the model, version, label and
        signature, and only then the tensors.
        """
        parsed_version = version_in_url(version)
        label_in_url(label)
        body = call.body
        parse = functools.partial(
            codec.read_predict_body, body, self.dataplane.max_images, self.strict_numbers
        )
        # A large body is parsed in a thread: it must not stall other clients' requests.
        large = len(body) > INLINE_PARSE_BYTES
        parsed = await asyncio.to_thread(parse) if large else parse()
        signature_name = parsed.signature_name
        if parsed.problem is not None:
            await self._find_signature(name, parsed_version, label, signature_name)
            raise parsed.problem
        result = await self.dataplane.predict(
            name, parsed.images, parsed_version, signature_name, label
        )
        outputs = {key: with_non_finite_literals(value) for key, value in result.outputs.items()}
        extra = {"model_version": str(result.version)} if self.extra_keys else {}
        if parsed.columnar:
            return json_response({"outputs": outputs, **extra})
        keys = list(outputs)
        rows = [dict(zip(keys, row, strict=True)) for row in zip(*outputs.values(), strict=True)]
        return json_response({"predictions": rows, **extra})

    async def _find_signature(
        self, name: str, version: int | None, label: str | None, signature_name: str
    ) -> None:
        """Raise what TF Serving would before it reads the tensors: an unknown model, version
        or label, a model not ready, an unknown signature (its words)."""
        metadata = await self.dataplane.metadata(name, version, label)
        if signature_name not in metadata.signatures:
            raise BadInput(
                f'Serving signature name: "{signature_name}" not found in signature def; '
                f"this model has {sorted(metadata.signatures)}"
            )
