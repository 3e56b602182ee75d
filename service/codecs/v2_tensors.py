"""The Open Inference Protocol's tensors (KServe's V2), by the rules both transports share
(service/codecs/v2_rest.py over HTTP, v2_grpc.py over gRPC): a request's inputs checked against
the signature (names, datatypes, shapes, the values' count) and read as numpy, the outputs
asked for, and the binary form of an output.

The image contract's signature (one input, `image` FP32 [-1, 28, 28]) is read by its own
rules and words (`model_input`), as the model's one array. Pure numpy: nothing here imports
TensorFlow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from artifact.contract import IMAGE_SHAPE, INPUT_KEY, OUTPUT_KEYS
from service.codecs.dtypes import V2_DATATYPES, v2_datatype
from service.codecs.pixels import as_model_input
from service.codecs.signatures import IMAGE_BATCH_SHAPE, IMAGE_ELEMENTS
from service.codecs.values import is_integer, is_number, python_text
from service.errors import BadInput
from service.types import Inputs, SignatureSpec

INPUT_DATATYPE = "FP32"
INPUT_TEXT = f"'{INPUT_KEY}' ({INPUT_DATATYPE} {IMAGE_BATCH_SHAPE})"
IMAGE_BYTES = IMAGE_ELEMENTS * 4


@dataclasses.dataclass(frozen=True)
class InferRequest:
    """A parsed inference request.

    Attributes:
        id: the client's id, echoed back.
        inputs: each input by name; the image contract's one array, float32 [n, 28, 28].
        outputs: the outputs asked for, in order, each with its `binary_data` (None: not
            said); None when the request names none (then every output is sent).
        binary_output: how outputs that do not say are sent (`binary_data_output`).
    """

    id: str | None
    inputs: Inputs
    outputs: dict[str, bool | None] | None
    binary_output: bool


@dataclasses.dataclass
class WireInput:
    """One input as the request sends it, before it is checked: its values as JSON `data`,
    gRPC's typed contents (`data`, an array) or binary bytes."""

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


def output_names(signature: SignatureSpec) -> tuple[str, ...]:
    return tuple(spec.name for spec in signature.outputs)


def inputs_text(signature: SignatureSpec) -> str:
    return ", ".join(
        f"'{spec.name}' ({_datatype_or_none(spec.dtype)} "
        f"{list(spec.shape) if spec.shape is not None else [-1]})"
        for spec in signature.inputs
    )


# What the model's inputs list (in messages) for a dtype no datatype names.
UNSUPPORTED = "unsupported"


def _datatype_or_none(dtype: np.dtype | None) -> str:
    try:
        return v2_datatype(dtype)
    except ValueError:
        return UNSUPPORTED


def signature_inputs(
    inputs: list[WireInput], signature: SignatureSpec, check_count: Callable[[int], None]
) -> dict[str, np.ndarray]:
    """Every input of any signature, checked by the rules both transports share: each
    named once and none missing, the signature's datatype, a shape it takes, the values'
    count (and, for BYTES sent binary, Triton's length-prefixed elements)."""
    specs = {spec.name: spec for spec in signature.inputs}
    seen: set[str] = set()
    for item in inputs:
        if item.name not in specs:
            raise BadInput(f"unknown input '{item.name}': the model takes {inputs_text(signature)}")
        if item.name in seen:
            raise BadInput(f"input '{item.name}' is given more than once; send it once")
        seen.add(item.name)
    missing = [name for name in specs if name not in seen]
    if missing:
        raise BadInput(f"input '{missing[0]}' is missing: the model takes {inputs_text(signature)}")
    tensors = {}
    counted = False
    for item in inputs:
        spec = specs[item.name]
        datatype = _datatype_or_none(spec.dtype)
        if spec.dtype is None or datatype == UNSUPPORTED:
            raise BadInput(
                f"{item.where}: the model takes it as {spec.dtype or 'a TensorFlow type'}, "
                "which no Open Inference Protocol datatype holds"
            )
        _check_datatype(item, datatype)
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


def _check_datatype(item: WireInput, datatype: str) -> None:
    """The datatype an input is sent as must be the model's."""
    if item.datatype == datatype:
        return
    if item.datatype not in V2_DATATYPES:
        raise BadInput(
            f"{item.where}: unknown datatype {item.datatype!r:.40}; the model takes "
            f"{datatype} (datatypes: {', '.join(sorted(V2_DATATYPES))})"
        )
    raise BadInput(f"{item.where}: datatype {item.datatype} does not match the model's {datatype}")


def _typed_tensor(item: WireInput, dtype: np.dtype) -> np.ndarray:
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
    return _shaped(values, item, elements)


def _shaped(values: np.ndarray, item: WireInput, elements: int) -> np.ndarray:
    """An input's values in its declared shape, when they are as many as it takes."""
    if values.size != elements:
        raise BadInput(
            f"{item.where}: shape {item.shape} takes {elements} values; {item.data_field} has "
            f"{values.size}"
        )
    return values.reshape(item.shape)


def _bytes_elements(binary: memoryview, item: WireInput) -> np.ndarray:
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


def _flatten(data: Any, item: WireInput) -> list:
    if not isinstance(data, list):
        raise BadInput(
            f"{item.where}: 'data' must be an array of values, got {type(data).__name__}"
        )
    flat: list = []
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, list):
            stack.extend(reversed(value))
        else:
            flat.append(value)
    return flat


def _string_data(item: WireInput) -> np.ndarray:
    flat = _flatten(item.data, item)
    array = np.empty(len(flat), dtype=object)
    for i, value in enumerate(flat):
        if not isinstance(value, str):
            raise BadInput(
                f"{item.where}: 'data' must hold strings for BYTES; element {i} is "
                f"{python_text(value)}"
            )
        array[i] = value.encode("utf-8")
    return array


def _number_data(item: WireInput, dtype: np.dtype) -> np.ndarray:
    flat = _flatten(item.data, item)
    want = "booleans" if dtype.kind == "b" else "integers" if dtype.kind in "iu" else "numbers"
    fits = (
        (lambda value: isinstance(value, bool))
        if dtype.kind == "b"
        else is_integer
        if dtype.kind in "iu"
        else is_number
    )
    for i, value in enumerate(flat):
        if not fits(value):
            raise BadInput(
                f"{item.where}: 'data' must hold {want} for {item.datatype}; element {i} is "
                f"{python_text(value)}"
            )
    try:
        return np.array(flat, dtype=dtype)
    except OverflowError as err:
        raise BadInput(f"{item.where}: a value is out of {item.datatype}'s range") from err


def model_input(inputs: list[WireInput], check_count: Callable[[int], None]) -> np.ndarray:
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
    return as_model_input(images, image.where)


def _check_inputs(inputs: list[WireInput]) -> list[WireInput]:
    names = [item.name for item in inputs]
    for item in inputs:
        if item.name != INPUT_KEY:
            raise BadInput(f"unknown input '{item.name}': the model takes one input, {INPUT_TEXT}")
    if len(names) > 1:
        raise BadInput(f"input '{INPUT_KEY}' is given {len(names)} times; send it once")
    (image,) = inputs
    _check_datatype(image, INPUT_DATATYPE)
    if len(image.shape) != 3 or tuple(image.shape[1:]) != IMAGE_SHAPE:
        raise BadInput(
            f"{image.where}: shape {image.shape} does not match the model's {IMAGE_BATCH_SHAPE}"
        )
    if image.shape[0] == 0:
        raise BadInput(f"{image.where} has no images (shape {image.shape}); send at least one")
    return inputs


def _regular_array(data: list) -> np.ndarray | None:
    """Nested lists as an array; None when they are ragged or hold other than numbers."""
    try:
        values = np.array(data)
    except (ValueError, TypeError, OverflowError):
        return None
    return None if values.dtype == np.object_ else values


def _json_tensor(item: WireInput) -> np.ndarray:
    """A tensor's `data` (flat or nested, row-major; or gRPC's typed contents, already an
    array) as numbers of the declared shape."""
    if isinstance(item.data, np.ndarray):
        values = item.data
    else:
        if not isinstance(item.data, list):
            raise BadInput(
                f"{item.where}: 'data' must be an array of numbers, got {type(item.data).__name__}"
            )
        regular = _regular_array(item.data)
        if regular is None:
            raise BadInput(
                f"{item.where}: 'data' must be a regular array of numbers (ragged lists?)"
            )
        values = regular
    if values.dtype.kind not in "iuf":
        kind = {"b": "booleans", "U": "strings"}.get(values.dtype.kind, f"{values.dtype}")
        raise BadInput(f"{item.where}: 'data' must hold numbers for {item.datatype}, got {kind}")
    elements = int(np.prod(item.shape))
    return _shaped(values, item, elements)


def check_output(name: str, parameters, requested, names: tuple[str, ...] = OUTPUT_KEYS) -> None:
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


def as_bytes(value) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def blob(array: np.ndarray) -> bytes:
    """An output's binary form: little-endian values, or Triton's length-prefixed BYTES."""
    if array.dtype == np.object_:
        parts = []
        for value in array.ravel():
            data = as_bytes(value)
            parts += [len(data).to_bytes(4, "little"), data]
        return b"".join(parts)
    return array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
