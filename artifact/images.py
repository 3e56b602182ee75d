"""Image files to 28x28 grayscale pixels the way Fashion-MNIST was made.

Fashion-MNIST's images are light objects on a dark background, trimmed, their longest side
scaled to 28 pixels and centred. A photo of a dark object on a light background is inverted
first (`invert="auto"` decides from the border), so a product shot on white works.

Only a few well-trodden formats are decoded (`IMAGE_FORMATS`): Pillow would otherwise try
every plugin it has on bytes from the network, TIFF and EPS (which starts Ghostscript where
it is installed) among them. The size is checked from the header, before any pixel is
decoded, against `MAX_PIXELS`.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from artifact.contract import IMAGE_HEIGHT, IMAGE_WIDTH

# Pillow's names of the formats decoded; a file in any other is refused unopened.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
# A large phone photo; the result is 28x28 anyway. Bounds what a small compressed file (a
# decompression bomb) may expand to.
MAX_PIXELS = 24_000_000
INVERT_MODES = ("auto", "yes", "no")


class ImageError(ValueError):
    """The bytes are not an image in an accepted format, or it is too large to decode."""


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


def image_to_pixels(data: bytes, invert: str = "auto") -> np.ndarray:
    """Decode an image file's bytes into uint8 [28, 28] grayscale, light object on dark.

    Args:
        data: the file's bytes (one of IMAGE_FORMATS).
        invert: 'auto' inverts when the border is mostly light; 'yes' or 'no' force it.
    Raises:
        ImageError: not a readable image in an accepted format, or over MAX_PIXELS.
    """
    if invert not in INVERT_MODES:
        raise ValueError(f"invert must be one of {INVERT_MODES}, got {invert!r}")
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
        pixels = 255 - pixels
    if pixels.shape == (IMAGE_HEIGHT, IMAGE_WIDTH):
        return pixels
    # Longest side to 28 keeping the aspect ratio, centred on the dark background.
    gray = Image.fromarray(pixels)
    scale = min(IMAGE_WIDTH / gray.width, IMAGE_HEIGHT / gray.height)
    size = (max(1, round(gray.width * scale)), max(1, round(gray.height * scale)))
    resized = gray.resize(size, Image.LANCZOS)
    canvas = Image.new("L", (IMAGE_WIDTH, IMAGE_HEIGHT), 0)
    canvas.paste(resized, ((IMAGE_WIDTH - size[0]) // 2, (IMAGE_HEIGHT - size[1]) // 2))
    return np.asarray(canvas, dtype=np.uint8)
