"""TF Serving's REST JSON (g3doc/api_rest.md): a `:predict` body's tensors for any signature,
typed by it, and the outputs rendered as TF Serving renders them.

The rules are TF Serving's (tensorflow_serving/util/json_tensor.cc, FillPredictRequestFromJson
and MakeJsonFromTensors): the row format (`instances`) holds one value per instance, or one
object per instance naming every input when the signature has several (or when the client
names the one); the columnar format (`inputs`) holds each input's whole tensor, or the one
input's. Values take the input's dtype: numbers for floats, integers for integer types,
true/false for bools, strings (UTF-8) or `{"b64": "..."}` for DT_STRING. Outputs: in the row
format, a bare value per instance when the signature gives one output and an object per
instance when it gives several; in the columnar format, the one tensor or an object of them.
Strings come back as UTF-8 text, or `{"b64": "..."}` for outputs whose key ends in `_bytes`.

A body is read in TF Serving's order: its JSON and `signature_name` first
(`read_predict_request`), then, once the caller has found the model, version, label and
signature, its tensors (`PredictRequest.inputs`). The image contract's signature (`image`
float32 [-1, 28, 28]) is read by its own rules and words, and its usual body,
`{"instances": [n 28x28 arrays of numbers]}`, by simdjson straight into numpy while the JSON
is first read (service/codecs/pixels.py): about 10 us for one image where orjson's Python
lists and numpy's conversion of them take 35.

Every error begins with TF Serving's words where it has its own, then says where in the body,
what was expected and what came. Pure numpy: nothing here imports TensorFlow.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson

from artifact.contract import IMAGE_HEIGHT, IMAGE_SHAPE, IMAGE_WIDTH, INPUT_KEY, SIGNATURE_NAME
from service.codecs import json_body, pixels
from service.codecs.dtypes import INT_RANGES, dtype_name
from service.codecs.signatures import is_image_signature
from service.codecs.values import (
    Misfit,
    element,
    is_b64,
    json_text,
    may_hold_booleans,
    python_text,
    shape_text,
    tf_words,
    type_error,
)
from service.errors import BadInput, check_image_count
from service.types import Inputs, SignatureSpec, TensorSpec

# TF Serving writes non-finite floats as these literals (util/json_tensor.cc, WriteDecimal).
_NON_FINITE = {
    "nan": orjson.Fragment(b"NaN"),
    "inf": orjson.Fragment(b"Infinity"),
    "-inf": orjson.Fragment(b"-Infinity"),
}


# --- the body: its JSON and signature name, then its tensors ------------------------------


class PredictRequest:
    """A `:predict` body whose JSON and `signature_name` have been read (read_predict_request).

    Attributes:
        signature_name: the signature asked for (the default one when empty or absent).
    """

    __slots__ = ("signature_name", "_body", "_strict", "_request", "_rows")

    def __init__(self, signature_name, body, strict, request, rows):
        self.signature_name: str = signature_name
        self._body = body
        self._strict = strict
        self._request: dict | None = request
        # The usual image body's numbers, read by simdjson (its JSON values never made).
        self._rows: np.ndarray | None = rows

    @property
    def columnar(self) -> bool:
        """The columnar format (`inputs`), answered as `outputs`."""
        return self._request is not None and "instances" not in self._request

    def json(self) -> dict:
        """The body's JSON object (parsed now when simdjson read the usual image body)."""
        if self._request is None:
            self._request = json_body.loads(self._body, non_finite=not self._strict)
        return self._request

    def inputs(self, signature: SignatureSpec, max_instances: int) -> Inputs:
        """The body's tensors, typed by the signature: each input by name, or the image
        contract's one array, float32 [n, 28, 28] (counted before any array is built).

        Raises:
            BadInput: what TF Serving refuses (its words first), or a shape the signature
                does not take.
            PayloadTooLarge: more than max_instances instances.
        """
        if not is_image_signature(signature):
            return read_inputs(self.json(), signature, max_instances, self._strict)[0]
        if self._rows is None:
            return _image_tensors(self.json(), self._body, max_instances, self._strict)
        if self._rows.dtype == np.float32:  # proven finite and in range by _usual_rows
            return self._rows
        return pixels.as_model_input(self._rows, "instances", self._strict)


def read_predict_request(body: bytes, max_instances: int, strict: bool = True) -> PredictRequest:
    """A TF Serving REST predict (or classify, regress) body's JSON and signature name; its
    tensors are read by PredictRequest.inputs once the signature is known.

    Args:
        max_instances: most instances a request may hold (MAX_IMAGES): a usual image body
            of more is left for the general path, which counts it and says so.
        strict: STRICT_NUMBERS: refuse values that are not finite in float32; otherwise NaN,
            Infinity and -Infinity literals are read and values past float32's range become
            inf, as TF Serving reads them.
    Raises:
        BadInput: not JSON, not an object, `signature_name` not a string (TF Serving's words
            first, then where and what).
    """
    rows = _usual_rows(body, max_instances)
    if rows is not None:
        signature_name, images = rows
        return PredictRequest(signature_name, body, strict, None, images)
    request = json_body.loads(body, non_finite=not strict)
    if not isinstance(request, dict):
        raise BadInput(
            f"JSON Value: {python_text(request)} Is not object; Request body must be a JSON "
            f"object, got {type(request).__name__}"
        )
    signature_name = request.get("signature_name", SIGNATURE_NAME)
    if not isinstance(signature_name, str):
        raise BadInput(
            "'signature_name' key must be a string value; it is " + python_text(signature_name)
        )
    # TF Serving reads an empty name as the default signature.
    return PredictRequest(signature_name or SIGNATURE_NAME, body, strict, request, None)


def _row_format(request: dict) -> bool:
    """Whether a body is in the row format (`instances`), not the columnar (`inputs`).

    Raises:
        BadInput: it has both, or neither (TF Serving's words).
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
    return has_instances


# --- the image contract's input -------------------------------------------------------------


def _usual_rows(body: bytes, max_images: int) -> tuple[str, np.ndarray] | None:
    """The row format's usual body read by simdjson straight into numpy. The images are
    float32, ready for the model, when every value is below 2**53 in magnitude; otherwise
    the numbers as numpy reads them, for as_model_input. None for anything else (see
    pixels.image_rows), booleans and strings included."""
    view = pixels.image_rows(body, max_images, "signature_name")
    if view is None:
        return None
    instances, signature_name = view
    elements = len(instances) * IMAGE_HEIGHT * IMAGE_WIDTH
    flat = json_body.buffer(instances, "d", np.float64)
    if flat is not None and flat.size == elements:
        if np.abs(flat).max() < 2.0**53:
            # Every integer below 2**53 is exact in float64, so the model gets the float32
            # numpy's int64 would give; and every value is finite and inside float32's
            # range, so this cast is what as_model_input's checks would end in, strict or not.
            return signature_name or SIGNATURE_NAME, flat.astype(np.float32).reshape(
                -1, *IMAGE_SHAPE
            )
        # Integers this large reach float32 by another rounding than numpy's int64 would
        # take: read them as numpy reads them.
        flat = json_body.numbers(instances)
    if flat is None or flat.size != elements:
        return None
    return signature_name or SIGNATURE_NAME, flat.reshape(-1, *IMAGE_SHAPE)


def _image_tensors(request: dict, body: bytes, max_images: int, strict: bool) -> np.ndarray:
    """The image contract's input from any body the fast path did not take: its rows (bare,
    or named `{"image": ...}`) or columns, counted before any array is built."""
    where = "instances" if _row_format(request) else "inputs"
    images = request[where]
    if where == "instances":
        if isinstance(images, list) and images and isinstance(images[0], dict):
            images = [_named_input(item, i) for i, item in enumerate(images)]
    elif isinstance(images, dict):
        if INPUT_KEY not in images:
            raise BadInput(
                f"Missing named input: {INPUT_KEY} in 'inputs' object.; it has {sorted(images)[:8]}"
            )
        # TF Serving looks up only the signature's inputs: other keys are not read.
        images = images[INPUT_KEY]
    # Counted before any array is built. A list whose first item is a list of numbers is a
    # shape mistake (one image sent without its outer list), said as such by to_array.
    first = images[0] if isinstance(images, list) and images else None
    if isinstance(first, list) and (not first or isinstance(first[0], list)):
        check_image_count(len(images), max_images)
    if may_hold_booleans(body):
        pixels.refuse_booleans(images, where, tf_words=True)
    return pixels.as_model_input(pixels.to_array(images, where, tf_words=True), where, strict)


def _named_input(item: Any, index: int) -> Any:
    """An instance of the row format's named form, {"image": tensor}: TF Serving's words for
    a key the signature does not have, or a missing one."""
    if not isinstance(item, dict):
        raise BadInput(
            f"Expecting object but got list at item {index} of input list; instances[{index}]: "
            f"expected an object with the one input '{INPUT_KEY}', got {pixels.shape_of(item)}"
        )
    if set(item) != {INPUT_KEY}:
        got = sorted(item)
        unknown = [key for key in got if key != INPUT_KEY]
        words = (
            f"Failed to process element: {index} key: {unknown[0]} of 'instances' list. "
            f"Error: INVALID_ARGUMENT: JSON object: does not have named input: {unknown[0]}"
            if unknown
            else f"Failed to process element: {index} of 'instances' list. JSON object: {{}} "
            f"keys must be equal to: {INPUT_KEY}"
        )
        raise BadInput(
            f"{words}; instances[{index}]: expected an object with the one input "
            f"'{INPUT_KEY}', got {got[:8]}"
        )
    return item[INPUT_KEY]


# --- any signature's inputs -----------------------------------------------------------------


class _ValueError(Exception):
    """A value that does not fit its input: TF Serving's words, and where it is below."""

    def __init__(self, words: str, path: str = ""):
        super().__init__(words)
        self.words = words
        self.path = path


def read_inputs(
    request: dict, signature: SignatureSpec, max_instances: int, strict: bool = False
) -> tuple[dict[str, np.ndarray], bool]:
    """A TF Serving REST predict body's tensors, typed by the signature, by the rules for
    any signature (the image contract's too).

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
    rows = _row_format(request)
    specs = {spec.name: spec for spec in signature.inputs}
    if rows:
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
    return inputs, not rows


def _tensor(value: Any, spec: TensorSpec) -> np.ndarray:
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
            return _cast(array, dtype)
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
                raise _ValueError(_ragged(shape), path)
            stack.extend((item[k], depth + 1, f"{path}[{k}]") for k in range(len(item) - 1, -1, -1))
        else:
            if depth != len(shape):
                raise _ValueError(_ragged(shape), path)
            try:
                flat.append(element(item, dtype))
            except Misfit as misfit:
                raise _ValueError(tf_words(misfit, dtype), path + misfit.suffix) from misfit
    array = np.empty(len(flat), dtype=dtype)
    array[:] = flat
    return array.reshape(shape)


def _may_hold_bools(value: Any) -> bool:
    """Whether a value may hold true/false, which numpy would read as 1 and 0 (values'
    may_hold_booleans over its JSON text)."""
    if not isinstance(value, list):
        return isinstance(value, bool)
    try:
        return may_hold_booleans(orjson.dumps(value))
    except (orjson.JSONEncodeError, TypeError):
        return True


def _cast(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """numpy's reading of a list of numbers as the input's dtype, range-checked."""
    if dtype.kind in "iu":
        low, high = INT_RANGES[dtype.type]
        if array.size and (array.min() < low or array.max() > high):
            bad = np.flatnonzero((array.ravel() < low) | (array.ravel() > high))[0]
            index = np.unravel_index(bad, array.shape)
            path = "".join(f"[{i}]" for i in index)
            raise _ValueError(type_error(int(array[index]), dtype), path)
        return array.astype(dtype)
    with np.errstate(over="ignore"):
        return array.astype(dtype)


def _ragged(shape: list[int]) -> str:
    return f"lists of unequal lengths (the first at each level give the shape {shape_text(shape)})"


def _check_shape(array: np.ndarray, spec: TensorSpec, where: str) -> None:
    if spec.shape is None:
        return
    fits = len(spec.shape) == array.ndim and all(
        want in (-1, got) for want, got in zip(spec.shape, array.shape, strict=True)
    )
    if not fits:
        raise BadInput(
            f"{where}: input '{spec.name}' takes {dtype_name(spec.dtype)} "
            f"{shape_text(spec.shape)}; got shape {shape_text(array.shape)}"
        )


# Integers numpy turns into float32 by the same rounding whichever way they go: float64 holds
# every integer below 2**53 exactly.
_EXACT_INT = 2**53


def _scalar_column(values: list, dtype: np.dtype | None) -> np.ndarray | None:
    """One input's values, one plain scalar per instance, as its array in one conversion: the
    fast path of tabular rows. None when any value is not a plain scalar of the input's kind
    (a bool among numbers, a float for an integer, an integer out of range, a list, b64...),
    or the input's dtype is unknown: the general path reads those, one by one, and says what
    is wrong."""
    if dtype is None:
        return None
    kind = dtype.kind
    if kind == "f":
        for value in values:
            kind_of = type(value)
            if kind_of is not float and (
                kind_of is not int or not -_EXACT_INT < value < _EXACT_INT
            ):
                return None
        with np.errstate(over="ignore"):  # past float32's range: inf, as _cast casts
            return np.array(values, dtype=np.float64).astype(dtype)
    if kind in "iu":
        if any(type(value) is not int for value in values):
            return None
        low, high = INT_RANGES[dtype.type]
        if min(values) < low or max(values) > high:
            return None
        return np.array(values, dtype=dtype)
    if kind == "O":
        if any(type(value) is not str for value in values):
            return None
        column = np.empty(len(values), dtype=object)
        column[:] = [value.encode("utf-8") for value in values]
        return column
    if kind == "b" and all(type(value) is bool for value in values):
        return np.array(values, dtype=dtype)
    return None


def _scalar_rows(instances: list, specs: dict[str, TensorSpec], names: list[str]):
    """Instances of one plain scalar per input (`{"x1": 0.5, "rooms": 3, "color": "red"}`, or
    bare scalars for a signature of one input of shape [-1]) read straight into one column per
    input; None for anything else (the general path, _rows, reads it)."""
    if any(specs[name].shape != (-1,) or specs[name].dtype is None for name in names):
        return None
    if len(names) == 1 and type(instances[0]) is not dict:
        columns = {names[0]: instances}
    else:
        columns = {name: [] for name in names}
        lists = [columns[name] for name in names]
        width = len(names)
        for item in instances:
            if type(item) is not dict or len(item) != width:
                return None
            try:
                for name, column in zip(names, lists, strict=True):
                    column.append(item[name])
            except KeyError:
                return None
    inputs = {}
    for name in names:
        array = _scalar_column(columns[name], specs[name].dtype)
        if array is None:
            return None
        inputs[name] = array
    return inputs


def _rows(instances: Any, specs: dict[str, TensorSpec], max_instances: int) -> dict:
    if isinstance(instances, list) and 0 < len(instances) <= max_instances:
        fast = _scalar_rows(instances, specs, sorted(specs))
        if fast is not None:
            return fast
    if not isinstance(instances, list):
        raise BadInput(
            f"Expecting 'instances' to be an list/array; instances: expected a list with one "
            f"value per instance, got {json_text(instances)}"
        )
    if not instances:
        raise BadInput("No values in 'instances' array; instances: send at least one instance")
    check_image_count(len(instances), max_instances)
    names = sorted(specs)
    first = instances[0]
    named = len(names) != 1 or (isinstance(first, dict) and not is_b64(first))
    columns: dict[str, list] = {name: [] for name in names}
    for i, item in enumerate(instances):
        if not named:
            columns[names[0]].append(item)
            continue
        if not isinstance(item, dict) or is_b64(item):
            raise BadInput(
                f"Expecting object but got list at item {i} of input list; instances[{i}]: "
                f"expected an object naming the inputs {names}, got {json_text(item)}"
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
                f"{json_text(item)} keys must be equal to: {','.join(names)}; instances[{i}]: "
                f"missing {missing}"
            )
        for name in names:
            columns[name].append(item[name])
    inputs = {}
    for name in names:
        spec = specs[name]
        parts: list[np.ndarray] = []
        for i, value in enumerate(columns[name]):
            at = f"instances[{i}]" + (f".{name}" if named else "")
            element_words = (
                f"Failed to process element: {i} of 'instances' list. Error: INVALID_ARGUMENT: "
            )
            try:
                part = _tensor(value, spec)
            except _ValueError as err:
                raise BadInput(f"{element_words}{err.words}; {at}{err.path}") from err
            if parts and part.shape != parts[0].shape:
                size, want = part.size, parts[0].size
                words = (
                    f"Expecting tensor size: {want} but got: {size}"
                    if size != want
                    else f"Expecting shape {shape_text(parts[0].shape)} but got: "
                    f"{shape_text(part.shape)}"
                )
                raise BadInput(
                    f"{element_words}{words}; {at}: every instance's '{name}' must have the "
                    "same shape (ragged instances)"
                )
            parts.append(part)
        array = np.stack(parts)
        _check_shape(array, spec, "instances")
        inputs[name] = array
    return inputs


def _columns(value: Any, specs: dict[str, TensorSpec], max_instances: int) -> dict:
    names = sorted(specs)
    if isinstance(value, dict) and not is_b64(value):
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
            f"each, got {json_text(value)}"
        )
    inputs = {}
    for name in names:
        spec = specs[name]
        where = f"inputs.{name}" if isinstance(value, dict) else "inputs"
        try:
            array = _tensor(named[name], spec)
        except _ValueError as err:
            raise BadInput(f"{err.words}; {where}{err.path}") from err
        if array.ndim and spec.shape and spec.shape[0] == -1:
            check_image_count(len(array), max_instances)
        _check_shape(array, spec, where)
        inputs[name] = array
    rows = {len(a) for n, a in inputs.items() if a.ndim and specs[n].batched}
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
        if key.endswith("_bytes"):
            return _strings(array, _b64_text)
        return _strings(array, _utf8_text)
    # A sum that is finite has no NaN or infinity in it (one that overflows only takes the
    # careful way).
    if array.dtype.kind == "f" and not np.isfinite(array.sum()):
        holder = np.empty(array.size, dtype=object)
        holder[:] = [v if np.isfinite(v) else _NON_FINITE[str(float(v))] for v in array.ravel()]
        return holder.reshape(array.shape).tolist()
    if array.dtype.kind == "c":
        raise BadInput(f"output '{key}' is complex: JSON cannot hold it")
    # orjson writes numpy scalars, not 0-d arrays.
    return array[()] if array.ndim == 0 else array


def _utf8_text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _b64_text(data: bytes) -> dict:
    return {"b64": base64.b64encode(data).decode("ascii")}


# Outputs' strings come mostly from a small vocabulary (a classifier's class names): each is
# turned into text once, not once per answer. Bounded: emptied when full.
_TEXTS: dict[bytes, str] = {}
_TEXTS_MAX = 4096


def _strings(array: np.ndarray, to_text) -> Any:
    """A string output's elements as text (or b64 objects), in its nesting."""
    flat = []
    for item in array.ravel().tolist():
        data = item if isinstance(item, bytes) else str(item).encode()
        if to_text is _utf8_text:
            text = _TEXTS.get(data)
            if text is None:
                if len(_TEXTS) >= _TEXTS_MAX:
                    _TEXTS.clear()
                text = _TEXTS[data] = _utf8_text(data)
            flat.append(text)
        else:
            flat.append(to_text(data))
    if array.ndim == 1:
        return flat
    if array.ndim == 0:
        return flat[0]
    holder = np.empty(len(flat), dtype=object)
    holder[:] = flat
    return holder.reshape(array.shape).tolist()


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
