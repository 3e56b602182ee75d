"""JSON request bodies to numpy, fast (simdjson or orjson, no per-element pydantic).

Two input conventions:
- TF Serving's `:predict` passes the tensor to the model as it is: float32 [n, 28, 28].
- The friendly `/predict` takes pixels: integers 0-255, or floats already in [0, 1]
  (artifact.contract.pixels_to_input, the rule batch prediction applies too).

Every error names where in the body the problem is, what was expected and what came.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import threading
from typing import Any

import numpy as np
import orjson
import simdjson

from artifact.contract import (
    IMAGE_HEIGHT,
    IMAGE_SHAPE,
    IMAGE_WIDTH,
    INPUT_KEY,
    SIGNATURE_NAME,
    PixelError,
    finite_float32,
    normalize_pixels,
    pixels_to_input,
)
from artifact.images import MAX_PIXELS, ImageError, image_to_pixels, open_image
from service.budgets import UNBOUNDED_PIXELS, PixelBudget
from service.errors import BadInput, PayloadTooLarge, ServiceError, check_image_count

SHAPE_TEXT = f"{IMAGE_HEIGHT}x{IMAGE_WIDTH}"


def loads(body: bytes, non_finite: bool = False) -> Any:
    """Parse JSON; BadInput in TF Serving's words ("JSON Parse error: ...", its offset) when it
    is not valid JSON.

    Args:
        non_finite: also read the literals `NaN`, `Infinity` and `-Infinity` (what Python's
            json.dumps writes), as TF Serving's parser does (rapidjson's
            kParseNanAndInfFlag, tensorflow_serving/util/json_tensor.cc). Only a body orjson
            refuses and that holds such a literal takes the slower parser.
    """
    if not body:
        raise BadInput("JSON Parse error: The document is empty")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as err:
        if non_finite and (b"NaN" in body or b"Infinity" in body):
            try:
                return json.loads(body)
            except (ValueError, RecursionError):
                pass  # orjson's message says where
        raise BadInput(_parse_error(body, err)) from err


# Bytes a JSON value can begin with: anything else where orjson stops is rapidjson's
# "Invalid value." (its GetParseError_En's words, which TF Serving's messages carry).
_VALUE_STARTS = frozenset(b'{["-0123456789tfn')


def _parse_error(body: bytes, err: orjson.JSONDecodeError) -> str:
    at = f"at offset: {err.pos}"
    if err.msg == "unexpected content after document":
        words = "The document root must not be followed by other values."
    elif (
        err.msg.startswith("unexpected character")
        and err.pos < len(body)
        and body[err.pos] not in _VALUE_STARTS
    ):
        words = "Invalid value."
    else:
        return f"JSON Parse error: {err.msg} {at}"
    return f"JSON Parse error: {words} {at} ({err.msg})"


def _shape_of(value: Any) -> str:
    """A short description of what a client sent where one 28x28 image was expected."""
    if isinstance(value, (bool, str, dict)) or value is None:
        return f"a {type(value).__name__}"
    if isinstance(value, (int, float)):
        return "a single number"
    try:
        arr = np.array(value, dtype=object)
    except (ValueError, RecursionError):
        return "a ragged nested list"
    # Lists of unequal lengths stop numpy early: lists are left inside the array.
    if any(isinstance(item, list) for item in arr.flat):
        return "a ragged nested list"
    return f"shape {tuple(arr.shape)}"


def _diagnose(images: list, where: str, start: int, tf_words: bool = False) -> str:
    """Find the first instance that is not a 28x28 array of numbers and say what it is; with
    `tf_words`, in TF Serving's words first (tensorflow_serving/util/json_tensor.cc, which
    fills the tensor element by element: a value of the wrong type where it comes, then an
    element whose size or shape differs from the first's), then where and what was expected."""
    if tf_words:
        problem = _tf_diagnosis(images, where, start)
        if problem is not None:
            return problem
    for i, image in enumerate(images, start):
        at = f"{where}[{i}]"
        if not isinstance(image, list):
            return f"{at}: expected a {SHAPE_TEXT} array of numbers, got {_shape_of(image)}"
        if len(image) != IMAGE_HEIGHT or not all(
            isinstance(row, list) and len(row) == IMAGE_WIDTH for row in image
        ):
            return f"{at}: expected a {SHAPE_TEXT} array of numbers, got {_shape_of(image)}"
        for r, row in enumerate(image):
            for c, pixel in enumerate(row):
                if isinstance(pixel, bool) or not isinstance(pixel, (int, float)):
                    return f"{at}[{r}][{c}]: expected a number, got {_value_of(pixel)}"
    return f"{where}: expected a list of {SHAPE_TEXT} arrays of numbers"


def _tf_diagnosis(images: list, where: str, start: int) -> str | None:
    """The first problem TF Serving would name, element by element, in its words and ours."""
    first_size = first_shape = None
    for i, image in enumerate(images, start):
        at = f"{where}[{i}]"
        element = (
            f"Failed to process element: {i} of '{where}' list. Error: INVALID_ARGUMENT: "
            if where == "instances"
            else ""  # the columnar format is one tensor: no elements
        )
        expected = f"{at}: expected a {SHAPE_TEXT} array of numbers, got {_shape_of(image)}"
        found = _first_non_number(image)
        if found is not None:
            path, value = found
            return f"{element}{type_error(value)}; {at}{path}: expected a number, got " + (
                _value_of(value)
            )
        size, shape = _size_and_shape(image)
        if first_size is None:
            first_size, first_shape = size, shape
        elif not element:
            continue
        elif size != first_size:
            return f"{element}Expecting tensor size: {first_size} but got: {size}; {expected}"
        elif shape != first_shape:
            return (
                f"{element}Expecting shape {_shape_text(first_shape)} but got: "
                f"{_shape_text(shape)}; {expected}"
            )
    return None


def _value_of(value: Any) -> str:
    """A value for a message: its type, and its text when that is short and flat."""
    if isinstance(value, (list, dict)):
        return f"a {type(value).__name__}"  # its text could nest a thousand levels deep
    return f"{type(value).__name__} {str(value)[:40]!r}"


def _shape_text(shape: tuple[int, ...]) -> str:
    return f"[{','.join(map(str, shape))}]"


def _first_non_number(value: Any) -> tuple[str, Any] | None:
    """The first value that is not a number, depth first, with its path ("[0][3]"); without
    recursion (a hostile body may nest a thousand levels deep)."""
    stack: list[tuple[Any, tuple[int, ...]]] = [(value, ())]
    while stack:
        item, at = stack.pop()
        if isinstance(item, list):
            stack.extend((item[k], (*at, k)) for k in range(len(item) - 1, -1, -1))
        elif isinstance(item, bool) or not isinstance(item, (int, float)):
            return "".join(f"[{k}]" for k in at), item
    return None


def _size_and_shape(value: Any) -> tuple[int, tuple[int, ...]]:
    """The number of values in a nested list, and its shape as TF Serving reads it (the
    lengths of the first list at each level)."""
    shape, probe = [], value
    while isinstance(probe, list):
        shape.append(len(probe))
        probe = probe[0] if probe else None
    stack, size = [value], 0
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        else:
            size += 1
    return size, tuple(shape)


_JSON_TYPES = {str: "String", dict: "Object", list: "Array", type(None): "Null"}


def type_error(value: Any, dtype: str = "float") -> str:
    """TF Serving's words for a JSON value of the wrong type (json_tensor.cc, TypeError)."""
    if isinstance(value, bool):
        kind = "True" if value else "False"
    else:
        kind = _JSON_TYPES.get(type(value), "Number")
    try:
        text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS, default=str).decode()
    except orjson.JSONEncodeError:  # nested past orjson's depth
        text = f"{{{kind}}}"
    if len(text) > 40:
        text = text[:40] + "..."
    return f"JSON Value: {text} Type: {kind} is not of expected type: {dtype}"


def may_hold_booleans(body: bytes) -> bool:
    """Whether a JSON body may hold true/false: the cheap test before the exact one. Every
    `true` has an "r" and every `false` an "l"; numbers and the usual `{"instances": ...}`
    have neither. One-byte searches are memchr: 0.2 us for a 28x28 body, where searching
    for "true" takes 4.6 us."""
    return b"l" in body or b"r" in body


def refuse_booleans(images: Any, where: str, start: int = 0, tf_words: bool = False) -> None:
    """BadInput naming the first boolean among images' pixels: numpy would read true as 1,
    and TF Serving refuses a bool where a float is expected (in its words first, with
    `tf_words`)."""
    if not isinstance(images, list):
        return
    for i, image in enumerate(images, start):
        if not isinstance(image, list):
            continue
        for r, row in enumerate(image):
            if not isinstance(row, list):
                continue
            for c, pixel in enumerate(row):
                if isinstance(pixel, bool):
                    detail = f"{where}[{i}][{r}][{c}]: expected a number, got bool {pixel!r}"
                    raise BadInput(f"{type_error(pixel)}; {detail}" if tf_words else detail)


def to_array(value: Any, where: str, start: int = 0, tf_words: bool = False) -> np.ndarray:
    """A JSON list of 28x28 number arrays as a numpy array [n, 28, 28] (int64 or float64).

    Args:
        value: the parsed JSON.
        where: the field's name in the body, for messages ("instances").
        start: the index of value's first image in that field (a slice of it is checked).
        tf_words: messages begin with TF Serving's words for the same problem (/v1).
    Raises:
        BadInput: not a non-empty list of 28x28 arrays of numbers; the message names the
            first offending instance and what it is.
    """
    if not isinstance(value, list):
        words = "Expecting 'instances' to be an list/array; " if where == "instances" else ""
        words = words if tf_words else ""
        raise BadInput(
            f"{words}{where}: expected a list of {SHAPE_TEXT} arrays, got {_shape_of(value)}"
        )
    if not value:
        words = "No values in 'instances' array; " if tf_words and where == "instances" else ""
        raise BadInput(f"{words}{where}: is empty; send at least one {SHAPE_TEXT} image")
    try:
        arr = np.array(value)
    except (ValueError, TypeError, OverflowError, RecursionError):
        arr = None
    if arr is None or arr.dtype.kind not in "iuf" or arr.shape[1:] != IMAGE_SHAPE or arr.ndim != 3:
        raise BadInput(_diagnose(value, where, start, tf_words))
    return arr


def as_model_input(arr: np.ndarray, where: str, strict: bool = True) -> np.ndarray:
    """float32 as TF Serving would feed it.

    Args:
        strict: BadInput on values that are not finite in float32 (STRICT_NUMBERS); when
            false, NaN and Inf pass and values past float32's range become inf, as TF Serving
            reads them (rapidjson's GetFloat, TensorFlow's float_val).
    """
    if not strict:
        with np.errstate(over="ignore", invalid="ignore"):
            return arr.astype(np.float32)
    try:
        return finite_float32(arr)
    except PixelError as err:
        raise BadInput(f"{where}[{err.index}]: {err.problem}") from err


# Arrays in a body of n images: the instances list, each image, each image's rows.
def _arrays_in_rows(n: int) -> int:
    return 1 + n * (1 + IMAGE_HEIGHT)


# What simdjson raises for a body it cannot read or a value of another type.
_SIMDJSON_ERRORS = (ValueError, TypeError, RuntimeError, KeyError, OverflowError)


def _image_arrays(body: bytes, max_images: int, extra_key: str | None = None):
    """simdjson's view of the usual body, `{"instances": [n 28x28 arrays]}` (and maybe
    `extra_key`, a string), as (instances, the extra string or None); None for anything else
    or anything in doubt (a syntax error, a shape off, too many images, duplicate keys...):
    the general path reads those and says what is wrong.

    The shape is proven exactly: every image is an array of 28 arrays of 28 elements, and the
    body holds no other `[` (so no element is itself an array, and no string hides one).
    The elements' types are the caller's to check (simdjson's buffers refuse non-numbers).
    """
    if body.startswith(b"\xef\xbb\xbf"):
        return None  # simdjson skips a byte order mark; orjson refuses it, and says so
    try:
        # A parser per call: its documents stay valid only until its next parse, and a body
        # may be parsed on a worker thread too. Making one costs well under a microsecond.
        document = simdjson.Parser().parse(body)
        if not isinstance(document, simdjson.Object):
            return None
        keys = list(document.keys())
        if "instances" not in keys or len(set(keys)) != len(keys):
            return None
        extra = None
        for key in keys:
            if key == extra_key:
                extra = document[key]
                if not isinstance(extra, str):
                    return None
            elif key != "instances":
                return None
        instances = document["instances"]
        if not isinstance(instances, simdjson.Array):
            return None
        n = len(instances)
        if not 0 < n <= max_images or body.count(b"[") != _arrays_in_rows(n):
            return None
        for image in instances:
            if not isinstance(image, simdjson.Array) or len(image) != IMAGE_HEIGHT:
                return None
            for row in image:
                if not isinstance(row, simdjson.Array) or len(row) != IMAGE_WIDTH:
                    return None
    except _SIMDJSON_ERRORS:
        return None
    return instances, extra


def _buffer(array, of_type: str, dtype) -> np.ndarray | None:
    """A simdjson array's numbers, flattened, as numpy; None when they are not all of_type."""
    try:
        return np.frombuffer(array.as_buffer(of_type=of_type), dtype=dtype)
    except _SIMDJSON_ERRORS:
        return None


def _numbers(array) -> np.ndarray | None:
    """A simdjson array's numbers, flattened, as numpy reads the same lists: int64 when all
    are integers within int64, float64 when any is a float (every number rounded once, as
    numpy rounds); None when integers past int64 come without a float, which numpy reads by
    rules of its own (uint64, or float64 when mixed): the general path decides."""
    flat = _buffer(array, "i", np.int64)
    if flat is not None:
        return flat
    if _buffer(array, "u", np.uint64) is not None:
        return None
    return _buffer(array, "d", np.float64)


def _simple_rows(body: bytes, max_images: int) -> tuple[str, np.ndarray] | None:
    """The row format's usual body read by simdjson straight into numpy: about 10 us for one
    image where orjson's Python lists and numpy's conversion of them take 35. The images are
    float32, ready for the model, when every value is below 2**53 in magnitude; otherwise
    the numbers as numpy reads them, for as_model_input. None for anything else (see
    _image_arrays), booleans and strings included."""
    view = _image_arrays(body, max_images, "signature_name")
    if view is None:
        return None
    instances, signature_name = view
    flat = _buffer(instances, "d", np.float64)
    if flat is not None and flat.size == len(instances) * IMAGE_HEIGHT * IMAGE_WIDTH:
        if np.abs(flat).max() < 2.0**53:
            # Every integer below 2**53 is exact in float64, so the model gets the float32
            # numpy's int64 would give; and every value is finite and inside float32's
            # range, so this cast is what as_model_input's checks would end in, strict or not.
            return signature_name or SIGNATURE_NAME, flat.astype(np.float32).reshape(
                -1, *IMAGE_SHAPE
            )
        # Integers this large reach float32 by another rounding than numpy's int64 would
        # take: read them as numpy reads them.
        flat = _numbers(instances)
    if flat is None or flat.size != len(instances) * IMAGE_HEIGHT * IMAGE_WIDTH:
        return None
    return signature_name or SIGNATURE_NAME, flat.reshape(-1, *IMAGE_SHAPE)


def simple_pixel_images(body: bytes, max_images: int) -> list[np.ndarray] | None:
    """The friendly /predict's usual JSON body, `{"instances": [n 28x28 pixel arrays]}`, read
    by simdjson: each image as numpy would read its list (int64 when all its numbers are
    integers, float64 otherwise), for decode_pixel_images. None for anything else (see
    _image_arrays): base64 images, booleans, integers past int64..."""
    view = _image_arrays(body, max_images)
    if view is None:
        return None
    images = []
    for image in view[0]:
        flat = _numbers(image)
        if flat is None:
            return None
        images.append(flat.reshape(IMAGE_SHAPE))
    return images


@dataclasses.dataclass(frozen=True)
class PredictBody:
    """A TF Serving REST predict body, read in TF Serving's order: its JSON and its
    `signature_name` first (their errors are raised at once), then its tensors.

    Attributes:
        signature_name: the signature asked for (the default one when empty or absent).
        images: float32 [n, 28, 28]; None when `problem` is set.
        columnar: the columnar format (`inputs`), answered as `outputs`.
        problem: what is wrong with the tensors, for the caller to raise once it has found
            the model, version, label and signature (TF Serving looks them up before it
            reads the tensors, tensorflow_serving/util/json_tensor.cc,
            FillPredictRequestFromJson).
        request: the body's JSON object, when it was parsed as such: a signature that does
            not take images reads its tensors from it (service/tensor_json.py).
    """

    signature_name: str
    images: np.ndarray | None
    columnar: bool = False
    problem: ServiceError | None = None
    # The parsed JSON object, when the general path read it (not the usual image body).
    request: dict | None = None


def read_predict_body(
    body: bytes, max_images: int, strict: bool = True, tensors: bool = True
) -> PredictBody:
    """A TF Serving REST predict body to its signature name and float32 images.

    Accepts the row format ({"instances": [...]}, each a tensor or {"image": tensor}) and the
    columnar format ({"inputs": tensor} or {"inputs": {"image": tensor, ...}}: only the
    signature's input is read, as TF Serving reads it). The images are counted before any
    array is built. The usual row body is read by simdjson; only others (and bodies with
    NaN or Infinity) by orjson.

    Args:
        strict: STRICT_NUMBERS: refuse values that are not finite in float32; otherwise NaN,
            Infinity and -Infinity literals are read and values past float32's range become
            inf, as TF Serving reads them.
        tensors: read the images too (unless the usual body's fast path has); false leaves
            them for image_tensors(), once the signature is known to take images.
    Raises:
        BadInput: not JSON, not an object, `signature_name` not a string (TF Serving's words
            first, then where and what).
    """
    simple = _simple_rows(body, max_images)
    if simple is not None:
        signature_name, images = simple
        if images.dtype == np.float32:  # proven finite and in range by _simple_rows
            return PredictBody(signature_name, images)
        try:
            return PredictBody(signature_name, as_model_input(images, "instances", strict))
        except BadInput as err:
            return PredictBody(signature_name, None, False, err)
    request = loads(body, non_finite=not strict)
    if not isinstance(request, dict):
        raise BadInput(
            f"JSON Value: {_value_of(request)} Is not object; Request body must be a JSON "
            f"object, got {type(request).__name__}"
        )
    signature_name = request.get("signature_name", SIGNATURE_NAME)
    if not isinstance(signature_name, str):
        raise BadInput(
            "'signature_name' key must be a string value; it is " + _value_of(signature_name)
        )
    # TF Serving reads an empty name as the default signature.
    signature_name = signature_name or SIGNATURE_NAME
    parsed = PredictBody(signature_name, None, "instances" not in request, request=request)
    return image_tensors(parsed, body, max_images, strict) if tensors else parsed


def image_tensors(parsed: PredictBody, body: bytes, max_images: int, strict: bool) -> PredictBody:
    """A body read without its tensors (read_predict_body's `tensors=False`), with its float32
    images, or the problem with them, read from its JSON object."""
    if parsed.images is not None or parsed.problem is not None or parsed.request is None:
        return parsed
    try:
        images = _tensor_images(parsed.request, body, max_images, strict)
    except (BadInput, PayloadTooLarge) as err:
        return dataclasses.replace(parsed, problem=err)
    return dataclasses.replace(parsed, images=images)


def _tensor_images(request: dict, body: bytes, max_images: int, strict: bool) -> np.ndarray:
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
    where = "instances" if has_instances else "inputs"
    images = request[where]
    if has_instances:
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
    # shape mistake (one image sent without its outer list), said as such by to_array below.
    first = images[0] if isinstance(images, list) and images else None
    if isinstance(first, list) and (not first or isinstance(first[0], list)):
        check_image_count(len(images), max_images)
    if may_hold_booleans(body):
        refuse_booleans(images, where, tf_words=True)
    return as_model_input(to_array(images, where, tf_words=True), where, strict)


def parse_tf_serving_request(
    body: bytes, max_images: int, strict: bool = True
) -> tuple[str, np.ndarray, bool]:
    """read_predict_body's (signature_name, float32 images, columnar), its problem raised.

    Raises:
        BadInput: not that, or not 28x28 arrays of (finite, when strict) numbers.
        PayloadTooLarge: more than max_images images.
    """
    parsed = read_predict_body(body, max_images, strict)
    if parsed.problem is not None:
        raise parsed.problem
    return parsed.signature_name, parsed.images, parsed.columnar


def _named_input(item: Any, index: int) -> Any:
    """An instance of the row format's named form, {"image": tensor}: TF Serving's words for
    a key the signature does not have, or a missing one."""
    if not isinstance(item, dict):
        raise BadInput(
            f"Expecting object but got list at item {index} of input list; instances[{index}]: "
            f"expected an object with the one input '{INPUT_KEY}', got {_shape_of(item)}"
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


def pixel_instances(request: Any) -> list:
    """The `instances` list of a friendly /predict body (parsed JSON), before decoding.

    Raises:
        BadInput: not an object with a non-empty `instances` list.
    """
    if not isinstance(request, dict) or "instances" not in request:
        raise BadInput('Request body must be a JSON object with "instances": [...]')
    instances = request["instances"]
    if not isinstance(instances, list) or not instances:
        to_array(instances, "instances")  # raises the right message
    return instances


class Cancelled(Exception):
    """The request that asked for the decoding is gone: the rest is not decoded."""


def decode_pixel_instances(
    instances: list,
    invert: str,
    pixel_budget: int = MAX_PIXELS,
    cancelled: threading.Event | None = None,
    in_flight: PixelBudget = UNBOUNDED_PIXELS,
) -> np.ndarray:
    """The friendly /predict's instances to float32 images [n, 28, 28] in [0, 1].

    Each instance is a 28x28 array of pixels (integers 0-255 or floats in [0, 1]) or
    {"b64": "<base64 PNG or JPEG>"}; each is read on its own, so one image's integers do not
    change how another's floats are read. The image files are sized from their headers first,
    against `pixel_budget` for all of them together, and reserved from `in_flight` (the
    process's), before any is decoded.

    Raises:
        BadInput: an instance is neither; the message names it.
        PayloadTooLarge: the image files would decode to more than pixel_budget pixels.
        PixelsInFlight: `in_flight` has no room for them now.
        Cancelled: `cancelled` was set (the client left) before the last image was decoded.
    """
    files = {
        i: (f"instances[{i}]", _b64_bytes(item, f"instances[{i}]"))
        for i, item in enumerate(instances)
        if isinstance(item, dict)
    }
    pixels = check_pixel_budget(list(files.values()), pixel_budget)
    with in_flight.hold(pixels):
        return _decode_instances(instances, files, invert, cancelled)


def _decode_instances(instances, files, invert, cancelled) -> np.ndarray:
    images = []
    for i, item in enumerate(instances):
        where = f"instances[{i}]"
        if i in files:
            if cancelled is not None and cancelled.is_set():
                raise Cancelled
            images.append(normalize_pixels(image_file_pixels(files[i][1], where, invert)))
            continue
        refuse_booleans([item], "instances", start=i)
        try:
            images.append(pixels_to_input(to_array([item], "instances", start=i))[0])
        except PixelError as err:
            raise BadInput(f"{where}: {err.problem}") from err
    return np.stack(images)


def decode_pixel_images(images: list[np.ndarray]) -> np.ndarray:
    """simple_pixel_images' arrays to float32 images [n, 28, 28] in [0, 1], by the same rule
    and with the same messages as decode_pixel_instances.

    Raises:
        BadInput: pixels out of range, named by their instance.
    """
    out = []
    for i, image in enumerate(images):
        try:
            out.append(pixels_to_input(image[np.newaxis])[0])
        except PixelError as err:
            raise BadInput(f"instances[{i}]: {err.problem}") from err
    return np.stack(out)


def _b64_bytes(value: dict, where: str) -> bytes:
    """{"b64": "<base64 PNG/JPEG>"} (TF Serving's binary convention) to the file's bytes."""
    if not isinstance(value.get("b64"), str) or len(value) != 1:
        raise BadInput(f'{where}: expected a {SHAPE_TEXT} array or {{"b64": "<base64 image>"}}')
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError) as err:
        raise BadInput(f"{where}.b64: not valid base64 ({err})") from err


def check_pixel_budget(files: list[tuple[str, bytes]], budget: int) -> int:
    """Size every image file from its header (nothing decoded) and refuse the request when
    they would decode to more than `budget` pixels together (MAX_REQUEST_PIXELS); the
    pixels they decode to.

    Raises:
        BadInput: a file is not an image in an accepted format, or is too large by itself.
        PayloadTooLarge: over the budget.
    """
    total = 0
    for where, data in files:
        try:
            image = open_image(data)
        except ImageError as err:
            raise BadInput(f"{where}: {err}") from err
        total += image.width * image.height
    if total > budget:
        raise PayloadTooLarge(
            f"the request's images would decode to {total / 1e6:.1f} megapixels; the limit "
            f"is {budget / 1e6:g} per request (MAX_REQUEST_PIXELS)"
        )
    return total


def decode_image_files(
    files: list[tuple[str, bytes]],
    invert: str,
    pixel_budget: int,
    cancelled: threading.Event | None = None,
    in_flight: PixelBudget = UNBOUNDED_PIXELS,
) -> np.ndarray:
    """Uploaded image files to uint8 [n, 28, 28], within the request's pixel budget and the
    process's (`in_flight`).

    Raises:
        BadInput: a file that is not an image (named by `where`, the first of each pair).
        PayloadTooLarge: over the budget (checked from the headers, before any decoding).
        PixelsInFlight: `in_flight` has no room for them now.
        Cancelled: `cancelled` was set before the last file was decoded.
    """
    with in_flight.hold(check_pixel_budget(files, pixel_budget)):
        pixels = []
        for where, data in files:
            if cancelled is not None and cancelled.is_set():
                raise Cancelled
            pixels.append(image_file_pixels(data, where, invert))
        return np.stack(pixels)


def image_file_pixels(data: bytes, where: str, invert: str) -> np.ndarray:
    """An image file's bytes to uint8 [28, 28]; BadInput when it is not an image."""
    try:
        return image_to_pixels(data, invert)
    except ImageError as err:
        raise BadInput(f"{where}: {err}") from err
