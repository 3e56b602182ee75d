"""Image files (PNG, JPEG and the other formats artifact/images.py allows) to numpy, within the
request's budget of pixels (MAX_REQUEST_PIXELS) and the process's (MAX_PIXELS_IN_FLIGHT).

Every file is sized from its header before any is decoded: a small file that would decode to
gigapixels is refused at its header. Decoding runs on a worker thread (the callers' rule);
a request whose client left stops between files (`Cancelled`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from artifact.contract import normalize_pixels
from artifact.images import (
    MNIST_INPUT,
    ImageError,
    ImageInput,
    image_to_input,
    image_to_pixels,
    open_image,
)
from service.budgets import UNBOUNDED_PIXELS, PixelBudget
from service.errors import BadInput, PayloadTooLarge

# (where, the file's bytes): where names the file in messages ("files[0] (cat.png)").
Files = list[tuple[str, bytes]]


class Cancelled(Exception):
    """The request that asked for the decoding is gone: the rest is not decoded."""


def check_pixel_budget(files: Files, budget: int) -> int:
    """Size every image file from its header (nothing decoded) and refuse the request when
    they would decode to more than `budget` pixels together (MAX_REQUEST_PIXELS); the
    pixels they decode to.

    Raises:
        BadInput: a file is not an image in an accepted format, or is too large by itself.
        PayloadTooLarge: over the budget.
    """
    total = 0
    for where, data in files:
        try:
            image = open_image(data)
        except ImageError as err:
            raise BadInput(f"{where}: {err}") from err
        total += image.width * image.height
    if total > budget:
        raise PayloadTooLarge(
            f"the request's images would decode to {total / 1e6:.1f} megapixels; the limit "
            f"is {budget / 1e6:g} per request (MAX_REQUEST_PIXELS)"
        )
    return total


def decode_files(
    files: Files,
    decode: Callable[[bytes, str], np.ndarray],
    pixel_budget: int,
    cancelled: threading.Event | None = None,
    in_flight: PixelBudget = UNBOUNDED_PIXELS,
) -> np.ndarray:
    """Image files, each decoded by `decode(data, where)`, stacked: within the request's
    pixel budget (checked from the headers first) and the process's (`in_flight`, held
    while they decode).

    Raises:
        BadInput: a file that is not an image (named by its `where`).
        PayloadTooLarge: over the budget.
        PixelsInFlight: `in_flight` has no room for them now.
        Cancelled: `cancelled` was set before the last file was decoded.
    """
    with in_flight.hold(check_pixel_budget(files, pixel_budget)):
        decoded = []
        for where, data in files:
            if cancelled is not None and cancelled.is_set():
                raise Cancelled
            decoded.append(decode(data, where))
        return np.stack(decoded)


def image_file_pixels(data: bytes, where: str, invert: str) -> np.ndarray:
    """An image file's bytes to the image contract's uint8 [28, 28], prepared as
    Fashion-MNIST was; BadInput when it is not an image."""
    try:
        return image_to_pixels(data, invert)
    except ImageError as err:
        raise BadInput(f"{where}: {err}") from err


def image_file_input(data: bytes, where: str, image: ImageInput, invert: str) -> np.ndarray:
    """An image file's bytes as one instance of a model's image input, prepared as its
    training data was (artifact.images.image_to_input); BadInput when it is not an image."""
    try:
        return image_to_input(data, image, invert)
    except ImageError as err:
        raise BadInput(f"{where}: {err}") from err


def decode_image_files(
    files: Files,
    invert: str,
    pixel_budget: int,
    cancelled: threading.Event | None = None,
    in_flight: PixelBudget = UNBOUNDED_PIXELS,
) -> np.ndarray:
    """Image files to the image contract's uint8 [n, 28, 28] (decode_files' budgets and
    errors)."""
    return decode_files(
        files, lambda data, where: image_file_pixels(data, where, invert), pixel_budget,
        cancelled, in_flight,
    )  # fmt: skip


def decode_image_inputs(
    files: Files,
    image: ImageInput,
    invert: str,
    pixel_budget: int,
    cancelled: threading.Event | None = None,
    in_flight: PixelBudget = UNBOUNDED_PIXELS,
) -> np.ndarray:
    """Image files as a model's image input [n, ...] in [0, 1] (decode_files' budgets and
    errors). The image contract's go through its uint8 pixels (decode_image_files, what
    feedback stores), scaled after: the values image_to_input gives."""
    if image == MNIST_INPUT:
        return normalize_pixels(
            decode_image_files(files, invert, pixel_budget, cancelled, in_flight=in_flight)
        )
    return decode_files(
        files, lambda data, where: image_file_input(data, where, image, invert), pixel_budget,
        cancelled, in_flight,
    )  # fmt: skip


def files_input(files: Files) -> np.ndarray:
    """The files' bytes as a string input [n], unchanged (a model that decodes its images)."""
    array = np.empty(len(files), dtype=object)
    array[:] = [data for _, data in files]
    return array
