"""What the HTTP adapters share: JSON answers, versions and labels in URLs, multipart forms,
and the OpenAPI pieces of their bodies."""

from __future__ import annotations

from typing import Any, overload

from starlette.datastructures import FormData, UploadFile
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
from service.routes import Body, Call

JSON = "application/json"
# An OpenAPI schema of uploaded files (multipart form fields).
FILES_SCHEMA = {"type": "array", "items": {"type": "string", "format": "binary"}}


def multipart_form(**properties: dict) -> dict:
    """An OpenAPI media type entry: a multipart form of these fields."""
    return {"schema": {"type": "object", "properties": properties}}


def request_body(schema: dict, example: Any, more: dict[str, dict] | None = None) -> Body:
    """A route's body: JSON of `schema` with its example, then the other media types it
    takes (media type -> its OpenAPI media type object)."""
    return Body(schema, example, more or {})


def json_response(content: Any, status_code: int = 200) -> Response:
    """A JSON answer encoded by the one encoder (numpy values go straight through)."""
    return Response(to_json(content), status_code=status_code, media_type=JSON)


@overload
def version_in_url(text: str) -> int: ...


@overload
def version_in_url(text: None) -> None: ...


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
