"""Feedback stores for the tests: examples that say which they are, read back and checked
whole, and MNIST-format shards as the versions before tf.Example wrote them (nothing in the
product writes those any more; the store must still read, recover and expire them).

Pure Python and numpy: the fast tier uses it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from artifact import feedback
from artifact.contract import INPUT_KEY


def numbered(start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Images that say which they are: image i is filled with i % 251, its label is i % 10."""
    numbers = np.arange(start, start + count)
    images = np.broadcast_to((numbers % 251).astype(np.uint8)[:, None, None], (count, 28, 28))
    return np.ascontiguousarray(images), (numbers % 10).astype(np.uint8)


def numbered_records(start: int, count: int) -> list[bytes]:
    """numbered()'s images as the service stores them: tf.Examples of float pixels."""
    return feedback.image_examples(*numbered(start, count), INPUT_KEY)


def example_numbers(records: Sequence[dict]) -> list[int]:
    """The numbers of decoded numbered_records, in order (each image checked whole and its
    label against its number)."""
    found = []
    for example in records:
        kind, values = example[INPUT_KEY]
        pixels = np.rint(np.asarray(values) * 255).astype(np.int64)
        assert kind == "float" and len(pixels) == 784, example.keys()
        assert (pixels == pixels[0]).all(), "a torn image"
        found.append(int(pixels[0]))
        assert example[feedback.LABEL_FEATURE] == ("int64", [found[-1] % 10])
    return found


def stored_numbers(directory: Path) -> list[int]:
    """The numbers every closed shard of a store holds, in the store's order, whatever the
    shard's format (each example checked whole)."""
    found = []
    for path in feedback.closed_shards(directory):
        if feedback.shard_format(path) == feedback.IDX_FORMAT:
            shard = feedback.read_shard(path)
            for image, label in zip(shard.images, shard.labels, strict=True):
                assert (image == image[0, 0]).all(), f"{path}: a torn image"
                found.append(int(image[0, 0]))
                assert int(label) == found[-1] % 10, path
        else:
            found += example_numbers(feedback.read_examples(path))
    return found


@dataclasses.dataclass(frozen=True)
class StoredShard:
    """A closed tf.Example shard as the tests read it: its examples decoded, its bookkeeping."""

    path: Path
    examples: list[dict]
    versions: tuple[int | None, ...]
    senders: tuple[str, ...]
    received_at: tuple[str | None, ...]

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def labels(self) -> list:
        return [example[feedback.LABEL_FEATURE][1][0] for example in self.examples]

    @property
    def images(self) -> np.ndarray:
        """The image contract's examples as uint8 pixels [n, 28, 28]."""
        floats = [example[INPUT_KEY][1] for example in self.examples]
        return np.rint(np.asarray(floats).reshape(-1, 28, 28) * 255).astype(np.uint8)

    def values(self, name: str) -> list:
        """One feature's values of every example."""
        return [example[name][1] for example in self.examples]


def stored_shards(directory: Path) -> list[StoredShard]:
    """Every closed tf.Example shard of a store, oldest first, decoded."""
    shards = []
    for path in feedback.closed_shards(directory):
        if feedback.shard_format(path) == feedback.EXAMPLES_FORMAT:
            info = feedback.read_info(path)
            shards.append(
                StoredShard(
                    path,
                    feedback.read_examples(path),
                    info.versions,
                    info.senders,
                    info.received_at,
                )  # fmt: skip
            )
    return shards


def write_idx_shard(
    directory: Path,
    name: str,
    images: np.ndarray,
    labels: np.ndarray,
    versions: Sequence[int | None],
    senders: Sequence[str] | None = None,
    received_at: dt.datetime | None = None,
) -> Path:
    """An MNIST-format shard as the versions before tf.Example wrote it: the two IDX files
    and versions.txt, and provenance.txt when `senders` is given (a closed shard when `name`
    starts with `shard-`, a dead writer's open one with `.open-`)."""
    path = Path(directory) / name
    path.mkdir(parents=True)
    count = len(labels)
    (path / feedback.IMAGES_FILE).write_bytes(
        struct.pack(">IIII", feedback.IMAGES_MAGIC, count, 28, 28)
        + np.ascontiguousarray(images, np.uint8).tobytes()
    )
    (path / feedback.LABELS_FILE).write_bytes(
        struct.pack(">II", feedback.LABELS_MAGIC, count) + np.asarray(labels, np.uint8).tobytes()
    )
    (path / feedback.VERSIONS_FILE).write_bytes(feedback.encode_versions(versions))
    if senders is not None:
        when = received_at or dt.datetime.now(dt.UTC)
        (path / feedback.PROVENANCE_FILE).write_bytes(
            b"".join(feedback.provenance_line(sender, when) for sender in senders)
        )
    return path


def closed_name(when: dt.datetime, writer: str, sequence: int = 1) -> str:
    """A closed shard's name, as the writer makes it: the closing time first."""
    return f"{feedback.CLOSED_PREFIX}{when.strftime('%Y%m%dT%H%M%S%fZ')}-{writer}-{sequence}"


def legacy_shard_names(directory: Path) -> list[str]:
    return [
        p.name for p in feedback.closed_shards(directory) if (p / feedback.IMAGES_FILE).exists()
    ]


def files_of(directory: Path) -> dict[str, bytes]:
    """Every file under a folder with its content (to show nothing changed)."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(Path(directory).rglob("*"))
        if p.is_file() and os.access(p, os.R_OK)
    }
