"""TensorFlow Serving's REST API (g3doc/api_rest.md): model status, metadata and predict.

A client written for TF Serving works unchanged against this service: the same URLs, the
row (`instances`) and columnar (`inputs`) formats, and TF Serving's `{"error": "..."}` bodies.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from starlette.responses import Response

from artifact.contract import SIGNATURE_NAME
from service import tracing
from service.codecs import tf_example, tfserving_json
from service.dataplane import DataPlane
from service.errors import BadInput, redact_paths
from service.protocols.http import json_response, label_in_url, version_in_url
from service.routes import MODEL_READ, MODEL_WRITE, Answers, Body, Call, Route, admit_always
from service.security import PREDICT, STATUS
from service.types import ModelMetadata, VersionStatus

# The per-model metrics' protocol label (service/metrics.py); each route also says TF Serving's
# API label (its URL's verb; empty for status and metadata, as TF Serving counts them).
PROTOCOL = "tfserving_rest"
# Bodies up to this size (a few images) are parsed on the event loop: a thread hop costs more
# than they do.
INLINE_PARSE_BYTES = 64 * 1024

PREDICT_BODY = Body(
    {
        "type": "object",
        "properties": {
            "signature_name": {"type": "string", "default": SIGNATURE_NAME},
            "instances": {
                "type": "array",
                "description": "Row format: one value per instance, or an object of the "
                "signature's inputs by name",
            },
            "inputs": {
                "description": "Columnar format: a tensor, or an object of tensors by input name"
            },
        },
    },
    {"instances": [[[0.0] * 28] * 28]},
)
EXAMPLES_BODY = Body(
    {
        "type": "object",
        "required": ["examples"],
        "properties": {
            "signature_name": {"type": "string", "default": SIGNATURE_NAME},
            "context": {"type": "object", "description": "features for every example"},
            "examples": {"type": "array", "items": {"type": "object"},
                         "description": "features by name"},
        },
    },
    {"examples": [{"x1": 0.5, "color": "red"}]},
)  # fmt: skip
PREDICT_ANSWER = {
    "type": "object",
    "properties": {
        "predictions": {"description": "Row format: one entry per instance"},
        "outputs": {"description": "Columnar format: the outputs by name"},
        "model_version": {"type": "string", "description": "Not in TF Serving's answer"},
    },
}
CLASSIFY_ANSWER = {
    "type": "object",
    "properties": {
        "results": {
            "type": "array",
            "description": "Per example: [label, score] pairs",
            "items": {"type": "array", "items": {"type": "array"}},
        },
        "model_version": {"type": "string"},
    },
}
REGRESS_ANSWER = {
    "type": "object",
    "properties": {
        "results": {"type": "array", "items": {"type": "number"}},
        "model_version": {"type": "string"},
    },
}
STATUS_ANSWER = {
    "type": "object",
    "properties": {
        "model_version_status": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "version": {"type": "string"},
                    "state": {"type": "string"},
                    "status": {"type": "object"},
                },
            },
        }
    },
}
METADATA_ANSWER = {
    "type": "object",
    "properties": {
        "model_spec": {"type": "object"},
        "metadata": {"type": "object", "properties": {"signature_def": {"type": "object"}}},
        "device": {"type": "string", "description": "Not in TF Serving's answer"},
    },
}
ROLLOUT_ANSWER = {
    "type": "object",
    "properties": {
        "model": {"type": "string"},
        "serving_version": {"type": ["integer", "null"]},
        "labels": {"type": "object"},
    },
}

# TF Serving prints a signature's empty fields too (a dim's size 0, an empty name). protobuf
# 5.26 renamed the option; the service runs on protobuf 6, and on TF 2.15's protobuf 4 for the
# benchmark's comparison of TensorFlow versions.
PRINT_DEFAULT_VALUES: dict[str, Any] = (
    {"always_print_fields_with_no_presence": True}
    if "always_print_fields_with_no_presence" in inspect.signature(MessageToDict).parameters
    else {"including_default_value_fields": True}
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

    def routes(self) -> list[Route]:
        """The /v1 routes: TF Serving's, and the rollout status. Their fixed words match in
        any case, as TF Serving's URL patterns do."""
        tags = ("tf-serving",)

        def status(path: str, handler, summary: str, **more) -> Route:
            more.setdefault("answers", Answers(schema=STATUS_ANSWER, errors=MODEL_READ))
            more.setdefault("tags", tags)
            more.setdefault("protocol", PROTOCOL)
            more.setdefault("tf_api", "")
            return Route("GET", path, handler, summary, STATUS, any_case=True, **more)

        admit = admit_always(self.dataplane.admit)
        routes = []
        # The predictions first: the table tries a prefix's routes in this order.
        for verb, handler, body, answer in (
            ("predict", self.predict, PREDICT_BODY, PREDICT_ANSWER),
            ("classify", self.classify, EXAMPLES_BODY, CLASSIFY_ANSWER),
            ("regress", self.regress, EXAMPLES_BODY, REGRESS_ANSWER),
        ):
            for path, which in (
                (f"/v1/models/{{name:name}}:{verb}", "the serving version"),
                (f"/v1/models/{{name:name}}/versions/{{version}}:{verb}", "one version"),
                (f"/v1/models/{{name:name}}/labels/{{label:name}}:{verb}", "a labeled version"),
            ):
                routes.append(
                    Route(
                        "POST",
                        path,
                        handler,
                        f"{verb.capitalize()} with {which}",
                        PREDICT,
                        tags,
                        body,
                        Answers(schema=answer, errors=MODEL_WRITE),
                        before_body=admit,
                        any_case=True,
                        protocol=PROTOCOL,
                        tf_api=verb,
                    )  # fmt: skip
                )
        metadata = {"answers": Answers(schema=METADATA_ANSWER, errors=MODEL_READ)}
        return [
            *routes,
            status("/v1/models/{name:name}", self.model_status, "Model status (all versions)"),
            status("/v1/models/{name:name}/versions/{version}", self.version_status,
                   "Version status"),
            status("/v1/models/{name:name}/labels/{label:name}", self.label_status,
                   "Labeled version status"),
            status("/v1/models/{name:name}/metadata", self.model_metadata,
                   "Signatures (serving)", **metadata),
            status("/v1/models/{name:name}/versions/{version}/metadata", self.version_metadata,
                   "Signatures of a version", **metadata),
            status("/v1/models/{name:name}/labels/{label:name}/metadata", self.label_metadata,
                   "Signatures of a labeled version", **metadata),
            status("/v1/models/{name:name}/rollout", self.rollout,
                   "Serving version, labels, canary and shadow traffic (not in TF Serving)",
                   tags=("rollout",), answers=Answers(schema=ROLLOUT_ANSWER, errors=MODEL_READ),
                   protocol="", tf_api=None),
            status("/v1/models", self.no_model_name, "Model status needs a model name",
                   answers=Answers(errors=(400,)), protocol="", tf_api=None),
        ]  # fmt: skip

    @staticmethod
    def malformed_url(method: str, path: str) -> BadInput:
        """TF Serving's answer to any /v1 URL it cannot parse (a version and a label at once,
        a method a route does not take): 400, in its words
        (model_servers/http_rest_api_handler.cc)."""
        return BadInput(f"Malformed request: {method} {path}")

    async def no_model_name(self, call: Call):
        # TF Serving's words (model_servers/http_rest_api_handler.cc): it does not list models.
        raise BadInput("Missing model name in request.")

    async def model_status(self, call: Call, name: str):
        return json_response(render_status(await self.dataplane.model_status(name, None)))

    async def version_status(self, call: Call, name: str, version: str):
        statuses = await self.dataplane.model_status(name, version_in_url(version))
        return json_response(render_status(statuses))

    async def label_status(self, call: Call, name: str, label: str):
        # TF Serving's GetModelStatus reads no label (model_servers/get_model_status_impl.cc):
        # every version is answered, whatever the label.
        return json_response(render_status(await self.dataplane.model_status(name, None)))

    async def model_metadata(self, call: Call, name: str):
        return self._metadata(await self.dataplane.metadata(name, None))

    async def version_metadata(self, call: Call, name: str, version: str):
        return self._metadata(await self.dataplane.metadata(name, version_in_url(version)))

    async def label_metadata(self, call: Call, name: str, label: str):
        label_in_url(label)
        return self._metadata(await self.dataplane.metadata(name, None, label))

    def _metadata(self, metadata: ModelMetadata) -> Response:
        device = self.dataplane.device() if self.extra_keys else None
        return json_response(render_metadata(metadata, device))

    async def rollout(self, call: Call, name: str):
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
        signature, and only then the tensors, read as the signature types them
        (service/codecs/tfserving_json.py).
        """
        parsed_version = version_in_url(version)
        label_in_url(label)
        body = call.body
        # A large body is parsed in a thread: it must not stall other clients' requests.
        large = len(body) > INLINE_PARSE_BYTES

        async def parse(function, *args):
            return await asyncio.to_thread(function, *args) if large else function(*args)

        max_images = self.dataplane.max_images
        with tracing.span("parse"):
            request = await parse(
                tfserving_json.read_predict_request, body, max_images, self.strict_numbers
            )
        signature_name = request.signature_name
        signature = await self.dataplane.signature(name, parsed_version, label, signature_name)
        with tracing.span("read inputs"):
            inputs = await parse(request.inputs, signature, max_images)
        result = await self.dataplane.predict(name, inputs, parsed_version, signature_name, label)
        extra = {"model_version": str(result.version)} if self.extra_keys else {}
        with tracing.span("render"):
            key, value = tfserving_json.render_outputs(result.outputs, request.columnar)
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
        request = tfserving_json.read_predict_request(
            body, self.dataplane.max_images, self.strict_numbers
        )
        return request.signature_name, request.json()

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
        tf_example.check_example_signature(
            signature,
            signature_name,
            kind,
            lambda: str(metadata.signature_defs.signature_def.get(signature_name, "")),
        )
        batch = tf_example.json_examples(request, self.dataplane.max_images)
        # The context is copied into every example: counted, and held in the body budget,
        # before any copy is made; many copies are made off the event loop.
        copies = batch.serialized_bytes()
        call.reserve(copies)
        if large or copies > INLINE_PARSE_BYTES:
            serialized = await asyncio.to_thread(batch.serialize)
        else:
            serialized = batch.serialize()
        result = await self.dataplane.predict(
            name,
            tf_example.example_inputs(serialized),
            parsed_version,
            signature_name,
            label,
            api="Classify" if kind == "classification" else "Regress",
        )
        answer: dict[str, Any]
        if kind == "classification":
            results = tf_example.classifications(result.outputs, len(serialized))
            answer = {"results": [[[c, s] for c, s in row] for row in results]}
        else:
            answer = {"results": tf_example.regressions(result.outputs, len(serialized))}
        if self.extra_keys:
            answer["model_version"] = str(result.version)
        return json_response(answer)
