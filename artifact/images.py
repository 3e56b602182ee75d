"""Image files to what an image model takes, prepared the way its training data was.

Two preparations, one per way the project trains image models; which one a model gets
follows from its input's shape (`ImageInput.of_shape`):

- **centred**, an input without a channel axis (`[-1, H, W]`, Fashion-MNIST's `[-1, 28, 28]`):
  grayscale, as Fashion-MNIST's images were made: light objects on a dark background,
  trimmed, their longest side scaled to the size and centred. A photo of a dark object on a
  light background is inverted first (`invert="auto"` decides from the border), so a product
  shot on white works.
- **resized**, an input with a channel axis (`[-1, H, W, C]`, C 1 or 3: what `python -m
  training train --image-folder` exports): as that training pipeline reads its files
  (training/image_folder.py, `load_image`): decoded to C channels as `tf.io.decode_image`
  does (alpha dropped, gray by libpng's weights), stretched to H x W by `tf.image.resize`'s
  bilinear interpolation (half-pixel centres, no antialiasing), and scaled to [0, 1] by
  artifact.contract's PIXEL_MAX. Written here in numpy, value for value (PNG decodes to the
  same pixels; a JPEG may differ by a few levels where Pillow's libjpeg and TensorFlow's use
  another DCT), so serving needs no TensorFlow op and prepares what training prepared.

Only PNG and JPEG are decoded (`IMAGE_FORMATS`), what the docs promise and what training's
image folders take: Pillow would otherwise try every plugin it has on bytes from the network,
GIF, WebP, BMP, TIFF and EPS (which starts Ghostscript where it is installed) among them.
The size is checked from the header, before any pixel is decoded, against `MAX_PIXELS`.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from artifact.contract import IMAGE_HEIGHT, IMAGE_WIDTH, PIXEL_MAX, normalize_pixels

# Pillow's names of the formats decoded; a file in any other is refused unopened (Pillow
# tries only these formats' plugins).
IMAGE_FORMATS = ("PNG", "JPEG")
# A large phone photo; the result is model-sized anyway. Bounds what a small compressed file
# (a decompression bomb) may expand to.
MAX_PIXELS = 24_000_000
INVERT_MODES = ("auto", "yes", "no")
CHANNELS = (1, 3)
CENTRED, RESIZED = "centred", "resized"
# libpng's RGB-to-gray weights as TensorFlow's PNG decoder sets them (0.299 and 0.587 in
# libpng's fixed point, of 32768, truncated; blue takes the rest), which its decode_png
# applies to colour pixels when asked for one channel.
_GRAY_WEIGHTS = (9797, 19234, 32768 - 9797 - 19234)


class ImageError(ValueError):
    """The bytes are not an image in an accepted format, or it is too large to decode."""


@dataclasses.dataclass(frozen=True)
class ImageInput:
    """What an image model takes per instance, and how a file is prepared for it.

    Attributes:
        height, width: its size in pixels.
        channels: 1 (grayscale) or 3 (RGB).
        channel_axis: [H, W, C] per instance (prepared `resized`), or [H, W] (`centred`).
    """

    height: int
    width: int
    channels: int = 1
    channel_axis: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        """One instance's shape as the model takes it."""
        size = (self.height, self.width)
        return (*size, self.channels) if self.channel_axis else size

    @property
    def preparation(self) -> str:
        return RESIZED if self.channel_axis else CENTRED

    @classmethod
    def of_shape(cls, shape: tuple[int, ...] | None) -> ImageInput | None:
        """The image input a float input of this shape is ([-1, H, W] or [-1, H, W, C] with
        C in 1 or 3, H and W known), or None when it is not one."""
        if shape is None or len(shape) not in (3, 4) or shape[0] != -1:
            return None
        height, width = shape[1], shape[2]
        if height <= 0 or width <= 0:
            return None
        if len(shape) == 3:
            return cls(height, width)
        if shape[3] not in CHANNELS:
            return None
        return cls(height, width, shape[3], channel_axis=True)


# Fashion-MNIST's: float32 [-1, 28, 28], prepared centred.
MNIST_INPUT = ImageInput(IMAGE_HEIGHT, IMAGE_WIDTH)


def _border_is_light(pixels: np.ndarray) -> bool:
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    return float(border.mean()) > 127.5


def open_image(data: bytes) -> Image.Image:
    """Open an image file's header (no pixel decoded yet), checking its format and size.

    Raises:
        ImageError: not an image in IMAGE_FORMATS, or more than MAX_PIXELS pixels.
    """
    try:
        image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
    except Image.DecompressionBombError as err:
        raise ImageError(f"image is too large; {MAX_PIXELS / 1e6:g} megapixels at most") from err
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise ImageError(
            f"not an image file in an accepted format ({', '.join(IMAGE_FORMATS)})"
        ) from err
    if image.width * image.height > MAX_PIXELS:
        raise ImageError(
            f"image is too large: {image.width * image.height / 1e6:.1f} megapixels "
            f"({image.width}x{image.height}), {MAX_PIXELS / 1e6:g} at most"
        )
    return image


def _check_invert(invert: str) -> None:
    if invert not in INVERT_MODES:
        raise ValueError(f"invert must be one of {INVERT_MODES}, got {invert!r}")


def image_to_pixels(
    data: bytes, invert: str = "auto", height: int = IMAGE_HEIGHT, width: int = IMAGE_WIDTH
) -> np.ndarray:
    """Decode an image file's bytes into uint8 [height, width] grayscale, light object on
    dark, prepared `centred` (Fashion-MNIST's 28x28 by default).

    Args:
        data: the file's bytes (one of IMAGE_FORMATS).
        invert: 'auto' inverts when the border is mostly light; 'yes' or 'no' force it.
    Raises:
        ImageError: not a readable image in an accepted format, or over MAX_PIXELS.
    """
    _check_invert(invert)
    image = open_image(data)
    try:
        image = ImageOps.exif_transpose(image)
        if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
            # Transparent areas become white paper, like the page a drawing is on.
            rgba = image.convert("RGBA")
            background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            image = Image.alpha_composite(background, rgba)
        gray = image.convert("L")
    except (OSError, SyntaxError, ValueError) as err:
        raise ImageError(f"the image file is damaged: {err}") from err

    pixels = np.asarray(gray, dtype=np.uint8)
    if invert == "yes" or (invert == "auto" and _border_is_light(pixels)):
        pixels = np.uint8(255) - pixels
    if pixels.shape == (height, width):
        return pixels
    # Longest side to the size keeping the aspect ratio, centred on the dark background.
    gray = Image.fromarray(pixels)
    scale = min(width / gray.width, height / gray.height)
    size = (max(1, round(gray.width * scale)), max(1, round(gray.height * scale)))
    resized = gray.resize(size, Image.Resampling.LANCZOS)
    canvas = Image.new("L", (width, height), 0)
    canvas.paste(resized, ((width - size[0]) // 2, (height - size[1]) // 2))
    return np.asarray(canvas, dtype=np.uint8)


def decode_channels(data: bytes, channels: int) -> np.ndarray:
    """Decode an image file into uint8 [h, w, channels] as `tf.io.decode_image(data,
    channels)` does: alpha dropped (not composited), a palette expanded, colour to gray by
    libpng's weights (a JPEG's gray straight from its decoder), gray to RGB repeated; no
    EXIF rotation.

    Raises:
        ImageError: not a readable image in an accepted format, or over MAX_PIXELS.
        ValueError: channels not 1 or 3.
    """
    if channels not in CHANNELS:
        raise ValueError(f"channels must be one of {CHANNELS}, got {channels}")
    image = open_image(data)
    try:
        if channels == 1 and image.format == "JPEG" and image.mode != "CMYK":
            # libjpeg's own grayscale output, as TensorFlow's JPEG decoder asks for it.
            image.draft("L", image.size)
        if channels == 1 and image.mode in ("L", "LA", "La"):
            return np.asarray(image.convert("L"), dtype=np.uint8)[..., np.newaxis]
        rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)
    except (OSError, SyntaxError, ValueError) as err:
        raise ImageError(f"the image file is damaged: {err}") from err
    if channels == 3:
        return rgb
    red, green, blue = (rgb[..., k].astype(np.uint32) for k in range(3))
    gray = (_GRAY_WEIGHTS[0] * red + _GRAY_WEIGHTS[1] * green + _GRAY_WEIGHTS[2] * blue) >> 15
    return gray.astype(np.uint8)[..., np.newaxis]


def _resize_weights(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TensorFlow's bilinear sampling along one axis (half-pixel centres), in float32 as its
    kernel computes it: the lower and upper source index and the weight of the upper."""
    scale = np.float32(in_size) / np.float32(out_size)
    position = (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    floor = np.floor(position)
    lower = np.maximum(floor, 0).astype(np.intp)
    upper = np.minimum(np.ceil(position), in_size - 1).astype(np.intp)
    return lower, upper, (position - floor).astype(np.float32)


def resize_bilinear(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """float32 [height, width, c] from pixels [h, w, c], as `tf.image.resize(pixels,
    [height, width])` computes it (bilinear, half-pixel centres, no antialiasing)."""
    source = pixels.astype(np.float32)
    rows, rows_below, row_weight = _resize_weights(source.shape[0], height)
    columns, columns_right, column_weight = _resize_weights(source.shape[1], width)
    column_weight = column_weight[np.newaxis, :, np.newaxis]
    top, bottom = source[rows], source[rows_below]
    top = top[:, columns] + (top[:, columns_right] - top[:, columns]) * column_weight
    bottom = bottom[:, columns] + (bottom[:, columns_right] - bottom[:, columns]) * column_weight
    # Indexing along the second axis leaves numpy's result in another memory order.
    return np.ascontiguousarray(top + (bottom - top) * row_weight[:, np.newaxis, np.newaxis])


def image_to_input(data: bytes, image: ImageInput, invert: str = "auto") -> np.ndarray:
    """An image file as one instance of a model's input: float32 of `image.shape` in [0, 1],
    prepared as the model's training data was (see the module's docstring).

    Args:
        invert: 'yes' or 'no' force it; 'auto' inverts a centred image whose border is
            light, never a resized one (its training images were taken as they were).
    Raises:
        ImageError: not a readable image in an accepted format, or over MAX_PIXELS.
    """
    _check_invert(invert)
    if not image.channel_axis:
        return normalize_pixels(image_to_pixels(data, invert, image.height, image.width))
    pixels = decode_channels(data, image.channels)
    if invert == "yes":
        pixels = 255 - pixels
    resized = resize_bilinear(pixels, image.height, image.width)
    return np.clip(resized / np.float32(PIXEL_MAX), 0.0, 1.0)


def input_to_pixels(images: np.ndarray) -> np.ndarray:
    """Model input in [0, 1] as the uint8 pixels a person can look at (0-255, rounded)."""
    return np.rint(images * PIXEL_MAX).astype(np.uint8)
