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
from service.errors import BadInput, PayloadTooLarge, check_image_count

SHAPE_TEXT = f"{IMAGE_HEIGHT}x{IMAGE_WIDTH}"


def loads(body: bytes) -> Any:
    """Parse JSON; BadInput naming the position when it is not valid JSON (NaN and Inf are not)."""
    if not body:
        raise BadInput("JSON Parse error: the request body is empty")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise BadInput(f"JSON Parse error: {err}") from err


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


def _diagnose(images: list, where: str, start: int) -> str:
    """Find the first instance that is not a 28x28 array of numbers and say what it is."""
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


def _value_of(value: Any) -> str:
    """A value for a message: its type, and its text when that is short and flat."""
    if isinstance(value, (list, dict)):
        return f"a {type(value).__name__}"  # its text could nest a thousand levels deep
    return f"{type(value).__name__} {str(value)[:40]!r}"


def may_hold_booleans(body: bytes) -> bool:
    """Whether a JSON body may hold true/false: the cheap test before the exact one. Every
    `true` has an "r" and every `false` an "l"; numbers and the usual `{"instances": ...}`
    have neither. One-byte searches are memchr: 0.2 us for a 28x28 body, where searching
    for "true" takes 4.6 us."""
    return b"l" in body or b"r" in body


def refuse_booleans(images: Any, where: str, start: int = 0) -> None:
    """BadInput naming the first boolean among images' pixels: numpy would read true as 1,
    and TF Serving refuses a bool where a float is expected."""
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
                    raise BadInput(f"{where}[{i}][{r}][{c}]: expected a number, got bool {pixel!r}")


def to_array(value: Any, where: str, start: int = 0) -> np.ndarray:
    """A JSON list of 28x28 number arrays as a numpy array [n, 28, 28] (int64 or float64).

    Args:
        value: the parsed JSON.
        where: the field's name in the body, for messages ("instances").
        start: the index of value's first image in that field (a slice of it is checked).
    Raises:
        BadInput: not a non-empty list of 28x28 arrays of numbers; the message names the
            first offending instance and what it is.
    """
    if not isinstance(value, list):
        raise BadInput(f"{where}: expected a list of {SHAPE_TEXT} arrays, got {_shape_of(value)}")
    if not value:
        raise BadInput(f"{where}: is empty; send at least one {SHAPE_TEXT} image")
    try:
        arr = np.array(value)
    except (ValueError, TypeError, OverflowError, RecursionError):
        arr = None
    if arr is None or arr.dtype.kind not in "iuf" or arr.shape[1:] != IMAGE_SHAPE or arr.ndim != 3:
        raise BadInput(_diagnose(value, where, start))
    return arr


def as_model_input(arr: np.ndarray, where: str) -> np.ndarray:
    """float32 as TF Serving would feed it; BadInput on values that are not finite in float32."""
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
    image where orjson's Python lists and numpy's conversion of them take 35. None for
    anything else (see _image_arrays), booleans and strings included."""
    view = _image_arrays(body, max_images, "signature_name")
    if view is None:
        return None
    instances, signature_name = view
    flat = _buffer(instances, "d", np.float64)
    if flat is not None and not np.abs(flat).max() < 2.0**53:
        # Integers this large reach float32 by another rounding than numpy's int64 would
        # take: read them as numpy reads them. Below 2**53 every integer is exact in
        # float64, so the model gets the same float32 either way.
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


def parse_tf_serving_request(body: bytes, max_images: int) -> tuple[str, np.ndarray, bool]:
    """A TF Serving REST predict body to (signature_name, float32 images, columnar).

    Accepts the row format ({"instances": [...]}, each a tensor or {"image": tensor}) and the
    columnar format ({"inputs": tensor} or {"inputs": {"image": tensor}}). The images are
    counted before any array is built.

    Raises:
        BadInput: not that, or not 28x28 arrays of finite numbers (the message says where).
        PayloadTooLarge: more than max_images images.
    """
    simple = _simple_rows(body, max_images)
    if simple is not None:
        signature_name, images = simple
        return signature_name, as_model_input(images, "instances"), False
    request = loads(body)
    if not isinstance(request, dict):
        raise BadInput(f"Request body must be a JSON object, got {type(request).__name__}")
    signature_name = request.get("signature_name", SIGNATURE_NAME)
    if not isinstance(signature_name, str):
        raise BadInput("'signature_name' must be a string")
    # TF Serving reads an empty name as the default signature.
    signature_name = signature_name or SIGNATURE_NAME
    has_instances, has_inputs = "instances" in request, "inputs" in request
    if has_instances == has_inputs:
        raise BadInput(
            "Request body must have exactly one of 'instances' (row format) or 'inputs' "
            "(columnar format)" + ("; it has both" if has_instances else "; it has neither")
        )
    where = "instances" if has_instances else "inputs"
    images = request[where]
    if has_instances:
        if isinstance(images, list) and images and isinstance(images[0], dict):
            images = [_named_input(item, f"instances[{i}]") for i, item in enumerate(images)]
    elif isinstance(images, dict):
        images = _named_input(images, "inputs")
    # Counted before any array is built. A list whose first item is a list of numbers is a
    # shape mistake (one image sent without its outer list), said as such by to_array below.
    first = images[0] if isinstance(images, list) and images else None
    if isinstance(first, list) and (not first or isinstance(first[0], list)):
        check_image_count(len(images), max_images)
    if may_hold_booleans(body):
        refuse_booleans(images, where)
    return signature_name, as_model_input(to_array(images, where), where), not has_instances


def _named_input(item: Any, where: str) -> Any:
    if not isinstance(item, dict) or set(item) != {INPUT_KEY}:
        got = sorted(item) if isinstance(item, dict) else _shape_of(item)
        raise BadInput(f"{where}: expected an object with the one input '{INPUT_KEY}', got {got}")
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
) -> np.ndarray:
    """The friendly /predict's instances to float32 images [n, 28, 28] in [0, 1].

    Each instance is a 28x28 array of pixels (integers 0-255 or floats in [0, 1]) or
    {"b64": "<base64 PNG or JPEG>"}; each is read on its own, so one image's integers do not
    change how another's floats are read. The image files are sized from their headers first,
    against `pixel_budget` for all of them together, before any is decoded.

    Raises:
        BadInput: an instance is neither; the message names it.
        PayloadTooLarge: the image files would decode to more than pixel_budget pixels.
        Cancelled: `cancelled` was set (the client left) before the last image was decoded.
    """
    files = {
        i: (f"instances[{i}]", _b64_bytes(item, f"instances[{i}]"))
        for i, item in enumerate(instances)
        if isinstance(item, dict)
    }
    check_pixel_budget(list(files.values()), pixel_budget)
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


def check_pixel_budget(files: list[tuple[str, bytes]], budget: int) -> None:
    """Size every image file from its header (nothing decoded) and refuse the request when
    they would decode to more than `budget` pixels together (MAX_REQUEST_PIXELS).

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


def decode_image_files(
    files: list[tuple[str, bytes]],
    invert: str,
    pixel_budget: int,
    cancelled: threading.Event | None = None,
) -> np.ndarray:
    """Uploaded image files to uint8 [n, 28, 28], within the request's pixel budget.

    Raises:
        BadInput: a file that is not an image (named by `where`, the first of each pair).
        PayloadTooLarge: over the budget (checked from the headers, before any decoding).
        Cancelled: `cancelled` was set before the last file was decoded.
    """
    check_pixel_budget(files, pixel_budget)
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
