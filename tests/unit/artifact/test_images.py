"""Image files to the 28x28 pixels the model sees (Pillow only)."""

from __future__ import annotations

import numpy as np
import pytest
from support.helpers import png_bytes

from artifact.images import ImageError, image_to_pixels


def test_a_28x28_light_on_dark_image_is_taken_as_it_is():
    pixels = np.zeros((28, 28), np.uint8)
    pixels[10:18, 10:18] = 200
    np.testing.assert_array_equal(image_to_pixels(png_bytes(pixels)), pixels)


def test_a_dark_on_light_photo_is_inverted_scaled_and_centred():
    photo = np.full((200, 100, 3), 255, np.uint8)  # white paper, portrait
    photo[50:150, 25:75] = 0  # a dark item
    pixels = image_to_pixels(png_bytes(photo, "JPEG"))
    assert pixels.shape == (28, 28)
    # Inverted: the item is light, the background dark; the width is centred.
    assert pixels[14, 14] > 200 and pixels[0, 0] < 30
    assert pixels[:, :7].max() < 30 and pixels[:, -7:].max() < 30


def test_invert_can_be_forced_either_way():
    light = np.full((28, 28), 250, np.uint8)
    assert image_to_pixels(png_bytes(light), invert="no").mean() > 200
    assert image_to_pixels(png_bytes(light), invert="yes").mean() < 10


@pytest.mark.parametrize(
    "data, message",
    [
        pytest.param(b"plain text", "not an image file", id="text"),
        pytest.param(png_bytes(np.zeros((28, 28), np.uint8))[:40], "not an image file", id="truncated"),
        pytest.param(png_bytes(np.zeros((5000, 5000), np.uint8)), "image is too large: 25.0 megapixels", id="too-large"),
    ],
)  # fmt: skip
def test_what_is_not_a_usable_image(data, message):
    with pytest.raises(ImageError, match=message):
        image_to_pixels(data)
