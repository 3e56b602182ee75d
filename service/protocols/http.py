"""What the HTTP adapters share: JSON answers, versions and labels in URLs, multipart forms,
and the Call every Call route's handler gets from the door (service/door.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.convertors import Convertor, register_url_convertor
from starlette.datastructures import FormData, Headers, QueryParams, UploadFile
from starlette.requests import Request
from starlette.responses import Response

from artifact.contract import to_json
from artifact.repository import parse_version
from service.errors import (
    BadInput,
    PayloadTooLarge,
    check_image_count,
    check_label_name,
)

JSON = "application/json"
# An OpenAPI schema of uploaded files (multipart form fields).
FILES_SCHEMA = {"type": "array", "items": {"type": "string", "format": "binary"}}


def multipart_form(**properties: dict) -> dict:
    """An OpenAPI media type entry: a multipart form of these fields."""
    return {"schema": {"type": "object", "properties": properties}}


def request_body(schema: dict, example: Any, more: dict[str, dict] | None = None) -> dict:
    """A route's OpenAPI `requestBody`: a required JSON body of `schema` with its example, then
    the other media types it takes (media type -> its entry)."""
    content = {JSON: {"schema": schema, "example": example}, **(more or {})}
    return {"requestBody": {"required": True, "content": content}}


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
            # TF Serving's words (model_servers/http_rest_api_util.cc), then ours.
            raise BadInput(
                f"Failed to convert version: {text[:30]} to numeric.; Malformed request: "
                f"version {text[:30]}... is out of range (int64)"
            )
        raise BadInput(f"Malformed request: version must be a non-negative integer, got {text!r}")
    return version


def label_in_url(text: str | None) -> str | None:
    """A version label from a URL segment; BadInput unless it is TF Serving's [a-zA-Z0-9_]+."""
    if text is not None:
        check_label_name(text)
    return text


def _unbudgeted(count: int) -> None:
    """A Call made outside the door (tests): nothing to reserve from."""


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """A request as its handler sees it: the body, read whole and within the limits by the
    door (service/door.py), the headers and the query. A client that leaves cancels the
    handler's task.

    `reserve(n)` counts n more bytes the handler makes of the body (a decompressed copy) in
    the process's budget of bodies in flight (MAX_BODY_BYTES_IN_FLIGHT), held until the
    request is answered; it raises BodiesInFlight (503) past it. Safe from a worker thread.
    `sender` is who sent it, as the access rules found (service/security.py: its token's
    name, `anonymous` without tokens).
    """

    body: bytes
    headers: Headers
    query: QueryParams
    reserve: Callable[[int], None] = _unbudgeted
    sender: str = "anonymous"


CallHandler = Callable[..., Awaitable[Response]]


@dataclasses.dataclass(frozen=True)
class CallRoute:
    """A route answered by a handler of a Call.

    Args:
        method: the one HTTP method it takes (others get 405).
        path: its template with Starlette's convertors (`/v1/models/{name:name}:predict`).
        handler: `await handler(call, **path_params)` -> Response, its body whole (the
            server's direct transport writes it as bytes, never as a stream); raises
            ServiceError.
        summary, tags, openapi_extra: what the OpenAPI schema says of it.
        before_body: `before_body(path_params, query)`, run before the body is read; raises
            to refuse (Overloaded for a full queue, Forbidden for feedback that is off...).
        query: its query parameters, for the schema: OpenAPI parameter objects.
    """

    method: str
    path: str
    handler: CallHandler
    summary: str
    tags: tuple[str, ...] = ()
    openapi_extra: dict | None = None
    before_body: Callable[[dict[str, Any], QueryParams], None] | None = None
    query: tuple[dict, ...] = ()


def admit_always(call_admit: Callable[[], None]) -> Callable[[dict, QueryParams], None]:
    """A before_body check that ignores the request: `call_admit()` alone (the queue)."""

    def before_body(params: dict, query: QueryParams) -> None:
        call_admit()

    return before_body


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
