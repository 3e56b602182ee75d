"""`python -m training sample-data --out DIR`: small deterministic data for every input kind.

Written from a fixed seed, so the same command always writes the same bytes (no download):

- classification.csv: numeric columns x1, x2 (floats) and rooms (integers), a string
  categorical `color` (red, green, blue), and `label` low / mid / high from a noisy score of
  them all;
- regression.csv: the same kinds of features (x1, x2, rooms, `city` a-d) and a float `price`;
- shapes/: an image folder of 40x30 RGB images (PNG, every 4th a JPEG), one subfolder per
  class: circle, square, triangle, in random colours on random backgrounds.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from training.configs import SampleDataConfig

CLASSIFICATION_CSV = "classification.csv"
REGRESSION_CSV = "regression.csv"
IMAGE_FOLDER = "shapes"
SHAPES = ("circle", "square", "triangle")
IMAGE_WIDTH, IMAGE_HEIGHT = 40, 30
COLORS = {"red": 1.0, "green": 0.0, "blue": -1.0}
CITIES = {"a": 0.0, "b": 2.0, "c": -1.5, "d": 4.0}
DEFAULT_ROWS = 200
DEFAULT_IMAGES_PER_CLASS = 15


def write_classification_csv(path: Path, rows: int, rng: np.random.Generator) -> Path:
    """x1, x2, rooms, color -> label in low / mid / high (thirds of a noisy score)."""
    x1, x2 = rng.normal(0, 1, rows), rng.normal(5, 2, rows)
    rooms = rng.integers(1, 6, rows)
    colors = rng.choice(list(COLORS), rows)
    score = 1.5 * x1 - 0.5 * x2 + 0.4 * rooms + np.array([COLORS[c] for c in colors])
    score += rng.normal(0, 0.3, rows)
    low, high = np.quantile(score, [1 / 3, 2 / 3])
    labels = np.where(score < low, "low", np.where(score < high, "mid", "high"))
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["x1", "x2", "rooms", "color", "label"])
        for a, b, count, color, label in zip(x1, x2, rooms, colors, labels, strict=True):
            writer.writerow([f"{a:.4f}", f"{b:.4f}", int(count), color, label])
    return path


def write_regression_csv(path: Path, rows: int, rng: np.random.Generator) -> Path:
    """x1, x2, rooms, city -> price = a linear function of them plus noise."""
    x1, x2 = rng.normal(0, 1, rows), rng.uniform(0, 10, rows)
    rooms = rng.integers(1, 6, rows)
    cities = rng.choice(list(CITIES), rows)
    price = 3 * x1 - 0.8 * x2 + 1.5 * rooms + np.array([CITIES[c] for c in cities]) + 10
    price += rng.normal(0, 0.2, rows)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["x1", "x2", "rooms", "city", "price"])
        for row in zip(x1, x2, rooms, cities, price, strict=True):
            writer.writerow(
                [f"{row[0]:.4f}", f"{row[1]:.4f}", int(row[2]), row[3], f"{row[4]:.3f}"]
            )
    return path


def _shape_image(shape: str, rng: np.random.Generator) -> Image.Image:
    background = tuple(int(v) for v in rng.integers(0, 90, 3))
    color = tuple(int(v) for v in rng.integers(150, 256, 3))
    image = Image.new("RGB", (IMAGE_WIDTH, IMAGE_HEIGHT), background)
    draw = ImageDraw.Draw(image)
    size = int(rng.integers(12, 22))
    left = int(rng.integers(1, IMAGE_WIDTH - size))
    top = int(rng.integers(1, IMAGE_HEIGHT - size))
    box = (left, top, left + size, top + size)
    if shape == "circle":
        draw.ellipse(box, fill=color)
    elif shape == "square":
        draw.rectangle(box, fill=color)
    else:
        draw.polygon(
            [(left + size // 2, top), (left, top + size), (left + size, top + size)], color
        )
    return image


def write_image_folder(root: Path, per_class: int, rng: np.random.Generator) -> Path:
    """One subfolder per shape with `per_class` 40x30 RGB images (every 4th a JPEG)."""
    for shape in SHAPES:
        folder = root / shape
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            image = _shape_image(shape, rng)
            if i % 4 == 3:
                image.save(folder / f"{shape}_{i:03d}.jpg", quality=95)
            else:
                image.save(folder / f"{shape}_{i:03d}.png")
    return root


def write_sample_data(
    out: str | Path,
    rows: int = DEFAULT_ROWS,
    images_per_class: int = DEFAULT_IMAGES_PER_CLASS,
    seed: int = 0,
) -> dict[str, Path]:
    """Write the classification CSV, the regression CSV and the image folder under `out`.

    Returns:
        {'classification': path, 'regression': path, 'images': folder}.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    return {
        "classification": write_classification_csv(out / CLASSIFICATION_CSV, rows, rng),
        "regression": write_regression_csv(out / REGRESSION_CSV, rows, rng),
        "images": write_image_folder(out / IMAGE_FOLDER, images_per_class, rng),
    }


def sample_data(config: SampleDataConfig) -> int:
    """Write the sample data and print how to train on each."""
    paths = write_sample_data(config.out, config.rows, config.images_per_class, config.seed)
    print(f"Wrote {paths['classification']}, {paths['regression']} and {paths['images']}/")
    print("Train on them with, e.g.:")
    print(
        f"  python -m training train --csv {paths['classification']} --label label --model linear"
    )
    print(f"  python -m training train --csv {paths['regression']} --label price --model dnn")
    print(
        f"  python -m training train --image-folder {paths['images']} --image-size 32 --channels 3"
    )
    return 0
