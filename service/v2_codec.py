"""The Open Inference Protocol's wire format (KServe's V2), with Triton's binary tensor data
extension: request bodies to numpy and results to answers, for service/protocols/v2.py.

The binary extension (docs/protocol/extension_binary_data.md in
triton-inference-server/server), which tritonclient uses by default: a JSON header of
`Inference-Header-Content-Length` bytes, then each binary input's raw little-endian bytes in
the order of `inputs`; outputs asked for with `binary_data` (or all of them with
`binary_data_output`) come back the same way.

The model takes one input, `image`, FP32 [-1, 28, 28] (artifact.contract), and answers
`classes` INT64 [-1] and `probabilities` FP32 [-1, 10]. Pure numpy and orjson: nothing here
imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
from starlette.responses import Response

from artifact.contract import IMAGE_SHAPE, INPUT_KEY, OUTPUT_KEYS, SIGNATURE_NAME, to_json
from service import codec, v2_proto
from service.errors import BadInput, NotFound, PayloadTooLarge
from service.tensors import IMAGE_BATCH_SHAPE, IMAGE_ELEMENTS, V2_DATATYPES, v2_datatype
from service.types import ModelMetadata, PredictResult, TensorSpec

JSON = "application/json"
PLATFORM = "tensorflow_savedmodel"
EXTENSIONS = ("binary_tensor_data", "model_configuration")
HEADER_LENGTH = "Inference-Header-Content-Length"
OCTET_STREAM = "application/octet-stream"
INPUT_DATATYPE = "FP32"
INPUT_TEXT = f"'{INPUT_KEY}' ({INPUT_DATATYPE} {IMAGE_BATCH_SHAPE})"
IMAGE_BYTES = IMAGE_ELEMENTS * 4


@dataclasses.dataclass(frozen=True)
class InferRequest:
    """A parsed inference request.

    Attributes:
        id: the client's id, echoed back.
        images: float32 [n, 28, 28].
        outputs: the outputs asked for, in order, each with its `binary_data` (None: not
            said); None when the request names none (then every output is sent).
        binary_output: how outputs that do not say are sent (`binary_data_output`).
    """

    id: str | None
    images: np.ndarray
    outputs: dict[str, bool | None] | None
    binary_output: bool


@dataclasses.dataclass
class _Input:
    where: str
    name: str
    datatype: str
    shape: list[int]
    data: Any = None
    binary_size: int | None = None
    binary: memoryview | None = None
    # What the message calls the binary data's size ("binary_data_size is", over HTTP).
    binary_field: str = "binary_data_size is"
    # What the message calls the values ("'data'", over HTTP).
    data_field: str = "'data'"


# --- parsing --------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
    check_count: Callable[[int], None] = lambda count: None,
) -> InferRequest:
    """An inference request's body (JSON, or JSON then binary tensors) to images and outputs.

    Args:
        body: the whole body.
        header_length: the Inference-Header-Content-Length header, if any.
        check_count: called with the number of images before any tensor data is read.
    Raises:
        BadInput: the message names the field and says what was expected and what came.
    """
    header, binary = split_body(body, header_length)
    if header_length is not None and not header:
        return _raw_binary_request(binary, check_count)
    try:
        request = _object(codec.loads(header), "the request")
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
    inputs = _parse_inputs(request.get("inputs"), binary, header_length is not None)
    images = _model_input(inputs, check_count)
    return InferRequest(request_id, images, _parse_outputs(request.get("outputs")), binary_output)


def _model_input(inputs: list[_Input], check_count: Callable[[int], None]) -> np.ndarray:
    """The model's one input as float32 [n, 28, 28], checked by the rules both transports
    share (names, datatype, shape, the count, the values' size and finiteness)."""
    (image,) = _check_inputs(inputs)
    count = image.shape[0]
    check_count(count)
    if image.binary is not None:
        if len(image.binary) != count * IMAGE_BYTES:
            raise BadInput(
                f"{image.where}: {image.binary_field} {len(image.binary)} bytes; shape "
                f"{image.shape} of {INPUT_DATATYPE} takes {count * IMAGE_BYTES}"
            )
        images = np.frombuffer(image.binary, "<f4").reshape(image.shape)
    else:
        images = _json_tensor(image)
    return codec.as_model_input(images, image.where)


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
    return InferRequest(None, codec.as_model_input(images, f"input '{INPUT_KEY}'"), None, True)


def _parse_inputs(value: Any, binary: memoryview, has_header_length: bool) -> list[_Input]:
    if not isinstance(value, list) or not value:
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
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
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
        if size is not None and not (_is_int(size) and size >= 0):
            raise BadInput(f"{where}: binary_data_size must be a number of bytes, got {size!r}")
        inputs.append(_Input(where, name, datatype, shape, item.get("data"), size))
    _slice_binary(inputs, binary, has_header_length)
    return inputs


def _slice_binary(inputs: list[_Input], binary: memoryview, has_header_length: bool) -> None:
    """Give each binary input its bytes, in the order of `inputs`; the sizes must add up."""
    binary_inputs = [item for item in inputs if item.binary_size is not None]
    if binary_inputs and not has_header_length:
        raise BadInput(
            f"{binary_inputs[0].where} has binary_data_size, but the request has no "
            f"{HEADER_LENGTH} header to say where the JSON ends and the binary data begins"
        )
    declared = sum(item.binary_size for item in binary_inputs)
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
    for item in binary_inputs:
        item.binary = binary[offset : offset + item.binary_size]
        offset += item.binary_size


def _check_inputs(inputs: list[_Input]) -> list[_Input]:
    names = [item.name for item in inputs]
    for item in inputs:
        if item.name != INPUT_KEY:
            raise BadInput(f"unknown input '{item.name}': the model takes one input, {INPUT_TEXT}")
    if len(names) > 1:
        raise BadInput(f"input '{INPUT_KEY}' is given {len(names)} times; send it once")
    (image,) = inputs
    if image.datatype != INPUT_DATATYPE:
        if image.datatype not in V2_DATATYPES:
            raise BadInput(
                f"{image.where}: unknown datatype {image.datatype!r:.40}; the model takes "
                f"{INPUT_DATATYPE} (datatypes: {', '.join(sorted(V2_DATATYPES))})"
            )
        raise BadInput(
            f"{image.where}: datatype {image.datatype} does not match the model's {INPUT_DATATYPE}"
        )
    if len(image.shape) != 3 or tuple(image.shape[1:]) != IMAGE_SHAPE:
        raise BadInput(
            f"{image.where}: shape {image.shape} does not match the model's {IMAGE_BATCH_SHAPE}"
        )
    if image.shape[0] == 0:
        raise BadInput(f"{image.where} has no images (shape {image.shape}); send at least one")
    return inputs


def _json_tensor(item: _Input) -> np.ndarray:
    """A tensor's `data` (flat or nested, row-major; or gRPC's typed contents, already an
    array) as numbers of the declared shape."""
    if isinstance(item.data, np.ndarray):
        values = item.data
    else:
        if not isinstance(item.data, list):
            raise BadInput(
                f"{item.where}: 'data' must be an array of numbers, got {type(item.data).__name__}"
            )
        try:
            values = np.array(item.data)
        except (ValueError, TypeError, OverflowError):
            values = None
        if values is None or values.dtype == np.object_:
            raise BadInput(
                f"{item.where}: 'data' must be a regular array of numbers (ragged lists?)"
            )
    if values.dtype.kind not in "iuf":
        kind = {"b": "booleans", "U": "strings"}.get(values.dtype.kind, f"{values.dtype}")
        raise BadInput(f"{item.where}: 'data' must hold numbers for {item.datatype}, got {kind}")
    elements = int(np.prod(item.shape))
    if values.size != elements:
        raise BadInput(
            f"{item.where}: shape {item.shape} takes {elements} values; {item.data_field} has "
            f"{values.size}"
        )
    return values.reshape(item.shape)


def _parse_outputs(value: Any) -> dict[str, bool | None] | None:
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
        _check_output(name, parameters, requested)
        requested[name] = _flag(parameters, "binary_data", where)
    return requested or None


def _check_output(name: str, parameters, requested) -> None:
    """An output asked for: one of the model's, once, without classification (both
    transports' rule)."""
    where = f"output '{name}'"
    if name not in OUTPUT_KEYS:
        raise BadInput(
            f"unknown {where}: the model's outputs are "
            + ", ".join(f"'{key}'" for key in OUTPUT_KEYS)
        )
    if name in requested:
        raise BadInput(f"{where} is requested twice")
    if "classification" in parameters:
        raise BadInput(
            f"{where}: the classification extension is not supported (see the server "
            "metadata's 'extensions'); request the probabilities instead"
        )


# --- compressed bodies ----------------------------------------------------------------------

# Content-Encoding -> zlib's wbits: gzip's format; deflate is the zlib format (RFC 9110, 8.4.1.2),
# what tritonclient's request_compression_algorithm="deflate" sends (zlib.compress).
COMPRESSED = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
# A compressed body is decompressed a piece at a time, each reserved first.
DECOMPRESS_CHUNK_BYTES = 256 * 1024


def _no_budget(count: int) -> None:
    """decompress_body without a budget to reserve from (a caller outside a request)."""


def decompress_body(
    body: bytes, encoding: str | None, limit: int, reserve: Callable[[int], None] = _no_budget
) -> bytes:
    """A body as its Content-Encoding (gzip, deflate or identity) says to read it, within
    `limit` bytes once decompressed: decompressed incrementally, so a body that would expand
    past the limit costs no more than the limit in memory.

    Args:
        reserve: `reserve(n)` for n more bytes kept, from the process's budget of bodies in
            flight (a Call's `reserve`), a piece (DECOMPRESS_CHUNK_BYTES at most) at a time;
            the pieces and the whole they are joined into are counted both, since both exist
            for a moment.

    Raises:
        PayloadTooLarge: more than `limit` bytes decompressed (MAX_BODY_BYTES).
        BadInput: an encoding other than these, or a body that is not what it says.
        BodiesInFlight: `reserve` found no room (503).
    """
    name = (encoding or "identity").strip().lower()
    if name == "identity":
        return body
    if name not in COMPRESSED:
        raise BadInput(
            f"Content-Encoding {name!r:.40} is not supported; send gzip, deflate or identity"
        )
    stream = zlib.decompressobj(COMPRESSED[name])
    pieces: list[bytes] = []
    size = 0
    pending = body
    while True:
        # At most one piece is held before it is counted.
        room = min(DECOMPRESS_CHUNK_BYTES, limit + 1 - size)
        try:
            piece = stream.decompress(pending, room)
        except zlib.error as err:
            raise BadInput(f"the body is not valid {name} data (Content-Encoding): {err}") from err
        reserve(len(piece))
        pieces.append(piece)
        size += len(piece)
        pending = stream.unconsumed_tail
        if size > limit:
            raise PayloadTooLarge(
                f"the {name} body is over {limit} bytes decompressed; the limit is {limit} "
                "bytes (MAX_BODY_BYTES)"
            )
        if stream.eof or not pending:
            break
    reserve(size)
    data = b"".join(pieces)
    del pieces
    if not stream.eof:
        raise BadInput(f"the {name} body ends before its compressed data does (truncated?)")
    if stream.unused_data:
        raise BadInput(
            f"the {name} body has {len(stream.unused_data)} bytes after its compressed data"
        )
    return data


# --- the gRPC messages ----------------------------------------------------------------------

# A datatype -> the InferTensorContents field that holds its values (inference_grpc.md).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    **dict.fromkeys(("INT8", "INT16", "INT32"), "int_contents"),
    "INT64": "int64_contents",
    **dict.fromkeys(("UINT8", "UINT16", "UINT32"), "uint_contents"),
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parse_grpc_infer_request(
    request, check_count: Callable[[int], None] = lambda count: None
) -> InferRequest:
    """A gRPC ModelInferRequest (service/v2_proto.py) to images and outputs, by the HTTP
    route's rules: the same checks, the same messages, the fields named as gRPC names them.

    Inputs come as typed `contents` or as `raw_input_contents` (one entry per input, in
    order); the answer uses the same form (`InferRequest.binary_output`).

    Raises:
        BadInput: the message names the field and says what was expected and what came.
    """
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise BadInput(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs; "
            "send one per input, in the order of 'inputs'"
        )
    if not request.inputs:
        raise BadInput(f"'inputs' must hold the model's one input, {INPUT_TEXT}")
    inputs = []
    for i, tensor in enumerate(request.inputs):
        where = f"input '{tensor.name}'"
        shape = list(tensor.shape)
        if any(d < 0 for d in shape):
            raise BadInput(f"{where}: 'shape' must hold non-negative integers, got {shape}")
        item = _Input(where, tensor.name, tensor.datatype, shape)
        filled = [field.name for field, _ in tensor.contents.ListFields()]
        if raw:
            if filled:
                raise BadInput(
                    f"{where} sets contents, but the request has raw_input_contents: send "
                    "every input one way (inference_grpc.md)"
                )
            item.binary = memoryview(raw[i])
            item.binary_field = f"raw_input_contents[{i}] has"
        else:
            field = CONTENTS_FIELD.get(tensor.datatype)
            stray = [name for name in filled if name != field]
            if stray and tensor.datatype == INPUT_DATATYPE:
                raise BadInput(
                    f"{where}: its values are in contents.{stray[0]}; {INPUT_DATATYPE} "
                    f"takes contents.{field}"
                )
            item.data_field = f"contents.{field}"
            if field is not None:
                item.data = np.asarray(getattr(tensor.contents, field), np.float32)
        inputs.append(item)
    images = _model_input(inputs, check_count)
    requested: dict[str, bool | None] = {}
    for output in request.outputs:
        _check_output(output.name, output.parameters, requested)
        requested[output.name] = None
    return InferRequest(request.id or None, images, requested or None, bool(raw))


def render_grpc_infer_response(result: PredictResult, request: InferRequest):
    """The answer as a ModelInferResponse: outputs as raw_output_contents when the request
    sent raw_input_contents, else as typed contents (as KServe answers)."""
    response = v2_proto.ModelInferResponse(
        model_name=result.model, model_version=str(result.version), id=request.id or ""
    )
    for name in list(request.outputs) if request.outputs else list(result.outputs):
        array = result.outputs[name]
        datatype = v2_datatype(array.dtype)
        output = response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        if request.binary_output:
            blob = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            response.raw_output_contents.append(blob)
        else:
            getattr(output.contents, CONTENTS_FIELD[datatype]).extend(array.ravel().tolist())
    return response


# --- rendering ------------------------------------------------------------------------------


def render_infer_response(result: PredictResult, request: InferRequest) -> Response:
    """The answer as JSON, or as JSON then binary tensors when any output is binary."""
    names = list(request.outputs) if request.outputs else list(result.outputs)
    outputs, blobs = [], []
    for name in names:
        array = result.outputs[name]
        output = {"name": name, "datatype": v2_datatype(array.dtype), "shape": list(array.shape)}
        binary = (request.outputs or {}).get(name)
        if request.binary_output if binary is None else binary:
            blob = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            output["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            output["data"] = array.ravel()
        outputs.append(output)
    answer: dict[str, Any] = {"model_name": result.model, "model_version": str(result.version)}
    if request.id is not None:
        answer["id"] = request.id
    answer["outputs"] = outputs
    header = to_json(answer)
    if not blobs:
        return Response(header, media_type=JSON)
    return Response(
        b"".join([header, *blobs]),
        media_type=OCTET_STREAM,
        headers={HEADER_LENGTH: str(len(header))},
    )


def render_tensor(spec: TensorSpec) -> dict:
    """A signature's tensor as V2 metadata: name, datatype and shape, -1 for any size."""
    # A tensor of unknown rank has no V2 shape; one dimension of any size says the least.
    shape = list(spec.shape) if spec.shape is not None else [-1]
    return {"name": spec.name, "datatype": v2_datatype(spec.dtype), "shape": shape}


def _serving_signature(metadata: ModelMetadata):
    signature = metadata.signatures.get(SIGNATURE_NAME)
    if signature is None:
        raise NotFound(
            f"version {metadata.version} of {metadata.name} has no {SIGNATURE_NAME!r} signature"
        )
    return signature


def render_model_metadata(metadata: ModelMetadata, versions: list[int]) -> dict:
    """A version's serving signature as the V2 model metadata object."""
    signature = _serving_signature(metadata)
    return {
        "name": metadata.name,
        "versions": [str(v) for v in versions],
        "platform": PLATFORM,
        "inputs": [render_tensor(spec) for spec in signature.inputs],
        "outputs": [render_tensor(spec) for spec in signature.outputs],
    }


def _config_tensor(spec: TensorSpec) -> dict:
    # Triton's dims leave out the batch dimension; a tensor that is only a batch ([-1]) is
    # dims [1] reshaped to [] (docs/user_guide/model_configuration.md, "Reshape", in
    # triton-inference-server/server).
    datatype = v2_datatype(spec.dtype)
    tensor: dict[str, Any] = {
        "name": spec.name,
        "data_type": "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}",
    }
    dims = [-1] if spec.shape is None else list(spec.shape[1:])
    tensor["dims"] = dims or [1]
    if not dims:
        tensor["reshape"] = {"shape": []}
    return tensor


def render_model_config(metadata: ModelMetadata, max_batch_size: int) -> dict:
    """A version's serving signature as Triton's model configuration (the model configuration
    extension, docs/protocol/extension_model_configuration.md in
    triton-inference-server/server): the fields of model_config.proto that a signature
    decides.

    Args:
        max_batch_size: the most images one request may hold (MAX_IMAGES).
    """
    signature = _serving_signature(metadata)
    return {
        "name": metadata.name,
        "platform": PLATFORM,
        "max_batch_size": max_batch_size,
        "input": [_config_tensor(spec) for spec in signature.inputs],
        "output": [_config_tensor(spec) for spec in signature.outputs],
    }
