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
from service.tensors import (
    IMAGE_BATCH_SHAPE,
    IMAGE_ELEMENTS,
    V2_DATATYPES,
    V2_OF_NUMPY,
    is_image_signature,
    v2_datatype,
)
from service.types import Inputs, ModelMetadata, PredictResult, SignatureSpec, TensorSpec

JSON = "application/json"
NUMPY_OF_V2 = {datatype: dtype for dtype, datatype in V2_OF_NUMPY.items()}
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
        images: float32 [n, 28, 28] for the image contract's signature; each input by name
            for any other.
        outputs: the outputs asked for, in order, each with its `binary_data` (None: not
            said); None when the request names none (then every output is sent).
        binary_output: how outputs that do not say are sent (`binary_data_output`).
    """

    id: str | None
    images: Inputs
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
    generic = signature is not None and not is_image_signature(signature)
    header, binary = split_body(body, header_length)
    if header_length is not None and not header:
        if generic:
            raise BadInput(
                f"a raw binary request ({HEADER_LENGTH}: 0) has no header to say the inputs' "
                f"shapes; this model takes {_inputs_text(signature)}: send the JSON header"
            )
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
    inputs = _parse_inputs(request.get("inputs"), binary, header_length is not None, signature)
    if generic:
        tensors = signature_inputs(inputs, signature, check_count)
        outputs = _parse_outputs(request.get("outputs"), _output_names(signature))
        return InferRequest(request_id, tensors, outputs, binary_output)
    images = _model_input(inputs, check_count)
    return InferRequest(request_id, images, _parse_outputs(request.get("outputs")), binary_output)


def _output_names(signature: SignatureSpec) -> tuple[str, ...]:
    return tuple(spec.name for spec in signature.outputs)


def _inputs_text(signature: SignatureSpec) -> str:
    return ", ".join(
        f"'{spec.name}' ({_datatype_or_none(spec.dtype)} "
        f"{list(spec.shape) if spec.shape is not None else [-1]})"
        for spec in signature.inputs
    )


def _datatype_or_none(dtype) -> str:
    try:
        return v2_datatype(dtype)
    except ValueError:
        return "unsupported"


def signature_inputs(
    inputs: list[_Input], signature: SignatureSpec, check_count: Callable[[int], None]
) -> dict[str, np.ndarray]:
    """Every input of any signature, checked by the rules both transports share: each
    named once and none missing, the signature's datatype, a shape it takes, the values'
    count (and, for BYTES sent binary, Triton's length-prefixed elements)."""
    specs = {spec.name: spec for spec in signature.inputs}
    seen: set[str] = set()
    for item in inputs:
        if item.name not in specs:
            raise BadInput(
                f"unknown input '{item.name}': the model takes {_inputs_text(signature)}"
            )
        if item.name in seen:
            raise BadInput(f"input '{item.name}' is given more than once; send it once")
        seen.add(item.name)
    missing = [name for name in specs if name not in seen]
    if missing:
        raise BadInput(
            f"input '{missing[0]}' is missing: the model takes {_inputs_text(signature)}"
        )
    tensors = {}
    counted = False
    for item in inputs:
        spec = specs[item.name]
        datatype = _datatype_or_none(spec.dtype)
        if item.datatype != datatype:
            if item.datatype not in V2_DATATYPES:
                raise BadInput(
                    f"{item.where}: unknown datatype {item.datatype!r:.40}; the model takes "
                    f"{datatype} (datatypes: {', '.join(sorted(V2_DATATYPES))})"
                )
            raise BadInput(
                f"{item.where}: datatype {item.datatype} does not match the model's {datatype}"
            )
        if spec.shape is not None and not (
            len(spec.shape) == len(item.shape)
            and all(want in (-1, got) for want, got in zip(spec.shape, item.shape, strict=True))
        ):
            raise BadInput(
                f"{item.where}: shape {item.shape} does not match the model's {list(spec.shape)}"
            )
        if spec.shape and spec.shape[0] == -1 and not counted:
            check_count(item.shape[0])
            counted = True
        tensors[item.name] = _typed_tensor(item, spec.dtype)
    rows = {
        len(tensors[name]) for name, spec in specs.items() if spec.shape and spec.shape[0] == -1
    }
    if len(rows) > 1:
        raise BadInput(
            f"the inputs' batch sizes differ ({sorted(rows)}); each must hold as many instances"
        )
    return tensors


def _typed_tensor(item: _Input, dtype: np.dtype) -> np.ndarray:
    """One input's values as its dtype: binary (little-endian, or length-prefixed BYTES),
    JSON `data` (flat or nested, row-major) or gRPC's typed contents."""
    elements = int(np.prod(item.shape, dtype=np.int64))
    if item.binary is not None:
        if dtype == np.object_:
            values = _bytes_elements(item.binary, item)
        else:
            size = elements * dtype.itemsize
            if len(item.binary) != size:
                raise BadInput(
                    f"{item.where}: {item.binary_field} {len(item.binary)} bytes; shape "
                    f"{item.shape} of {item.datatype} takes {size}"
                )
            values = np.frombuffer(item.binary, dtype.newbyteorder("<")).astype(dtype)
    elif isinstance(item.data, np.ndarray):
        values = item.data
    elif dtype == np.object_:
        values = _string_data(item)
    else:
        values = _number_data(item, dtype)
    if values.size != elements:
        raise BadInput(
            f"{item.where}: shape {item.shape} takes {elements} values; {item.data_field} has "
            f"{values.size}"
        )
    return values.reshape(item.shape)


def _bytes_elements(binary: memoryview, item: _Input) -> np.ndarray:
    """Triton's binary BYTES: each element a 4-byte little-endian length, then its bytes."""
    values, offset = [], 0
    while offset < len(binary):
        if offset + 4 > len(binary):
            raise BadInput(
                f"{item.where}: binary BYTES end inside an element's 4-byte length (at byte "
                f"{offset} of {len(binary)})"
            )
        length = int.from_bytes(binary[offset : offset + 4], "little")
        offset += 4
        if offset + length > len(binary):
            raise BadInput(
                f"{item.where}: a BYTES element of {length} bytes at byte {offset} passes the "
                f"end of its {len(binary)} bytes"
            )
        values.append(bytes(binary[offset : offset + length]))
        offset += length
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def _flatten(data: Any, item: _Input) -> list:
    if not isinstance(data, list):
        raise BadInput(
            f"{item.where}: 'data' must be an array of values, got {type(data).__name__}"
        )
    flat, stack = [], [data]
    while stack:
        value = stack.pop()
        if isinstance(value, list):
            stack.extend(reversed(value))
        else:
            flat.append(value)
    return flat


def _string_data(item: _Input) -> np.ndarray:
    flat = _flatten(item.data, item)
    array = np.empty(len(flat), dtype=object)
    for i, value in enumerate(flat):
        if not isinstance(value, str):
            raise BadInput(
                f"{item.where}: 'data' must hold strings for BYTES; element {i} is "
                f"{type(value).__name__} {str(value)[:40]!r}"
            )
        array[i] = value.encode("utf-8")
    return array


def _number_data(item: _Input, dtype: np.dtype) -> np.ndarray:
    flat = _flatten(item.data, item)
    want = "booleans" if dtype.kind == "b" else "integers" if dtype.kind in "iu" else "numbers"
    for i, value in enumerate(flat):
        ok = (
            isinstance(value, bool)
            if dtype.kind == "b"
            else not isinstance(value, bool)
            and (isinstance(value, int) or (dtype.kind == "f" and isinstance(value, float)))
        )
        if not ok:
            raise BadInput(
                f"{item.where}: 'data' must hold {want} for {item.datatype}; element {i} is "
                f"{type(value).__name__} {str(value)[:40]!r}"
            )
    try:
        return np.array(flat, dtype=dtype)
    except OverflowError as err:
        raise BadInput(f"{item.where}: a value is out of {item.datatype}'s range") from err


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


def _parse_inputs(
    value: Any, binary: memoryview, has_header_length: bool, signature: SignatureSpec | None = None
) -> list[_Input]:
    if not isinstance(value, list) or not value:
        if signature is not None and not is_image_signature(signature):
            raise BadInput(
                f"'inputs' must be a list holding the model's inputs, {_inputs_text(signature)}"
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
        _check_output(name, parameters, requested, names)
        requested[name] = _flag(parameters, "binary_data", where)
    return requested or None


def _check_output(name: str, parameters, requested, names: tuple[str, ...] = OUTPUT_KEYS) -> None:
    """An output asked for: one of the model's, once, without classification (both
    transports' rule)."""
    where = f"output '{name}'"
    if name not in names:
        raise BadInput(
            f"unknown {where}: the model's outputs are " + ", ".join(f"'{key}'" for key in names)
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
    request,
    check_count: Callable[[int], None] = lambda count: None,
    signature: SignatureSpec | None = None,
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
    generic = signature is not None and not is_image_signature(signature)
    if not request.inputs:
        if generic:
            raise BadInput(f"'inputs' must hold the model's inputs, {_inputs_text(signature)}")
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
            if generic and stray:
                raise BadInput(
                    f"{where}: its values are in contents.{stray[0]}; {tensor.datatype} "
                    f"takes contents.{field}"
                )
            if field is not None and generic:
                values = list(getattr(tensor.contents, field))
                dtype = NUMPY_OF_V2.get(tensor.datatype, np.dtype(np.object_))
                item.data = np.empty(len(values), dtype)
                item.data[:] = values
            elif field is not None:
                item.data = np.asarray(getattr(tensor.contents, field), np.float32)
        inputs.append(item)
    if generic:
        images = signature_inputs(inputs, signature, check_count)
        names = _output_names(signature)
    else:
        images = _model_input(inputs, check_count)
        names = OUTPUT_KEYS
    requested: dict[str, bool | None] = {}
    for output in request.outputs:
        _check_output(output.name, output.parameters, requested, names)
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
            response.raw_output_contents.append(_blob(array))
        elif array.dtype == np.object_:
            output.contents.bytes_contents.extend(_as_bytes(v) for v in array.ravel())
        else:
            getattr(output.contents, CONTENTS_FIELD[datatype]).extend(array.ravel().tolist())
    return response


def _as_bytes(value) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _blob(array: np.ndarray) -> bytes:
    """An output's binary form: little-endian values, or Triton's length-prefixed BYTES."""
    if array.dtype == np.object_:
        parts = []
        for value in array.ravel():
            data = _as_bytes(value)
            parts += [len(data).to_bytes(4, "little"), data]
        return b"".join(parts)
    return array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


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
            blob = _blob(array)
            output["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif array.dtype == np.object_:
            # BYTES as JSON: UTF-8 text (KServe's JSON form of strings).
            output["data"] = [_as_bytes(v).decode("utf-8", errors="replace") for v in array.ravel()]
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


def v2_signature_name(signatures) -> str | None:
    """The signature the Open Inference Protocol serves (it names none): `serving_default`,
    or the only one a model has (a pre-made Estimator's `predict`); None otherwise."""
    if SIGNATURE_NAME in signatures:
        return SIGNATURE_NAME
    if len(signatures) == 1:
        return next(iter(signatures))
    return None


def serving_signature(metadata: ModelMetadata) -> SignatureSpec:
    """The signature the Open Inference Protocol serves (v2_signature_name); NotFound when
    the model has none it could."""
    name = v2_signature_name(metadata.signatures)
    if name is None:
        raise NotFound(
            f"version {metadata.version} of {metadata.name} has no {SIGNATURE_NAME!r} signature "
            f"and several others ({sorted(metadata.signatures)}): the Open Inference Protocol "
            "serves one; use TF Serving's API, which names the signature"
        )
    return metadata.signatures[name]


def render_model_metadata(metadata: ModelMetadata, versions: list[int]) -> dict:
    """A version's serving signature as the V2 model metadata object."""
    signature = serving_signature(metadata)
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
    signature = serving_signature(metadata)
    return {
        "name": metadata.name,
        "platform": PLATFORM,
        "max_batch_size": max_batch_size,
        "input": [_config_tensor(spec) for spec in signature.inputs],
        "output": [_config_tensor(spec) for spec in signature.outputs],
    }
