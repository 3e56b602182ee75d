"""JSON arrays of images as numpy: the image contract's `[n, 28, 28]` (read by TF Serving's JSON
and by the friendly `/predict`), and any image model's pixel arrays.

Two conventions:
- TF Serving's `:predict` passes the tensor to the model as it is: float32 [n, 28, 28]
  (`to_array`, then `as_model_input`).
- The friendly `/predict` takes pixels: integers 0-255, or floats already in [0, 1]
  (artifact.contract.pixels_to_input, the rule batch prediction applies too).

The usual body, `{"instances": [n 28x28 arrays of numbers]}`, is proven by simdjson
(`image_rows`) and read straight into one buffer; anything else, or in doubt, is read from
orjson's values, and the message for what is wrong names where in the body it is, what was
expected and what came.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import simdjson

from artifact.contract import (
    IMAGE_HEIGHT,
    IMAGE_SHAPE,
    IMAGE_WIDTH,
    PixelError,
    finite_float32,
    pixels_to_input,
)
from artifact.images import ImageInput
from service.codecs import json_body
from service.codecs.values import (
    first_boolean,
    is_number,
    kind_of,
    path_text,
    python_text,
    shape_text,
    type_error,
)
from service.errors import BadInput

SHAPE_TEXT = f"{IMAGE_HEIGHT}x{IMAGE_WIDTH}"


# --- the image contract's [n, 28, 28] -------------------------------------------------------


def shape_of(value: Any) -> str:
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
            return f"{at}: expected a {SHAPE_TEXT} array of numbers, got {shape_of(image)}"
        if len(image) != IMAGE_HEIGHT or not all(
            isinstance(row, list) and len(row) == IMAGE_WIDTH for row in image
        ):
            return f"{at}: expected a {SHAPE_TEXT} array of numbers, got {shape_of(image)}"
        for r, row in enumerate(image):
            for c, pixel in enumerate(row):
                if not is_number(pixel):
                    return f"{at}[{r}][{c}]: expected a number, got {python_text(pixel)}"
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
        expected = f"{at}: expected a {SHAPE_TEXT} array of numbers, got {shape_of(image)}"
        found = _first_non_number(image)
        if found is not None:
            path, value = found
            return (
                f"{element}{type_error(value, 'float')}; {at}{path}: expected a number, got "
                f"{python_text(value)}"
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
                f"{element}Expecting shape {shape_text(first_shape)} but got: "
                f"{shape_text(shape)}; {expected}"
            )
    return None


def _first_non_number(value: Any) -> tuple[str, Any] | None:
    """The first value that is not a number, depth first, with its path ("[0][3]"); without
    recursion (a hostile body may nest a thousand levels deep)."""
    stack: list[tuple[Any, tuple[int, ...]]] = [(value, ())]
    while stack:
        item, at = stack.pop()
        if isinstance(item, list):
            stack.extend((item[k], (*at, k)) for k in range(len(item) - 1, -1, -1))
        elif not is_number(item):
            return path_text(at), item
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


def refuse_booleans(images: Any, where: str, start: int = 0, tf_words: bool = False) -> None:
    """BadInput naming the first boolean among images' pixels: numpy would read true as 1,
    and TF Serving refuses a bool where a float is expected (in its words first, with
    `tf_words`)."""
    found = first_boolean(images, depth=3)
    if found is None:
        return
    i, r, c = found
    pixel = images[i][r][c]
    detail = f"{where}[{i + start}][{r}][{c}]: expected a number, got bool {pixel!r}"
    raise BadInput(f"{type_error(pixel, 'float')}; {detail}" if tf_words else detail)


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
            f"{words}{where}: expected a list of {SHAPE_TEXT} arrays, got {shape_of(value)}"
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


def pixel_images(images: list[np.ndarray] | np.ndarray, where: str = "instances") -> np.ndarray:
    """Each image's pixels (integers 0-255 or floats in [0, 1]) as float32 model input in
    [0, 1], each read on its own, so one image's integers do not change how another's
    floats are read.

    Raises:
        BadInput: pixels out of range, named by their instance.
    """
    out = []
    for i, image in enumerate(images):
        try:
            out.append(pixels_to_input(image[np.newaxis])[0])
        except PixelError as err:
            raise BadInput(f"{where}[{i}]: {err.problem}") from err
    return np.stack(out)


# --- the usual body, proven by simdjson -----------------------------------------------------


# Arrays in a body of n images: the instances list, each image, each image's rows.
def _arrays_in_rows(n: int) -> int:
    return 1 + n * (1 + IMAGE_HEIGHT)


def image_rows(body: bytes, max_images: int, extra_key: str | None = None):
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
    if body.count(b"[") < _arrays_in_rows(1):
        return None  # not even one image's brackets: no parse (a tabular row's body, say)
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
    except json_body.SIMDJSON_ERRORS:
        return None
    return instances, extra


# --- any image model's pixel arrays ---------------------------------------------------------


def pixel_array(value: Any, image: ImageInput, where: str) -> np.ndarray:
    """One JSON instance of pixels of the model's shape as model input: integers 0-255 are
    scaled, floats must be in [0, 1] (artifact.contract.pixels_to_input, the rule of the
    image contract's /predict).

    Raises:
        BadInput: not an array of numbers of the instance's shape, or pixels out of range.
    """
    shape = "x".join(map(str, image.shape))
    expected = (
        f"expected a {shape} array of pixels (integers 0-255 or floats in [0, 1]) or "
        '{"b64": "<base64 image file>"}'
    )
    try:
        array = np.array(value) if isinstance(value, list) else None
    except (ValueError, TypeError, OverflowError, RecursionError):
        array = None
    if array is None or array.dtype.kind not in "iuf" or array.shape != image.shape:
        if not isinstance(value, list):
            got = kind_of(value)
        elif array is None or array.dtype.kind not in "iufb":
            got = "a ragged list, or one holding more than numbers"
        else:
            got = f"shape {'x'.join(map(str, array.shape))}"
        raise BadInput(f"{where}: {expected}, got {got}")
    boolean = first_boolean(value)
    if boolean is not None:
        raise BadInput(f"{where}{path_text(boolean)}: expected a number, got a boolean")
    try:
        return pixels_to_input(array[np.newaxis])[0]
    except PixelError as err:
        raise BadInput(f"{where}: {err.problem}") from err
