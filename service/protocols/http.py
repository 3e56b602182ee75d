"""What the HTTP adapters share: JSON answers, bounded bodies, versions in URLs, and waits
that end when the client leaves."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import Response

from artifact.contract import to_json
from artifact.repository import parse_version
from service.errors import BadInput, ClientClosedRequest, PayloadTooLarge
from service.registry import check_label_name

JSON = "application/json"
T = TypeVar("T")


class NameConvertor(Convertor):
    """A model name or a version label in a URL: TF Serving's `[^/:]+`, so that
    `/v1/models/m:predict` never reads as a model named `m:predict`."""

    regex = "[^/:]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


# Routes write {name:name} and {label:name}.
register_url_convertor("name", NameConvertor())


def json_response(content: Any, status_code: int = 200) -> Response:
    """A JSON answer encoded by the one encoder (numpy values go straight through)."""
    return Response(to_json(content), status_code=status_code, media_type=JSON)


def version_in_url(text: str | None) -> int | None:
    """A version from a URL segment; BadInput unless it is an int64 in ASCII digits."""
    if text is None:
        return None
    version = parse_version(text)
    if version is None:
        if text.isascii() and text.isdigit():
            raise BadInput(f"Malformed request: version {text[:30]}... is out of range (int64)")
        raise BadInput(f"Malformed request: version must be a non-negative integer, got {text!r}")
    return version


def label_in_url(text: str | None) -> str | None:
    """A version label from a URL segment; BadInput unless it is TF Serving's [a-zA-Z0-9_]+."""
    if text is not None:
        check_label_name(text)
    return text


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing more than `limit` bytes (MAX_BODY_BYTES) before reading it all."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(
            f"request body is {declared} bytes; the limit is {limit} bytes (MAX_BODY_BYTES)"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(
                f"request body exceeds the limit of {limit} bytes (MAX_BODY_BYTES)"
            )
        chunks.append(chunk)
    return b"".join(chunks)


def with_body(request: Request, body: bytes) -> Request:
    """A request that replays a body already read (so request.form() can parse it), then
    hears the client's disconnect as the original would."""
    replayed = False

    async def receive():
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await request.receive()

    return Request(request.scope, receive)


async def _wait_for_disconnect(request: Request) -> None:
    # The body is fully read by now, so the next message can only be the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client disconnects first (frees its batch slot).

    Raises:
        ClientClosedRequest: the client left before the work was done.
    """
    handler = asyncio.current_task()
    disconnected = False

    def on_disconnect(watcher: asyncio.Task) -> None:
        nonlocal disconnected
        if not watcher.cancelled() and watcher.exception() is None:
            disconnected = True
            handler.cancel()

    # One watcher task and a callback: cheaper on the hot path than racing two tasks.
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    watcher.add_done_callback(on_disconnect)
    try:
        return await work
    except asyncio.CancelledError:
        if disconnected:
            raise ClientClosedRequest(
                "the client disconnected before the prediction was ready"
            ) from None
        raise
    finally:
        watcher.remove_done_callback(on_disconnect)
        watcher.cancel()
