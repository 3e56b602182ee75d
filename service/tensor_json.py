"""TF Serving's JSON tensors for any signature: a REST predict body's inputs, typed by the
signature, and the outputs rendered as TF Serving renders them.

The rules are TF Serving's (tensorflow_serving/util/json_tensor.cc, FillPredictRequestFromJson
and MakeJsonFromTensors): the row format (`instances`) holds one value per instance, or one
object per instance naming every input when the signature has several (or when the client
names the one); the columnar format (`inputs`) holds each input's whole tensor, or the one
input's. Values take the input's dtype: numbers for floats, integers for integer types,
true/false for bools, strings (UTF-8) or `{"b64": "..."}` for DT_STRING. Outputs: in the row
format, a bare value per instance when the signature gives one output and an object per
instance when it gives several; in the columnar format, the one tensor or an object of them.
Strings come back as UTF-8 text, or `{"b64": "..."}` for outputs whose key ends in `_bytes`.

Every error begins with TF Serving's words where it has its own, then says where in the body,
what was expected and what came. Pure numpy: nothing here imports TensorFlow.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np
import orjson

from service.errors import BadInput, check_image_count
from service.types import SignatureSpec, TensorSpec

# TF Serving writes non-finite floats as these literals (util/json_tensor.cc, WriteDecimal).
_NON_FINITE = {
    "nan": orjson.Fragment(b"NaN"),
    "inf": orjson.Fragment(b"Infinity"),
    "-inf": orjson.Fragment(b"-Infinity"),
}
_INT_RANGES = {
    kind: (int(np.iinfo(kind).min), int(np.iinfo(kind).max))
    for kind in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
}
_JSON_TYPES = {str: "String", dict: "Object", list: "Array", type(None): "Null"}


def dtype_name(dtype: np.dtype | None) -> str:
    """TensorFlow's name of an input's dtype, as its messages say it ("float", "string")."""
    if dtype is None:
        return "unknown"
    if dtype == np.object_:
        return "string"
    if dtype == np.float32:
        return "float"
    if dtype == np.float64:
        return "double"
    if dtype == np.float16:
        return "half"
    return dtype.name


def _text(value: Any) -> str:
    try:
        text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS, default=str).decode()
    except orjson.JSONEncodeError:  # nested past orjson's depth
        text = "..."
    return text if len(text) <= 40 else text[:40] + "..."


def type_error(value: Any, dtype: np.dtype | None) -> str:
    """TF Serving's words for a JSON value of the wrong type (json_tensor.cc, TypeError)."""
    if isinstance(value, bool):
        kind = "True" if value else "False"
    else:
        kind = _JSON_TYPES.get(type(value), "Number")
    return f"JSON Value: {_text(value)} Type: {kind} is not of expected type: {dtype_name(dtype)}"


def _shape_text(shape) -> str:
    return f"[{','.join(str(d) for d in shape)}]"


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


# --- reading --------------------------------------------------------------------------------


class _ValueError(Exception):
    """A value that does not fit its input: TF Serving's words, and where it is below."""

    def __init__(self, words: str, path: str = ""):
        super().__init__(words)
        self.words = words
        self.path = path


def _leaf(value: Any, dtype: np.dtype, path: str) -> Any:
    """One JSON value as an element of the input's dtype."""
    kind = dtype.kind
    if kind == "O":
        if isinstance(value, str):
            return value.encode("utf-8")
        if _is_b64(value):
            if not isinstance(value["b64"], str):
                raise _ValueError(type_error(value["b64"], dtype), path + ".b64")
            try:
                return base64.b64decode(value["b64"], validate=True)
            except (binascii.Error, ValueError) as err:
                raise _ValueError(f"Unable to base64 decode ({err})", path + ".b64") from err
        raise _ValueError(type_error(value, dtype), path)
    if kind == "b":
        if isinstance(value, bool):
            return value
        raise _ValueError(type_error(value, dtype), path)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _ValueError(type_error(value, dtype), path)
    if kind in "iu":
        low, high = _INT_RANGES[dtype.type]
        if not isinstance(value, int) or not low <= value <= high:
            raise _ValueError(type_error(value, dtype), path)
    return value


def _tensor(value: Any, spec: TensorSpec, where: str) -> np.ndarray:
    """One input's JSON value (nested lists of scalars) as a numpy array of its dtype.

    Raises:
        _ValueError: a value of the wrong type, or lists of unequal lengths.
    """
    dtype = spec.dtype
    if dtype is None:
        raise _ValueError(f"input '{spec.name}' has a type no request can send", "")
    if dtype.kind in "fiu" and not isinstance(value, (str, dict)) and not _may_hold_bools(value):
        # The usual case, numbers: numpy reads them at once; only a refusal is walked.
        try:
            array = np.array(value)
        except (ValueError, TypeError, OverflowError, RecursionError):
            array = None
        if array is not None and array.dtype.kind in ("iu" if dtype.kind in "iu" else "iuf"):
            return _cast(array, dtype, value)
    shape: list[int] = []
    probe = value
    while isinstance(probe, list):
        shape.append(len(probe))
        probe = probe[0] if probe else None
    flat: list[Any] = []
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, list):
            if depth >= len(shape) or len(item) != shape[depth]:
                raise _ValueError(_ragged(value, shape), path)
            stack.extend((item[k], depth + 1, f"{path}[{k}]") for k in range(len(item) - 1, -1, -1))
        else:
            if depth != len(shape):
                raise _ValueError(_ragged(value, shape), path)
            flat.append(_leaf(item, dtype, path))
    array = np.empty(len(flat), dtype=dtype)
    array[:] = flat
    return array.reshape(shape)


def _may_hold_bools(value: Any) -> bool:
    """Whether a value may hold true/false, which numpy would read as 1 and 0: numbers as
    orjson writes them have no "t" or "f" (NaN and Inf become null, refused anyway)."""
    if isinstance(value, bool):
        return True
    if not isinstance(value, list):
        return False
    try:
        text = orjson.dumps(value)
    except (orjson.JSONEncodeError, TypeError):
        return True
    return b"t" in text or b"f" in text


def _cast(array: np.ndarray, dtype: np.dtype, value: Any) -> np.ndarray:
    """numpy's reading of a list of numbers as the input's dtype, range-checked."""
    if dtype.kind in "iu":
        low, high = _INT_RANGES[dtype.type]
        if array.size and (array.min() < low or array.max() > high):
            bad = np.flatnonzero((array.ravel() < low) | (array.ravel() > high))[0]
            index = np.unravel_index(bad, array.shape)
            path = "".join(f"[{i}]" for i in index)
            raise _ValueError(type_error(int(array[index]), dtype), path)
        return array.astype(dtype)
    with np.errstate(over="ignore"):
        return array.astype(dtype)


def _ragged(value: Any, shape: list[int]) -> str:
    return f"lists of unequal lengths (the first at each level give the shape {_shape_text(shape)})"


def _check_shape(array: np.ndarray, spec: TensorSpec, where: str) -> None:
    if spec.shape is None:
        return
    fits = len(spec.shape) == array.ndim and all(
        want in (-1, got) for want, got in zip(spec.shape, array.shape, strict=True)
    )
    if not fits:
        raise BadInput(
            f"{where}: input '{spec.name}' takes {dtype_name(spec.dtype)} "
            f"{_shape_text(spec.shape)}; got shape {_shape_text(array.shape)}"
        )


def read_inputs(
    request: dict, signature: SignatureSpec, max_instances: int, strict: bool = False
) -> tuple[dict[str, np.ndarray], bool]:
    """A TF Serving REST predict body's tensors, typed by the signature.

    Args:
        request: the parsed JSON body (an object).
        signature: what the named signature takes.
        max_instances: most instances a request may hold (MAX_IMAGES).
        strict: STRICT_NUMBERS: refuse float values that are not finite in their dtype.
    Returns:
        (each input by name, whether the body was in the columnar format).
    Raises:
        BadInput: what TF Serving refuses (its words first), or a shape the signature does
            not take.
        PayloadTooLarge: more than max_instances instances.
    """
    has_instances, has_inputs = "instances" in request, "inputs" in request
    if has_instances and has_inputs:
        raise BadInput(
            "Not formatted correctly expecting only one of 'inputs' or 'instances' keys to "
            "exist; the request body must have exactly one of 'instances' (row format) or "
            "'inputs' (columnar format), and it has both"
        )
    if not has_instances and not has_inputs:
        raise BadInput(
            "Missing 'inputs' or 'instances' key; the request body must have exactly one of "
            "'instances' (row format) or 'inputs' (columnar format), and it has neither"
        )
    specs = {spec.name: spec for spec in signature.inputs}
    if has_instances:
        inputs = _rows(request["instances"], specs, max_instances)
    else:
        inputs = _columns(request["inputs"], specs, max_instances)
    if strict:
        for name, array in inputs.items():
            if array.dtype.kind == "f" and array.size and not np.isfinite(array).all():
                index = np.unravel_index(np.flatnonzero(~np.isfinite(array))[0], array.shape)
                raise BadInput(
                    f"input '{name}'{''.join(f'[{i}]' for i in index)}: values must be finite "
                    "numbers (NaN/Inf or too large, STRICT_NUMBERS)"
                )
    return inputs, not has_instances


def _rows(instances: Any, specs: dict[str, TensorSpec], max_instances: int) -> dict:
    if not isinstance(instances, list):
        raise BadInput(
            f"Expecting 'instances' to be an list/array; instances: expected a list with one "
            f"value per instance, got {_text(instances)}"
        )
    if not instances:
        raise BadInput("No values in 'instances' array; instances: send at least one instance")
    check_image_count(len(instances), max_instances)
    names = sorted(specs)
    first = instances[0]
    named = len(names) != 1 or (isinstance(first, dict) and not _is_b64(first))
    columns: dict[str, list] = {name: [] for name in names}
    for i, item in enumerate(instances):
        if not named:
            columns[names[0]].append(item)
            continue
        if not isinstance(item, dict) or _is_b64(item):
            raise BadInput(
                f"Expecting object but got list at item {i} of input list; instances[{i}]: "
                f"expected an object naming the inputs {names}, got {_text(item)}"
            )
        unknown = sorted(set(item) - set(names))
        if unknown:
            raise BadInput(
                f"Failed to process element: {i} key: {unknown[0]} of 'instances' list. "
                f"Error: INVALID_ARGUMENT: JSON object: does not have named input: "
                f"{unknown[0]}; instances[{i}]: the signature's inputs are {names}"
            )
        missing = [name for name in names if name not in item]
        if missing:
            raise BadInput(
                f"Failed to process element: {i} of 'instances' list. JSON object: "
                f"{_text(item)} keys must be equal to: {','.join(names)}; instances[{i}]: "
                f"missing {missing}"
            )
        for name in names:
            columns[name].append(item[name])
    inputs = {}
    for name in names:
        spec = specs[name]
        parts = []
        for i, value in enumerate(columns[name]):
            at = f"instances[{i}]" + (f".{name}" if named else "")
            element = (
                f"Failed to process element: {i} of 'instances' list. Error: INVALID_ARGUMENT: "
            )
            try:
                part = _tensor(value, spec, at)
            except _ValueError as err:
                raise BadInput(f"{element}{err.words}; {at}{err.path}") from err
            if parts and part.shape != parts[0].shape:
                size, want = part.size, parts[0].size
                words = (
                    f"Expecting tensor size: {want} but got: {size}"
                    if size != want
                    else f"Expecting shape {_shape_text(parts[0].shape)} but got: "
                    f"{_shape_text(part.shape)}"
                )
                raise BadInput(
                    f"{element}{words}; {at}: every instance's '{name}' must have the same "
                    "shape (ragged instances)"
                )
            parts.append(part)
        array = np.stack(parts)
        _check_shape(array, spec, "instances")
        inputs[name] = array
    return inputs


def _columns(value: Any, specs: dict[str, TensorSpec], max_instances: int) -> dict:
    names = sorted(specs)
    if isinstance(value, dict) and not _is_b64(value):
        named = value
        for name in names:
            if name not in named:
                raise BadInput(
                    f"Missing named input: {name} in 'inputs' object.; the signature takes "
                    f"{names}, the body has {sorted(named)[:8]}"
                )
    elif len(names) == 1:
        named = {names[0]: value}
    else:
        raise BadInput(
            f"inputs: the signature takes several inputs {names}; send an object naming "
            f"each, got {_text(value)}"
        )
    inputs = {}
    for name in names:
        spec = specs[name]
        where = f"inputs.{name}" if isinstance(value, dict) else "inputs"
        try:
            array = _tensor(named[name], spec, where)
        except _ValueError as err:
            raise BadInput(f"{err.words}; {where}{err.path}") from err
        if array.ndim and spec.shape and spec.shape[0] == -1:
            check_image_count(len(array), max_instances)
        _check_shape(array, spec, where)
        inputs[name] = array
    rows = {
        len(a) for n, a in inputs.items() if a.ndim and specs[n].shape and specs[n].shape[0] == -1
    }
    if len(rows) > 1:
        raise BadInput(
            f"inputs: the inputs' batch sizes differ ({sorted(rows)}); each must hold as many "
            "instances"
        )
    return inputs


# --- rendering ------------------------------------------------------------------------------


def _jsonable(array: np.ndarray, key: str) -> Any:
    """An output as orjson writes it the way TF Serving does: numbers as they are (NaN and
    Inf as TF Serving's literals), strings as UTF-8 text or, for keys ending in `_bytes`,
    {"b64": ...} objects."""
    if array.dtype == np.object_ or array.dtype.kind == "S":
        b64 = key.endswith("_bytes")

        def text(item):
            if isinstance(item, list):
                return [text(i) for i in item]
            data = item if isinstance(item, bytes) else str(item).encode()
            if b64:
                return {"b64": base64.b64encode(data).decode("ascii")}
            return data.decode("utf-8", errors="replace")

        return text(array.tolist())
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        holder = np.empty(array.size, dtype=object)
        holder[:] = [v if np.isfinite(v) else _NON_FINITE[str(float(v))] for v in array.ravel()]
        return holder.reshape(array.shape).tolist()
    if array.dtype.kind == "c":
        raise BadInput(f"output '{key}' is complex: JSON cannot hold it")
    # orjson writes numpy scalars, not 0-d arrays.
    return array[()] if array.ndim == 0 else array


def render_outputs(outputs: dict[str, np.ndarray], columnar: bool) -> tuple[str, Any]:
    """The answer's key and value, as TF Serving renders a signature's outputs.

    Raises:
        BadInput: in the row format, an output without a batch dimension or with another
            batch size than the first (TF Serving's words).
    """
    keys = sorted(outputs)
    if columnar:
        if len(keys) == 1:
            return "outputs", _jsonable(outputs[keys[0]], keys[0])
        return "outputs", {key: _jsonable(outputs[key], key) for key in keys}
    batch = None
    for key in keys:
        value = outputs[key]
        if value.ndim == 0:
            raise BadInput(f"Tensor name: {key} has no shape information ")
        if batch is None:
            batch = len(value)
        elif len(value) != batch:
            raise BadInput(
                f"Tensor name: {key} has inconsistent batch size: {len(value)} expecting: {batch}"
            )
    rendered = {key: _jsonable(outputs[key], key) for key in keys}
    if len(keys) == 1:
        return "predictions", rendered[keys[0]]
    rows = [dict(zip(keys, row, strict=True)) for row in zip(*rendered.values(), strict=True)]
    return "predictions", rows
