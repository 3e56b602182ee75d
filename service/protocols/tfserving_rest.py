"""TensorFlow Serving's REST API (g3doc/api_rest.md): model status, metadata and predict.

A client written for TF Serving works unchanged against this service: the same URLs, the
row (`instances`) and columnar (`inputs`) formats, and TF Serving's `{"error": "..."}` bodies.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

from fastapi import APIRouter
from google.protobuf.json_format import MessageToDict
from starlette.responses import Response

from artifact.contract import SIGNATURE_NAME
from service import codec, examples, tensor_json
from service.dataplane import DataPlane
from service.errors import BadInput, redact_paths
from service.protocols.http import (
    Call,
    CallRoute,
    admit_always,
    json_response,
    label_in_url,
    request_body,
    version_in_url,
)
from service.tensors import is_image_signature
from service.types import ModelMetadata, VersionStatus

# Bodies up to this size (a few images) are parsed on the event loop: a thread hop costs more
# than they do.
INLINE_PARSE_BYTES = 64 * 1024

PREDICT_DOC = request_body(
    {
        "type": "object",
        "properties": {
            "signature_name": {"type": "string", "default": SIGNATURE_NAME},
            "instances": {
                "type": "array",
                "description": "Row format: 28x28 float arrays, or {'image': array}",
            },
            "inputs": {"description": "Columnar format: [n, 28, 28] or {'image': [n, 28, 28]}"},
        },
    },
    {"instances": [[[0.0] * 28] * 28]},
)

# TF Serving prints a signature's empty fields too (a dim's size 0, an empty name). protobuf
# 5.26 renamed the option; the service runs on protobuf 6, and on TF 2.15's protobuf 4 for the
# benchmark's comparison of TensorFlow versions.
PRINT_DEFAULT_VALUES = (
    {"always_print_fields_with_no_presence": True}
    if "always_print_fields_with_no_presence" in inspect.signature(MessageToDict).parameters
    else {"including_default_value_fields": True}
)


EXAMPLES_DOC = request_body(
    {
        "type": "object",
        "properties": {
            "signature_name": {"type": "string", "default": SIGNATURE_NAME},
            "context": {"type": "object", "description": "features for every example"},
            "examples": {"type": "array", "description": "features by name"},
        },
    },
    {"examples": [{"x1": 0.5, "color": "red"}]},
)


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
        metadata.signature_defs, preserving_proto_field_name=True, **PRINT_DEFAULT_VALUES
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
        routes = []
        for verb, handler, doc in (
            ("predict", self.predict, PREDICT_DOC),
            ("classify", self.classify, EXAMPLES_DOC),
            ("regress", self.regress, EXAMPLES_DOC),
        ):
            for path, summary in (
                (f"/v1/models/{{name:name}}:{verb}", "the serving version"),
                (f"/v1/models/{{name:name}}/versions/{{version}}:{verb}", "one version"),
                (f"/v1/models/{{name:name}}/labels/{{label:name}}:{verb}", "a labeled version"),
            ):
                summary = f"{verb.capitalize()} with {summary}"
                routes.append(
                    CallRoute("POST", path, handler, summary, ("tf-serving",), doc, before_body)
                )
        return routes

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
        signature, and only then the tensors, read as the signature types them. A signature
        taking the image contract's input reads them by the image fast paths.
        """
        parsed_version = version_in_url(version)
        label_in_url(label)
        body = call.body
        # A large body is parsed in a thread: it must not stall other clients' requests.
        large = len(body) > INLINE_PARSE_BYTES

        async def parse(function, *args):
            return await asyncio.to_thread(function, *args) if large else function(*args)

        max_images, strict = self.dataplane.max_images, self.strict_numbers
        parsed = await parse(codec.read_predict_body, body, max_images, strict, False)
        signature_name = parsed.signature_name
        signature = await self.dataplane.signature(name, parsed_version, label, signature_name)
        if is_image_signature(signature):
            parsed = await parse(codec.image_tensors, parsed, body, max_images, strict)
            if parsed.problem is not None:
                raise parsed.problem
            inputs, columnar = parsed.images, parsed.columnar
        else:
            request = parsed.request
            if request is None:  # the usual image body, read by the fast path
                request = codec.loads(body, non_finite=not strict)
            inputs, columnar = await parse(
                tensor_json.read_inputs, request, signature, max_images, strict
            )
        result = await self.dataplane.predict(name, inputs, parsed_version, signature_name, label)
        extra = {"model_version": str(result.version)} if self.extra_keys else {}
        key, value = tensor_json.render_outputs(result.outputs, columnar)
        return json_response({key: value, **extra})

    async def classify(
        self, call: Call, name: str, version: str | None = None, label: str | None = None
    ) -> Response:
        """TF Serving's REST classify: `examples` (and `context`) as tf.Examples through a
        signature that parses them; `{"results": [[[label, score], ...], ...]}`."""
        return await self._examples(call, name, version, label, "classification")

    async def regress(
        self, call: Call, name: str, version: str | None = None, label: str | None = None
    ) -> Response:
        """TF Serving's REST regress: `{"results": [value, ...]}`."""
        return await self._examples(call, name, version, label, "regression")

    def _read_json(self, body: bytes) -> tuple[str, dict]:
        """(signature_name, the whole request) of a :classify or :regress body."""
        parsed = codec.read_predict_body(
            body, self.dataplane.max_images, self.strict_numbers, False
        )
        request = parsed.request
        if request is None:
            request = codec.loads(body, non_finite=not self.strict_numbers)
        return parsed.signature_name, request

    async def _examples(self, call: Call, name, version, label, kind: str) -> Response:
        parsed_version = version_in_url(version)
        label_in_url(label)
        body = call.body
        large = len(body) > INLINE_PARSE_BYTES
        if large:
            signature_name, request = await asyncio.to_thread(self._read_json, body)
        else:
            signature_name, request = self._read_json(body)
        metadata = await self.dataplane.metadata(name, parsed_version, label)
        signature = metadata.signatures.get(signature_name)
        examples.check_example_signature(
            signature,
            signature_name,
            kind,
            lambda: str(metadata.signature_defs.signature_def.get(signature_name, "")),
        )
        batch = examples.json_examples(request, self.dataplane.max_images)
        # The context is copied into every example: counted, and held in the body budget,
        # before any copy is made; many copies are made off the event loop.
        copies = batch.serialized_bytes()
        call.reserve(copies)
        if large or copies > INLINE_PARSE_BYTES:
            serialized = await asyncio.to_thread(batch.serialize)
        else:
            serialized = batch.serialize()
        result = await self.dataplane.predict(
            name, examples.example_inputs(serialized), parsed_version, signature_name, label
        )
        if kind == "classification":
            results = examples.classifications(result.outputs, len(serialized))
            body = {"results": [[[c, s] for c, s in row] for row in results]}
        else:
            body = {"results": examples.regressions(result.outputs, len(serialized))}
        if self.extra_keys:
            body["model_version"] = str(result.version)
        return json_response(body)
