"""JSON values as elements of numpy dtypes, and the words every reader uses for what does not
fit: TF Serving's where it has its own (util/json_tensor.cc), else where in the body, what was
expected and what came.

Nothing here recurses: a hostile body may nest a thousand levels deep.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np
import orjson

from service.codecs.dtypes import INT_RANGES, dtype_name
from service.errors import BadInput

# JSON's types as TF Serving's messages name them (json_tensor.cc, TypeError).
_JSON_TYPES = {str: "String", dict: "Object", list: "Array", type(None): "Null"}


# --- what a value is ----------------------------------------------------------------------


def is_number(value: Any) -> bool:
    """A JSON number (true and false are not numbers, though Python's bool is an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_integer(value: Any) -> bool:
    """A JSON integer (not true or false)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_b64(value: Any) -> bool:
    """TF Serving's binary convention: an object whose one key is `b64`."""
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


def first_boolean(value: Any, depth: int | None = None) -> tuple[int, ...] | None:
    """The index path of the first true or false among nested lists, depth first (numpy
    would read it as 1 or 0); with `depth`, only one that many lists deep. None: none."""
    if not isinstance(value, list):
        return () if isinstance(value, bool) and not depth else None
    path: list[int] = []
    stack = [iter(enumerate(value))]
    while stack:
        for k, item in stack[-1]:
            level = len(path) + 1
            if isinstance(item, bool):
                if depth is None or level == depth:
                    return (*path, k)
            elif isinstance(item, list) and (depth is None or level < depth):
                path.append(k)
                stack.append(iter(enumerate(item)))
                break
        else:
            stack.pop()
            if path:
                path.pop()
    return None


def may_hold_booleans(text: bytes) -> bool:
    """Whether JSON text may hold true/false: the cheap test before the exact one. Every
    `true` has an "r" and every `false` an "l"; numbers and the usual `{"instances": ...}`
    have neither. One-byte searches are memchr: 0.2 us for a 28x28 body, where searching
    for "true" takes 4.6 us."""
    return b"l" in text or b"r" in text


# --- words --------------------------------------------------------------------------------


def path_text(index: tuple[int, ...]) -> str:
    """An index path as it is written after a field's name: "[0][3]"."""
    return "".join(f"[{k}]" for k in index)


def shape_text(shape) -> str:
    """A shape as TF Serving writes it: "[2,28,28]"."""
    return f"[{','.join(str(d) for d in shape)}]"


def json_text(value: Any) -> str:
    """A value as JSON, cut at 40 characters, for messages."""
    try:
        text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS, default=str).decode()
    except orjson.JSONEncodeError:  # nested past orjson's depth
        text = "..."
    return text if len(text) <= 40 else text[:40] + "..."


def text_of(item: Any) -> str:
    """A string tensor's element as text: bytes as UTF-8 (what is not, replaced), anything
    else as str()."""
    return item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item)


def python_text(value: Any) -> str:
    """A value for a message: its type, and its text when that is short and flat
    ("str 'abc'", "a list")."""
    if isinstance(value, (list, dict)):
        return f"a {type(value).__name__}"  # its text could nest a thousand levels deep
    return f"{type(value).__name__} {str(value)[:40]!r}"


def kind_of(value: Any) -> str:
    """What a JSON value is, in a person's words ("the string 'abc'", "a list of 3")."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:40] + "..."
        return f"the string {text!r}"
    if value is None:
        return "null"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return f"an object with {sorted(value)[:5]}"
    return type(value).__name__


def type_error(value: Any, dtype: np.dtype | str | None) -> str:
    """TF Serving's words for a JSON value of the wrong type (json_tensor.cc, TypeError).

    Args:
        dtype: what was expected: a numpy dtype (named as TensorFlow names it) or the name.
    """
    if isinstance(value, bool):
        kind = "True" if value else "False"
    else:
        kind = _JSON_TYPES.get(type(value), "Number")
    expected = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return f"JSON Value: {json_text(value)} Type: {kind} is not of expected type: {expected}"


# --- base64 -------------------------------------------------------------------------------


def b64_decode(text: str) -> bytes:
    """Strict base64 (RFC 4648: no characters outside the alphabet).

    Raises:
        binascii.Error: not base64.
    """
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:
        raise
    except ValueError as err:  # text outside ASCII
        raise binascii.Error(str(err)) from err


def b64_file(text: str, where: str) -> bytes:
    """A `{"b64": ...}` value's bytes; BadInput naming where it is when it is not base64."""
    try:
        return b64_decode(text)
    except binascii.Error as err:
        raise BadInput(f"{where}.b64: not valid base64 ({err})") from err


# --- one JSON value as an element of a dtype ----------------------------------------------

# Why a value does not fit (Misfit.reason).
WRONG_TYPE, OUT_OF_RANGE, NOT_WHOLE, TOO_LARGE, NOT_BASE64 = (
    "type", "range", "fraction", "overflow", "base64",
)  # fmt: skip


class Misfit(Exception):
    """A JSON value its dtype cannot hold.

    Attributes:
        reason: WRONG_TYPE, OUT_OF_RANGE, NOT_WHOLE, TOO_LARGE or NOT_BASE64.
        value: the value refused (a `{"b64": ...}` object's text, when that is what is wrong).
        suffix: where it is below the value given (".b64"), or "".
        detail: the base64 decoder's words, for NOT_BASE64.
    """

    def __init__(self, reason: str, value: Any, suffix: str = "", detail: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.value = value
        self.suffix = suffix
        self.detail = detail


def element(value: Any, dtype: np.dtype, lenient: bool = False) -> Any:
    """One JSON value as an element of `dtype`: strings (UTF-8) or `{"b64": ...}` for strings,
    true/false for booleans, integers in range for integer types, numbers for floats.

    Args:
        lenient: a person's rules (the friendly /predict): a whole float is an integer, and
            a float must be finite in its dtype. Without it, TF Serving's: an integer type
            takes only integers, and a float past its dtype's range becomes inf when cast.
    Raises:
        Misfit: it does not fit.
    """
    kind = dtype.kind
    if kind == "O":
        if isinstance(value, str):
            return value.encode("utf-8")
        if is_b64(value):
            text = value["b64"]
            if not isinstance(text, str):
                raise Misfit(WRONG_TYPE, text, ".b64")
            try:
                return b64_decode(text)
            except binascii.Error as err:
                raise Misfit(NOT_BASE64, text, ".b64", str(err)) from err
        raise Misfit(WRONG_TYPE, value)
    if kind == "b":
        if isinstance(value, bool):
            return value
        raise Misfit(WRONG_TYPE, value)
    if not is_number(value):
        raise Misfit(WRONG_TYPE, value)
    if kind in "iu":
        if isinstance(value, float):
            if not lenient:
                raise Misfit(WRONG_TYPE, value)
            if not value.is_integer():
                raise Misfit(NOT_WHOLE, value)
            value = int(value)
        low, high = INT_RANGES[dtype.type]
        if not low <= value <= high:
            raise Misfit(OUT_OF_RANGE, value)
        return value
    if lenient:
        with np.errstate(over="ignore"):
            if not np.isfinite(dtype.type(value)):
                raise Misfit(TOO_LARGE, value)
    return value


def tf_words(misfit: Misfit, dtype: np.dtype) -> str:
    """A Misfit in TF Serving's words (json_tensor.cc): a type error, or base64 it cannot
    decode (an integer out of its type's range is a type error there too)."""
    if misfit.reason == NOT_BASE64:
        return f"Unable to base64 decode ({misfit.detail})"
    return type_error(misfit.value, dtype)


def plain_words(misfit: Misfit, value: Any, dtype: np.dtype, where: str) -> str:
    """A Misfit in a person's words: where, what was expected and what came.

    Args:
        value: the value given (what came, when its type is wrong).
    """
    kind = dtype.kind
    if misfit.reason == NOT_BASE64:
        return f"{where}.b64: not valid base64 ({misfit.detail})"
    if misfit.reason == OUT_OF_RANGE:
        low, high = INT_RANGES[dtype.type]
        return f"{where}: {misfit.value} does not fit {dtype} ({low} to {high})"
    if misfit.reason == TOO_LARGE:
        return f"{where}: {misfit.value!r} is too large for {dtype}"
    if kind == "O":
        return f"{where}: expected a string, got {kind_of(value)}"
    if kind == "b":
        return f"{where}: expected a boolean (true or false), got {kind_of(value)}"
    expected = "an integer" if kind in "iu" else "a number"
    return f"{where}: expected {expected} ({dtype}), got {kind_of(value)}"
