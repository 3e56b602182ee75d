"""JSON request bodies to numpy, fast (orjson, no per-element pydantic).

Two input conventions:
- TF Serving's `:predict` passes the tensor to the model as it is: float32 [n, 28, 28].
- The friendly `/predict` takes pixels: integers 0-255, or floats already in [0, 1]
  (artifact.contract.pixels_to_input, the rule batch prediction applies too).

Every error names where in the body the problem is, what was expected and what came.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np
import orjson

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
from artifact.images import ImageError, image_to_pixels
from service.errors import BadInput

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
    except ValueError:
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
                    return (
                        f"{at}[{r}][{c}]: expected a number, got "
                        f"{type(pixel).__name__} {str(pixel)[:40]!r}"
                    )
    return f"{where}: expected a list of {SHAPE_TEXT} arrays of numbers"


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
    except (ValueError, TypeError, OverflowError):
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


def parse_tf_serving_request(body: bytes) -> tuple[str, np.ndarray, bool]:
    """A TF Serving REST predict body to (signature_name, float32 images, columnar).

    Accepts the row format ({"instances": [...]}, each a tensor or {"image": tensor}) and the
    columnar format ({"inputs": tensor} or {"inputs": {"image": tensor}}).
    """
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
    if has_instances:
        instances = request["instances"]
        if isinstance(instances, list) and instances and isinstance(instances[0], dict):
            instances = [_named_input(item, f"instances[{i}]") for i, item in enumerate(instances)]
        return signature_name, as_model_input(to_array(instances, "instances"), "instances"), False
    inputs = request["inputs"]
    if isinstance(inputs, dict):
        inputs = _named_input(inputs, "inputs")
    return signature_name, as_model_input(to_array(inputs, "inputs"), "inputs"), True


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


def decode_pixel_instances(instances: list, invert: str) -> np.ndarray:
    """The friendly /predict's instances to float32 images [n, 28, 28] in [0, 1].

    Each instance is a 28x28 array of pixels (integers 0-255 or floats in [0, 1]) or
    {"b64": "<base64 PNG or JPEG>"}; each is read on its own, so one image's integers do not
    change how another's floats are read.

    Raises:
        BadInput: an instance is neither; the message names it.
    """
    images = []
    for i, item in enumerate(instances):
        where = f"instances[{i}]"
        if isinstance(item, dict):
            images.append(decode_b64_image(item, where, invert))
            continue
        try:
            images.append(pixels_to_input(to_array([item], "instances", start=i))[0])
        except PixelError as err:
            raise BadInput(f"{where}: {err.problem}") from err
    return np.stack(images)


def decode_b64_image(value: dict, where: str, invert: str) -> np.ndarray:
    """{"b64": "<base64 PNG/JPEG>"} (TF Serving's binary convention) to float32 [28, 28]."""
    if not isinstance(value.get("b64"), str) or len(value) != 1:
        raise BadInput(f'{where}: expected a {SHAPE_TEXT} array or {{"b64": "<base64 image>"}}')
    try:
        data = base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError) as err:
        raise BadInput(f"{where}.b64: not valid base64 ({err})") from err
    return normalize_pixels(image_file_pixels(data, where, invert))


def image_file_pixels(data: bytes, where: str, invert: str) -> np.ndarray:
    """An image file's bytes to uint8 [28, 28]; BadInput when it is not an image."""
    try:
        return image_to_pixels(data, invert)
    except ImageError as err:
        raise BadInput(f"{where}: {err}") from err
