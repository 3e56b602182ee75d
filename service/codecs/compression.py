"""Compressed request bodies (Content-Encoding: gzip, deflate), decompressed a piece at a time
within the body limit and the process's budget of bodies in flight: a small body that would
expand to gigabytes costs no more than the limit.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

from service.errors import BadInput, PayloadTooLarge

# Content-Encoding -> zlib's wbits: gzip's format; deflate is the zlib format (RFC 9110, 8.4.1.2),
# what tritonclient's request_compression_algorithm="deflate" sends (zlib.compress).
COMPRESSED = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
# A compressed body is decompressed a piece at a time, each reserved first.
DECOMPRESS_CHUNK_BYTES = 256 * 1024


def _no_budget(count: int) -> None:
    """decompress_body without a budget to reserve from (a caller outside a request)."""


def decompress_body(
    body: bytes, encoding: str | None, limit: int, reserve: Callable[[int], None] = _no_budget
) -> bytes:
    """A body as its Content-Encoding (gzip, deflate or identity) says to read it, within
    `limit` bytes once decompressed: decompressed incrementally, so a body that would expand
    past the limit costs no more than the limit in memory.

    Args:
        reserve: `reserve(n)` for n more bytes kept, from the process's budget of bodies in
            flight (a Call's `reserve`), a piece (DECOMPRESS_CHUNK_BYTES at most) at a time;
            the pieces and the whole they are joined into are counted both, since both exist
            for a moment.

    Raises:
        PayloadTooLarge: more than `limit` bytes decompressed (MAX_BODY_BYTES).
        BadInput: an encoding other than these, or a body that is not what it says.
        BodiesInFlight: `reserve` found no room (503).
    """
    name = (encoding or "identity").strip().lower()
    if name == "identity":
        return body
    if name not in COMPRESSED:
        raise BadInput(
            f"Content-Encoding {name!r:.40} is not supported; send gzip, deflate or identity"
        )
    stream = zlib.decompressobj(COMPRESSED[name])
    pieces: list[bytes] = []
    size = 0
    pending = body
    while True:
        # At most one piece is held before it is counted.
        room = min(DECOMPRESS_CHUNK_BYTES, limit + 1 - size)
        try:
            piece = stream.decompress(pending, room)
        except zlib.error as err:
            raise BadInput(f"the body is not valid {name} data (Content-Encoding): {err}") from err
        reserve(len(piece))
        pieces.append(piece)
        size += len(piece)
        pending = stream.unconsumed_tail
        if size > limit:
            raise PayloadTooLarge(
                f"the {name} body is over {limit} bytes decompressed; the limit is {limit} "
                "bytes (MAX_BODY_BYTES)"
            )
        if stream.eof or not pending:
            break
    reserve(size)
    data = b"".join(pieces)
    del pieces
    if not stream.eof:
        raise BadInput(f"the {name} body ends before its compressed data does (truncated?)")
    if stream.unused_data:
        raise BadInput(
            f"the {name} body has {len(stream.unused_data)} bytes after its compressed data"
        )
    return data
