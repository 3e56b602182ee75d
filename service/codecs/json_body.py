"""JSON text to Python values: orjson for any body, in TF Serving's words when it is not JSON;
simdjson for the usual image bodies, read straight into numpy (service/codecs/pixels.py).

orjson and simdjson refuse nesting past 1,024 levels (and Python's json, which reads NaN and
Infinity, past its recursion limit): a body nested deeper is a 400, never a RecursionError.
Every reader after them walks the values it gets without recursion.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson

from service.errors import BadInput


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


# --- simdjson: the usual bodies, straight into numpy ----------------------------------------

# What simdjson raises for a body it cannot read or a value of another type.
SIMDJSON_ERRORS = (ValueError, TypeError, RuntimeError, KeyError, OverflowError)


def buffer(array, of_type: str, dtype) -> np.ndarray | None:
    """A simdjson array's numbers, flattened, as numpy; None when they are not all of_type
    ("d" doubles, "i" int64, "u" uint64)."""
    try:
        return np.frombuffer(array.as_buffer(of_type=of_type), dtype=dtype)
    except SIMDJSON_ERRORS:
        return None


def numbers(array) -> np.ndarray | None:
    """A simdjson array's numbers, flattened, as numpy reads the same lists: int64 when all
    are integers within int64, float64 when any is a float (every number rounded once, as
    numpy rounds); None when integers past int64 come without a float, which numpy reads by
    rules of its own (uint64, or float64 when mixed): the general path decides."""
    flat = buffer(array, "i", np.int64)
    if flat is not None:
        return flat
    if buffer(array, "u", np.uint64) is not None:
        return None
    return buffer(array, "d", np.float64)
