"""tf.Example in its wire format, without TensorFlow or its protos: written for TF Serving's
Classify and Regress (service/examples.py) and the feedback store (artifact/feedback/), read
back by the tests and the store's tools.

tensorflow/core/example/example.proto and feature.proto:

    Example  { Features features = 1; }
    Features { map<string, Feature> feature = 1; }
    Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                            Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }

A feature is written here as (kind, values), kind one of KINDS.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

BYTES, FLOAT, INT64 = "bytes", "float", "int64"
KINDS = (BYTES, FLOAT, INT64)
_KIND_FIELDS = {BYTES: 1, FLOAT: 2, INT64: 3}
_FIELD_KINDS = {number: kind for kind, number in _KIND_FIELDS.items()}


class ExampleFormatError(ValueError):
    """Bytes that are not a tf.Example this module can read."""


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64's two's complement, as protobuf writes negatives
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_feature(kind: str, values: Sequence | np.ndarray) -> bytes:
    """A Feature: bytes_list, float_list or int64_list, numbers packed.

    Args:
        kind: one of KINDS.
        values: bytes strings (bytes), numbers (float: written as float32; int64).
    """
    if kind == BYTES:
        return _field(1, b"".join(_field(1, bytes(v)) for v in values))
    if kind == FLOAT:
        packed = np.asarray(values, "<f4").tobytes()
        return _field(2, _field(1, packed))
    if kind == INT64:
        return _field(3, _field(1, b"".join(_varint(int(v)) for v in values)))
    raise ValueError(f"a feature's kind is one of {', '.join(KINDS)}, got {kind!r}")


def encode_example(features: Mapping[str, tuple[str, Sequence | np.ndarray]]) -> bytes:
    """A serialized tf.Example of features, each (kind, values), in name order."""
    entries = b"".join(
        _field(1, _field(1, name.encode("utf-8")) + _field(2, encode_feature(*value)))
        for name, value in sorted(features.items())
    )
    return _field(1, entries)


# --- reading --------------------------------------------------------------------------------


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ExampleFormatError("a varint is cut short or too long")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of a message's fields: an int for varints, the bytes
    of fixed numbers and length-delimited ones."""
    at = 0
    value: int | bytes
    while at < len(data):
        tag, at = _read_varint(data, at)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, at = _read_varint(data, at)
        elif wire == 1:
            if at + 8 > len(data):
                raise ExampleFormatError("a fixed64 is cut short")
            value, at = data[at : at + 8], at + 8
        elif wire == 2:
            length, at = _read_varint(data, at)
            if at + length > len(data):
                raise ExampleFormatError("a length-delimited field is cut short")
            value, at = data[at : at + length], at + length
        elif wire == 5:
            if at + 4 > len(data):
                raise ExampleFormatError("a fixed32 is cut short")
            value, at = data[at : at + 4], at + 4
        else:
            raise ExampleFormatError(f"wire type {wire} is not one a tf.Example uses")
        yield number, wire, value


def _length_delimited(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(field number, bytes) of a message's length-delimited fields (its sub-messages and
    strings); its other fields are read past."""
    for number, wire, value in _fields(data):
        if wire == 2 and isinstance(value, bytes):
            yield number, value


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _list_values(kind: str, data: bytes) -> list:
    values: list = []
    for number, wire, value in _fields(data):
        if number != 1:
            continue
        if isinstance(value, int):
            if kind != INT64:
                raise ExampleFormatError(f"a {kind}_list holds a field of wire type {wire}")
            values.append(_signed(value))
        elif kind == BYTES and wire == 2:
            values.append(bytes(value))
        elif kind == FLOAT and wire == 2:
            if len(value) % 4:
                raise ExampleFormatError("packed floats of a length not a multiple of 4")
            values.extend(np.frombuffer(value, "<f4").tolist())
        elif kind == FLOAT and wire == 5:
            values.append(struct.unpack("<f", value)[0])
        elif kind == INT64 and wire == 2:
            at = 0
            while at < len(value):
                item, at = _read_varint(value, at)
                values.append(_signed(item))
        else:
            raise ExampleFormatError(f"a {kind}_list holds a field of wire type {wire}")
    return values


def decode_example(data: bytes) -> dict[str, tuple[str, list]]:
    """A serialized tf.Example's features: name -> (kind, values).

    Raises:
        ExampleFormatError: the bytes are not a tf.Example.
    """
    features: dict[str, tuple[str, list]] = {}
    for number, value in _length_delimited(bytes(data)):
        if number != 1:
            continue
        for entry_number, entry in _length_delimited(value):
            if entry_number != 1:
                continue
            name, feature = None, b""
            for part_number, part in _length_delimited(entry):
                if part_number == 1:
                    name = bytes(part).decode("utf-8", errors="replace")
                elif part_number == 2:
                    feature = part
            if name is None:
                raise ExampleFormatError("a feature without a name")
            kind, values = INT64, []  # a Feature with no kind set: an empty list
            for kind_number, listed in _length_delimited(feature):
                if kind_number in _FIELD_KINDS:
                    kind, values = (
                        _FIELD_KINDS[kind_number],
                        _list_values(_FIELD_KINDS[kind_number], listed),
                    )
            features[name] = (kind, values)
    return features
