"""The Open Inference Protocol (KServe's V2) over HTTP, with Triton's binary tensor data
extension: a request body (JSON, or JSON then binary tensors) to numpy, and the result to an
answer.

The binary extension (docs/protocol/extension_binary_data.md in
triton-inference-server/server), which tritonclient uses by default: a JSON header of
`Inference-Header-Content-Length` bytes, then each binary input's raw little-endian bytes in
the order of `inputs`; outputs asked for with `binary_data` (or all of them with
`binary_data_output`) come back the same way. A header length of 0 is Triton's raw binary
request: the body is the image contract's one input, every output binary.

Pure numpy and orjson: nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from artifact.contract import IMAGE_SHAPE, INPUT_KEY, OUTPUT_KEYS, to_json
from service.codecs import json_body
from service.codecs.dtypes import v2_datatype
from service.codecs.pixels import as_model_input
from service.codecs.signatures import is_image_signature
from service.codecs.v2_tensors import (
    IMAGE_BYTES,
    INPUT_TEXT,
    InferRequest,
    WireInput,
    as_bytes,
    blob,
    check_output,
    inputs_text,
    model_input,
    output_names,
    signature_inputs,
)
from service.codecs.values import is_integer
from service.errors import BadInput
from service.types import PredictResult, SignatureSpec

JSON = "application/json"
HEADER_LENGTH = "Inference-Header-Content-Length"
OCTET_STREAM = "application/octet-stream"


@dataclasses.dataclass(frozen=True)
class Encoded:
    """An answer's bytes, media type and headers (the adapter makes the HTTP response)."""

    body: bytes
    media_type: str
    headers: dict[str, str] = dataclasses.field(default_factory=dict)


def _no_limit(count: int) -> None:
    """check_count for a caller without a limit."""


def _object(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise BadInput(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


def _parameters(holder: dict, where: str) -> dict:
    # null is no parameters, as KServe and MLServer read it.
    value = holder.get("parameters")
    return {} if value is None else _object(value, f"{where}.parameters")


def _flag(parameters: dict, key: str, where: str) -> bool | None:
    value = parameters.get(key)
    if value is not None and not isinstance(value, bool):
        raise BadInput(f"{where}.parameters.{key} must be true or false, got {value!r}")
    return value


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """(JSON header, binary tensor data) as Inference-Header-Content-Length divides the body."""
    if header_length is None:
        return body, memoryview(b"")
    text = header_length.strip()
    if not (text.isascii() and text.isdigit()):
        raise BadInput(f"{HEADER_LENGTH} must be a number of bytes, got {header_length[:40]!r}")
    # Past 18 digits it is more than any body (and int() refuses past 4,300 digits).
    if len(text) > 18:
        raise BadInput(
            f"{HEADER_LENGTH} is a number of {len(text):,} digits ({text[:20]}...), but the "
            f"whole body has only {len(body)} bytes"
        )
    length = int(text)
    if length > len(body):
        raise BadInput(
            f"{HEADER_LENGTH} is {length} bytes, but the whole body has only {len(body)} "
            "(truncated body?)"
        )
    return body[:length], memoryview(body)[length:]


def parse_infer_request(
    body: bytes,
    header_length: str | None,
    check_count: Callable[[int], None] = _no_limit,
    signature: SignatureSpec | None = None,
) -> InferRequest:
    """An inference request's body (JSON, or JSON then binary tensors) to inputs and outputs.

    Args:
        body: the whole body.
        header_length: the Inference-Header-Content-Length header, if any.
        check_count: called with the number of images before any tensor data is read.
        signature: what the model takes; None (or the image contract's): one FP32 `image`.
    Raises:
        BadInput: the message names the field and says what was expected and what came.
    """
    # Any signature but the image contract's, read by its own tensors.
    generic = signature if signature is not None and not is_image_signature(signature) else None
    header, binary = split_body(body, header_length)
    if header_length is not None and not header:
        if generic is not None:
            raise BadInput(
                f"a raw binary request ({HEADER_LENGTH}: 0) has no header to say the inputs' "
                f"shapes; this model takes {inputs_text(generic)}: send the JSON header"
            )
        return _raw_binary_request(binary, check_count)
    try:
        request = _object(json_body.loads(header), "the request")
    except BadInput as err:
        if header_length is None and b'"binary_data_size"' in header:
            raise BadInput(
                f"{err.message}; a body with binary tensor data after its JSON needs the "
                f"{HEADER_LENGTH} header (the JSON's length in bytes)"
            ) from err
        raise
    request_id = request.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadInput(f"'id' must be a string, got {type(request_id).__name__}")
    binary_output = bool(_flag(_parameters(request, "request"), "binary_data_output", "request"))
    inputs = _parse_inputs(request.get("inputs"), binary, header_length is not None, signature)
    if generic is not None:
        tensors = signature_inputs(inputs, generic, check_count)
        outputs = _parse_outputs(request.get("outputs"), output_names(generic))
        return InferRequest(request_id, tensors, outputs, binary_output)
    images = model_input(inputs, check_count)
    return InferRequest(request_id, images, _parse_outputs(request.get("outputs")), binary_output)


def _raw_binary_request(binary: memoryview, check_count) -> InferRequest:
    # Triton's "raw binary request": the body is the one input's bytes, every output binary.
    if not binary or len(binary) % IMAGE_BYTES:
        raise BadInput(
            f"a raw binary request ({HEADER_LENGTH}: 0) is the input {INPUT_TEXT} as raw "
            f"little-endian floats, {IMAGE_BYTES} bytes per image; got {len(binary)} bytes"
        )
    count = len(binary) // IMAGE_BYTES
    check_count(count)
    images = np.frombuffer(binary, "<f4").reshape(count, *IMAGE_SHAPE)
    return InferRequest(None, as_model_input(images, f"input '{INPUT_KEY}'"), None, True)


def _parse_inputs(
    value: Any, binary: memoryview, has_header_length: bool, signature: SignatureSpec | None = None
) -> list[WireInput]:
    if not isinstance(value, list) or not value:
        if signature is not None and not is_image_signature(signature):
            raise BadInput(
                f"'inputs' must be a list holding the model's inputs, {inputs_text(signature)}"
            )
        raise BadInput(f"'inputs' must be a list holding the model's one input, {INPUT_TEXT}")
    inputs = []
    for i, item in enumerate(value):
        where = f"inputs[{i}]"
        item = _object(item, where)
        name = item.get("name")
        if not isinstance(name, str):
            raise BadInput(f"{where}.name must be a string, got {type(name).__name__}")
        where = f"input '{name}'"
        datatype = item.get("datatype")
        if not isinstance(datatype, str):
            raise BadInput(f"{where}: 'datatype' must be a string, got {type(datatype).__name__}")
        shape = item.get("shape")
        if not isinstance(shape, list) or not all(is_integer(d) and d >= 0 for d in shape):
            raise BadInput(
                f"{where}: 'shape' must be a list of non-negative integers, got {shape!r:.80}"
            )
        size = _parameters(item, where).get("binary_data_size")
        has_data = "data" in item
        if has_data == (size is not None):
            raise BadInput(
                f"{where} must set exactly one of 'data' and parameters.binary_data_size; "
                + ("it sets both" if has_data else "it sets neither")
            )
        if size is not None and not (is_integer(size) and size >= 0):
            raise BadInput(f"{where}: binary_data_size must be a number of bytes, got {size!r}")
        inputs.append(WireInput(where, name, datatype, shape, item.get("data"), size))
    _slice_binary(inputs, binary, has_header_length)
    return inputs


def _slice_binary(inputs: list[WireInput], binary: memoryview, has_header_length: bool) -> None:
    """Give each binary input its bytes, in the order of `inputs`; the sizes must add up."""
    binary_inputs = [(item, item.binary_size) for item in inputs if item.binary_size is not None]
    if binary_inputs and not has_header_length:
        raise BadInput(
            f"{binary_inputs[0][0].where} has binary_data_size, but the request has no "
            f"{HEADER_LENGTH} header to say where the JSON ends and the binary data begins"
        )
    declared = sum(size for _, size in binary_inputs)
    if declared > len(binary):
        raise BadInput(
            f"the inputs' binary_data_size add up to {declared} bytes, but only {len(binary)} "
            f"follow the {HEADER_LENGTH} bytes of JSON (truncated body?)"
        )
    if declared < len(binary):
        raise BadInput(
            f"{len(binary)} bytes follow the {HEADER_LENGTH} bytes of JSON, but the inputs' "
            f"binary_data_size add up to {declared}"
        )
    offset = 0
    for item, size in binary_inputs:
        item.binary = binary[offset : offset + size]
        offset += size


def _parse_outputs(
    value: Any, names: tuple[str, ...] = OUTPUT_KEYS
) -> dict[str, bool | None] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise BadInput(f"'outputs' must be a list, got {type(value).__name__}")
    requested: dict[str, bool | None] = {}
    for i, item in enumerate(value):
        item = _object(item, f"outputs[{i}]")
        name = item.get("name")
        if not isinstance(name, str):
            raise BadInput(f"outputs[{i}].name must be a string, got {type(name).__name__}")
        where = f"output '{name}'"
        parameters = _parameters(item, where)
        check_output(name, parameters, requested, names)
        requested[name] = _flag(parameters, "binary_data", where)
    return requested or None


def render_infer_response(result: PredictResult, request: InferRequest) -> Encoded:
    """The answer as JSON, or as JSON then binary tensors when any output is binary."""
    names = list(request.outputs) if request.outputs else list(result.outputs)
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name in names:
        array = result.outputs[name]
        output: dict[str, Any] = {
            "name": name,
            "datatype": v2_datatype(array.dtype),
            "shape": list(array.shape),
        }
        binary = (request.outputs or {}).get(name)
        if request.binary_output if binary is None else binary:
            data = blob(array)
            output["parameters"] = {"binary_data_size": len(data)}
            blobs.append(data)
        elif array.dtype == np.object_:
            # BYTES as JSON: UTF-8 text (KServe's JSON form of strings).
            output["data"] = [as_bytes(v).decode("utf-8", errors="replace") for v in array.ravel()]
        else:
            output["data"] = array.ravel()
        outputs.append(output)
    answer: dict[str, Any] = {"model_name": result.model, "model_version": str(result.version)}
    if request.id is not None:
        answer["id"] = request.id
    answer["outputs"] = outputs
    header = to_json(answer)
    if not blobs:
        return Encoded(header, JSON)
    return Encoded(b"".join([header, *blobs]), OCTET_STREAM, {HEADER_LENGTH: str(len(header))})
