"""What the HTTP adapters share: JSON answers, bounded bodies, versions in URLs, waits that
end when the client leaves, and the prediction call every server path hands its handler."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.convertors import Convertor, register_url_convertor
from starlette.datastructures import FormData, Headers, QueryParams, UploadFile
from starlette.requests import Request
from starlette.responses import Response

from artifact.contract import to_json
from artifact.repository import parse_version
from service.errors import (
    BadInput,
    ClientClosedRequest,
    PayloadTooLarge,
    RequestTimeout,
    check_image_count,
    check_label_name,
)

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


async def read_body(request: Request, limit: int, timeout: float = 30.0) -> bytes:
    """The whole body, refusing more than `limit` bytes (MAX_BODY_BYTES) before reading it all.

    Raises:
        PayloadTooLarge: over the limit (413).
        RequestTimeout: the body took longer than `timeout` seconds (BODY_TIMEOUT_SECONDS).
        ClientClosedRequest: the client hung up before sending it all (499: not a 5xx).
    """
    declared = request.headers.get("content-length")
    # Past 18 digits it is over any limit (and int() refuses past 4,300).
    if declared and declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        raise PayloadTooLarge(
            f"request body is {declared} bytes; the limit is {limit} bytes (MAX_BODY_BYTES)"
        )
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout):
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    raise ClientClosedRequest("the client disconnected while sending the body")
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(
                        f"request body exceeds the limit of {limit} bytes (MAX_BODY_BYTES)"
                    )
                if not message.get("more_body", False):
                    # Mostly the whole body came in one message: no join, no copy.
                    return b"".join((*chunks, chunk)) if chunks else chunk
                chunks.append(chunk)
    except TimeoutError as err:
        raise body_too_slow(timeout, size) from err


def body_too_slow(timeout: float, size: int) -> RequestTimeout:
    """The error for a body that did not all come within `timeout` seconds."""
    return RequestTimeout(
        f"the request body did not arrive within {timeout:g} s (BODY_TIMEOUT_SECONDS); "
        f"{size} bytes came"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """A prediction request as its handler sees it: the body, read whole and within the
    limits, the headers and the query. The handler is the same whether the request came
    through the ASGI app (serve_call) or was read by the server's protocol itself
    (service/directlane.py); a client that leaves cancels the handler's task either way."""

    body: bytes
    headers: Headers
    query: QueryParams


CallHandler = Callable[..., Awaitable[Response]]


async def serve_call(
    request: Request,
    handler: CallHandler,
    params: dict[str, Any],
    limit: int,
    timeout: float,
    admit: Callable[[], None],
) -> Response:
    """A prediction route over ASGI: refused at once when the queue is full (`admit`), the
    body read within `limit` bytes and `timeout` seconds, then `handler(call, **params)`,
    cancelled if the client leaves first.

    Raises:
        ServiceError: as read_body, admit and the handler raise them.
    """
    admit()
    body = await read_body(request, limit, timeout)
    call = Call(body, request.headers, request.query_params)
    return await unless_disconnected(request, handler(call, **params))


def form_request(call: Call) -> Request:
    """A request that replays a call's body, for Starlette's multipart parser."""

    async def gone():
        return {"type": "http.disconnect"}

    return with_body(Request({"type": "http", "headers": call.headers.raw}, gone), call.body)


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


async def image_form(
    request: Request, max_images: int, max_part_bytes: int
) -> tuple[FormData, list[UploadFile]]:
    """A multipart body's form and its uploaded files: at least one, and no more than
    max_images (the form stops being parsed one file past it, so a flood of parts costs
    nothing more).

    Raises:
        PayloadTooLarge: more than max_images files (MAX_IMAGES).
        BadInput: a malformed multipart body, or one with no file.
    """
    try:
        form = await request.form(max_files=max_images + 1, max_part_size=max_part_bytes)
    except Exception as err:  # multipart's parser raises several types for malformed bodies
        detail = str(getattr(err, "detail", err))
        if detail.startswith("Too many files"):
            # Starlette stops parsing at max_files: more than MAX_IMAGES + 1 files land here.
            raise PayloadTooLarge(
                f"request has more than {max_images + 1} images; the limit is {max_images} "
                "per request (MAX_IMAGES)"
            ) from err
        raise BadInput(f"malformed multipart body: {detail}") from err
    uploads = [value for _, value in form.multi_items() if isinstance(value, UploadFile)]
    if not uploads:
        raise BadInput("multipart body has no file; send one or more images as 'files'")
    check_image_count(len(uploads), max_images)
    return form, uploads
