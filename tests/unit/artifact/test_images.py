"""Image files to what image models take (Pillow and numpy only): Fashion-MNIST's centred
28x28 grayscale, and the image folder's resizing, held to TensorFlow's numbers."""

from __future__ import annotations

import numpy as np
import pytest
from support.helpers import png_bytes

from artifact.images import (
    MNIST_INPUT,
    ImageError,
    ImageInput,
    decode_channels,
    image_to_input,
    image_to_pixels,
    input_to_pixels,
    resize_bilinear,
)

RNG = np.random.default_rng(0)


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


def test_the_28x28_preparation_takes_any_size():
    photo = np.full((20, 40), 255, np.uint8)
    photo[5:15, 10:30] = 0
    pixels = image_to_pixels(png_bytes(photo), height=16, width=48)
    assert pixels.shape == (16, 48)
    # Inverted, its width scaled to 48 (the limiting side here is the height: 40/20 < 48/16),
    # centred: dark margins left and right.
    assert pixels[8, 24] > 200 and pixels[:, :6].max() < 30 and pixels[:, -6:].max() < 30


@pytest.mark.parametrize(
    "shape, image",
    [
        pytest.param((-1, 28, 28), ImageInput(28, 28), id="fashion-mnist"),
        pytest.param((-1, 20, 40), ImageInput(20, 40), id="other-size"),
        pytest.param((-1, 32, 32, 3), ImageInput(32, 32, 3, channel_axis=True), id="rgb"),
        pytest.param((-1, 64, 48, 1), ImageInput(64, 48, 1, channel_axis=True), id="one-channel"),
        pytest.param((-1, 32, 32, 4), None, id="four-channels"),
        pytest.param((-1, -1, 32, 3), None, id="unknown-height"),
        pytest.param((3, 32, 32, 3), None, id="no-batch-dimension"),
        pytest.param((-1, 32), None, id="a-vector"),
        pytest.param(None, None, id="unknown-rank"),
    ],
)
def test_which_inputs_are_images(shape, image):
    assert ImageInput.of_shape(shape) == image
    if image is not None:
        assert (-1, *image.shape) == shape


def test_resizing_is_tensorflows_bilinear_with_half_pixel_centres():
    # tf.image.resize([[0, 1], [2, 3]], [4, 4]) computed by TensorFlow 2.15.
    want = [
        [0.0, 0.25, 0.75, 1.0],
        [0.5, 0.75, 1.25, 1.5],
        [1.5, 1.75, 2.25, 2.5],
        [2.0, 2.25, 2.75, 3.0],
    ]
    got = resize_bilinear(np.array([[0, 1], [2, 3]], np.uint8)[..., np.newaxis], 4, 4)
    assert got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_array_equal(got[..., 0], want)
    pixels = RNG.integers(0, 256, (7, 5, 3)).astype(np.uint8)
    np.testing.assert_array_equal(resize_bilinear(pixels, 7, 5), pixels)  # its own size: as is
    assert (resize_bilinear(pixels[:1, :1], 3, 2) == pixels[0, 0]).all()


def test_colour_to_gray_takes_libpngs_weights_as_tensorflow_does():
    # tf.io.decode_png(..., channels=1) of these pixels gives 175, 204 and 228, where Pillow's
    # convert("L") and other roundings of the same weights give 176, 205 or 229.
    rgb = np.array([[[198, 185, 72], [233, 209, 111], [249, 226, 192]]], np.uint8)
    assert decode_channels(png_bytes(rgb), 1)[..., 0].tolist() == [[175, 204, 228]]
    gray = np.array([[0, 90, 255]], np.uint8)
    np.testing.assert_array_equal(
        decode_channels(png_bytes(gray), 3), np.repeat(gray[..., None], 3, 2)
    )


def test_alpha_is_dropped_not_composited_as_tensorflow_decodes():
    rgba = np.array([[[10, 20, 30, 0], [200, 100, 50, 255]]], np.uint8)
    data = png_bytes(rgba)
    np.testing.assert_array_equal(decode_channels(data, 3), rgba[..., :3])


def test_a_resized_input_is_scaled_to_0_1_and_not_inverted_unless_asked():
    pixels = np.array([[0, 51], [102, 255]], np.uint8)
    image = ImageInput(4, 4, 1, channel_axis=True)
    got = image_to_input(png_bytes(pixels), image)
    assert got.shape == (4, 4, 1) and got.dtype == np.float32
    want = resize_bilinear(pixels[..., np.newaxis], 4, 4) / np.float32(255)
    np.testing.assert_array_equal(got, want)
    light = np.full((8, 8), 250, np.uint8)
    assert image_to_input(png_bytes(light), image).mean() > 0.9  # auto: as it is
    assert image_to_input(png_bytes(light), image, invert="yes").mean() < 0.1


def test_a_centred_input_is_the_28x28_preparation_scaled():
    photo = RNG.integers(0, 256, (30, 50)).astype(np.uint8)
    data = png_bytes(photo)
    np.testing.assert_array_equal(
        image_to_input(data, MNIST_INPUT), image_to_pixels(data).astype(np.float32) / 255
    )
    np.testing.assert_array_equal(
        input_to_pixels(image_to_input(data, MNIST_INPUT)), image_to_pixels(data)
    )
