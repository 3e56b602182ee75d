"""Write the README's sample request files from Fashion-MNIST's test set.

    python examples/make_examples.py [--data-dir /usr/share/datasets/fashion-mnist]

writes, for one test image (a sneaker, `INDEX`):

- `sneaker.png`: the image as Fashion-MNIST has it, a 28x28 8-bit grayscale PNG, for
  `curl -s localhost:8000/predict -F files=@examples/sneaker.png`;
- `predict.json`: the same pixels as a TF Serving `:predict` body, `{"instances": [28x28]}`,
  each pixel p written as float32(p) / 255 (the service's own scaling,
  `artifact.contract.normalize_pixels`), so both requests give the model the same input.

Only the standard library, numpy and Pillow: no TensorFlow, no project import.
tests/unit/docs/test_docs.py checks the shipped files are what this script writes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import struct
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
DATA_DIR = Path("/usr/share/datasets/fashion-mnist")
# Test image 9 is the test set's first Sneaker (label 7).
INDEX = 9
LABEL = 7
LABEL_NAME = "Sneaker"
PNG_NAME = "sneaker.png"
JSON_NAME = "predict.json"


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzipped or not) as a numpy array of unsigned bytes."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path}: {data.size} bytes of data, the header says {shape}")
    return data.reshape(shape)


def pixel_text(pixel: int) -> str:
    """float32(pixel) / 255 in the fewest digits that read back as that float32."""
    value = np.float32(pixel) / np.float32(255.0)
    text = np.format_float_positional(value, unique=True, trim="0")
    # A JSON reader parses to float64 first; the float32 it then rounds to must be `value`.
    assert np.float32(float(text)) == value, (pixel, text)
    return text


def predict_body(pixels: np.ndarray) -> str:
    """The TF Serving row-format body for one 28x28 image, one image row per line."""
    rows = ",\n".join("  [" + ", ".join(pixel_text(int(p)) for p in row) + "]" for row in pixels)
    return '{"instances": [[\n' + rows + "\n]]}\n"


def sample(data_dir: Path) -> np.ndarray:
    """The sample image's uint8 [28, 28] pixels, checked to be the sneaker it should be."""
    images = read_idx(data_dir / "t10k-images-idx3-ubyte.gz")
    labels = read_idx(data_dir / "t10k-labels-idx1-ubyte.gz")
    if images.shape[1:] != (28, 28) or int(labels[INDEX]) != LABEL:
        raise ValueError(f"{data_dir}: test image {INDEX} is not a {LABEL_NAME} (label {LABEL})")
    return images[INDEX]


def write_examples(data_dir: Path, out_dir: Path) -> list[Path]:
    """Write the PNG and the JSON body into out_dir; return their paths."""
    pixels = sample(data_dir)
    png, body = out_dir / PNG_NAME, out_dir / JSON_NAME
    Image.fromarray(pixels).save(png, optimize=True)
    body.write_text(predict_body(pixels))
    json.loads(body.read_text())  # the body is valid JSON
    return [png, body]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--out-dir", type=Path, default=HERE)
    args = parser.parse_args()
    for path in write_examples(args.data_dir, args.out_dir):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
