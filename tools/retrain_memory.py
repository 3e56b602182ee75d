"""Peak resident memory of a gated retrain over a large feedback store (docs/retraining.md,
"Memory"): run once by hand, not by the tests.

    python tools/retrain_memory.py --work /tmp/rss --images 400000 [--format idx|tfrecord]
        [--checkout DIR]

Makes, under --work, a base data set (the first 6,000 training and 1,000 test images of
Fashion-MNIST), a baseline trained 20 steps on it, and a feedback store of --images images
(Fashion-MNIST's training images, each made unique by a pixel of its own, truly labeled), as
MNIST-format shards (what every version reads) or tf.Example shards (what the service writes
now); then runs `python -m training retrain` of --checkout's code over it, every image read
(--max-feedback-per-sender 0), 20 steps, and prints the peak resident set size GNU time
reports. Run it with --checkout at another version's code to compare.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

FASHION = Path("/usr/share/datasets/fashion-mnist")
ROOT = Path(__file__).resolve().parent.parent
SHARD_IMAGES = 1000


def idx(path: Path, offset: int) -> np.ndarray:
    return np.frombuffer(gzip.decompress(path.read_bytes()), np.uint8, offset=offset)


def write_split(folder: Path, prefix: str, images: np.ndarray, labels: np.ndarray) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{prefix}-images-idx3-ubyte").write_bytes(
        struct.pack(">IIII", 2051, len(images), 28, 28) + images.tobytes()
    )
    (folder / f"{prefix}-labels-idx1-ubyte").write_bytes(
        struct.pack(">II", 2049, len(labels)) + labels.tobytes()
    )


def unique_images(count: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` training images, image i with pixels 0-2 set to i's three bytes."""
    images = idx(FASHION / "train-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
    labels = idx(FASHION / "train-labels-idx1-ubyte.gz", 8)
    picks = np.arange(count) % len(images)
    made = images[picks].copy()
    numbers = np.arange(count)
    for k in range(3):
        made[:, 0, k] = (numbers >> (8 * k)) & 0xFF
    return made, labels[picks]


def write_store(store: Path, images: np.ndarray, labels: np.ndarray, shard_format: str) -> None:
    store.mkdir(parents=True, exist_ok=True)
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    line = f"{when.strftime('%Y-%m-%dT%H:%M:%SZ')} load\n".encode()
    if shard_format == "tfrecord":
        sys.path.insert(0, str(ROOT))
        from artifact.feedback import FeedbackWriter, image_examples

        writer = FeedbackWriter(store, SHARD_IMAGES, 10**12)
        writer.open()
        for start in range(0, len(labels), SHARD_IMAGES):
            part = slice(start, start + SHARD_IMAGES)
            records = image_examples(images[part], labels[part], "image")
            writer.append(records, [None] * len(records), "load", when)
        writer.close()
        return
    for number, start in enumerate(range(0, len(labels), SHARD_IMAGES)):
        part = slice(start, start + SHARD_IMAGES)
        closed = (when + dt.timedelta(seconds=number)).strftime("%Y%m%dT%H%M%S%fZ")
        shard = store / f"shard-{closed}-load-{number}"
        write_split(shard, "train", images[part], labels[part])
        count = len(labels[part])
        (shard / "versions.txt").write_bytes(b"\n" * count)
        (shard / "provenance.txt").write_bytes(line * count)


def run(command: list, cwd: Path, log: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(cwd), "TF_CPP_MIN_LOG_LEVEL": "2"}
    with log.open("w") as out:
        done = subprocess.run(
            ["/usr/bin/time", "-v", *map(str, command)],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    text = log.read_text()
    if done.returncode not in (0, 3):
        raise SystemExit(f"{' '.join(map(str, command[:4]))} exited {done.returncode}: see {log}")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--images", type=int, default=400_000)
    parser.add_argument("--format", choices=("idx", "tfrecord"), default="idx")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the code to retrain with")
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    work = args.work.resolve()
    base = work / "base"
    if not base.is_dir():
        images = idx(FASHION / "train-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
        labels = idx(FASHION / "train-labels-idx1-ubyte.gz", 8)
        tests = idx(FASHION / "t10k-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
        test_labels = idx(FASHION / "t10k-labels-idx1-ubyte.gz", 8)
        # The feedback uses the later training images: none is a base image.
        write_split(base, "train", images[:6000], labels[:6000])
        write_split(base, "t10k", tests[:1000], test_labels[:1000])
    store_root = work / f"feedback-{args.format}-{args.images}"
    if not store_root.is_dir():
        made, truth = unique_images(args.images)
        write_store(store_root / "fashion_mnist", made, truth, args.format)
    name = args.checkout.resolve().name
    runs, models = work / f"runs-{name}", work / f"models-{name}"
    if not models.is_dir():
        run([args.python, "-m", "training", "train", "--data-dir", base, "--labels", "fashion",
             "--model-dir", runs / "baseline", "--export-dir", models / "fashion_mnist",
             "--max-steps", 20, "--seed", 0, "--hooks", "none"],
            args.checkout, work / f"train-{name}.log")  # fmt: skip
    log = work / f"retrain-{name}-{args.format}-{args.images}.log"
    text = run(
        [args.python, "-m", "training", "retrain", "--data-dir", base, "--labels", "fashion",
         "--model-dir", runs / f"retrain-{args.format}-{args.images}",
         "--export-dir", models / "fashion_mnist", "--feedback-dir", store_root,
         "--max-feedback-per-sender", 0, "--max-steps", 40, "--eval-every-secs", 100000,
         "--hooks", "none", "--min-accuracy", 1.0],
        args.checkout, log,
    )  # fmt: skip
    peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)[1])
    seconds = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", text)[1]
    store_bytes = sum(p.stat().st_size for p in store_root.rglob("*") if p.is_file())
    print(
        f"{name}: {args.images:,} feedback images ({args.format}, {store_bytes / 2**20:,.0f} MiB): "
        f"peak RSS {peak / 2**10:,.0f} MiB, {seconds} wall clock; log {log}"
    )


if __name__ == "__main__":
    main()
