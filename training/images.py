"""Image files (PNG, JPEG, ...) to 28x28 grayscale pixels the way Fashion-MNIST was made.

Fashion-MNIST's images are light objects on a dark background, trimmed, their longest side
scaled to 28 pixels and centred. A photo of a dark object on a light background is inverted
first (`invert="auto"` decides from the border), so a product shot on white works.
"""

from __future__ import annotations

import io
import re
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from training.contract import IMAGE_HEIGHT, IMAGE_WIDTH

# Bounds the pixels a small compressed file may expand to (a decompression bomb): 24 MP is
# a large phone photo; the result is 28x28 anyway. Pillow only warns between 1x and 2x the
# limit; here any image over it is refused (Image.open raises from the header alone).
Image.MAX_IMAGE_PIXELS = 24_000_000
warnings.simplefilter("error", Image.DecompressionBombWarning)
INVERT_MODES = ("auto", "yes", "no")


class ImageError(ValueError):
    """The bytes are not an image Pillow can read, or it is too large to decode."""


def _border_is_light(pixels: np.ndarray) -> bool:
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    return float(border.mean()) > 127.5


def image_to_pixels(data: bytes, invert: str = "auto") -> np.ndarray:
    """Decode an image file's bytes into uint8 [28, 28] grayscale, light object on dark.

    Args:
        data: the file's bytes (PNG, JPEG, or another format Pillow reads).
        invert: 'auto' inverts when the border is mostly light; 'yes' or 'no' force it.
    Raises:
        ImageError: not a readable image, or over Image.MAX_IMAGE_PIXELS.
    """
    if invert not in INVERT_MODES:
        raise ValueError(f"invert must be one of {INVERT_MODES}, got {invert!r}")
    try:
        image = Image.open(io.BytesIO(data))
        image = ImageOps.exif_transpose(image)
        if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
            # Transparent areas become white paper, like the page a drawing is on.
            rgba = image.convert("RGBA")
            background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            image = Image.alpha_composite(background, rgba)
        gray = image.convert("L")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        size = re.search(r"\((\d+) pixels\)", str(err))
        raise ImageError(
            f"image is too large: {int(size[1]) / 1e6:.1f} megapixels, "
            f"{Image.MAX_IMAGE_PIXELS / 1e6:g} at most"
        ) from err
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise ImageError("not an image file Pillow can read (PNG or JPEG expected)") from err

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
