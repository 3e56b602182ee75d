"""The feedback store's format: append, fsync, rotate, bound, read; and what a crash leaves.

Pure Python and numpy (the fast tier). Crashes are real: a writer in a subprocess is killed
with SIGKILL, or runs out of room under a file-size limit (RLIMIT_FSIZE), and a new writer
then opens the same folder.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from support.helpers import REPO_ROOT as ROOT

from artifact import feedback
from artifact.feedback import (
    IMAGES_FILE,
    LABELS_FILE,
    OPEN_PREFIX,
    VERSIONS_FILE,
    FeedbackFormatError,
    FeedbackStoreFull,
    FeedbackWriter,
    closed_shards,
    read_closed_shards,
    read_shard,
)

KILL_TIMEOUT_SECONDS = 60


def numbered(start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Images that say which they are: image i is filled with i % 251, its label is i % 10."""
    numbers = np.arange(start, start + count)
    images = np.broadcast_to((numbers % 251).astype(np.uint8)[:, None, None], (count, 28, 28))
    return np.ascontiguousarray(images), (numbers % 10).astype(np.uint8)


def stored_numbers(shards) -> list[int]:
    """The image numbers held by shards, in order (each image checked whole)."""
    found = []
    for shard in shards:
        for image, label in zip(shard.images, shard.labels, strict=True):
            assert (image == image[0, 0]).all(), f"{shard.path}: a torn image"
            found.append(int(image[0, 0]))
            assert int(label) == found[-1] % 10, shard.path
    return found


def open_writer(directory: Path, shard_images: int = 3, max_bytes: int = 10**9) -> FeedbackWriter:
    writer = FeedbackWriter(directory, shard_images, max_bytes)
    writer.open()
    return writer


def run_writer(script: str, directory: Path, **popen) -> subprocess.Popen:
    """A writer in its own process (so that killing it is a real crash)."""
    code = textwrap.dedent(
        """
        import json, sys
        import numpy as np
        from artifact.feedback import FeedbackWriter, FeedbackStoreFull
        directory = sys.argv[1]
        """
    )
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            code + inspect.getsource(numbered) + textwrap.dedent(script),
            str(directory),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def test_appends_rotate_into_closed_shards_that_read_back(tmp_path):
    writer = open_writer(tmp_path, shard_images=3)
    first = writer.append(*numbered(0, 2), [4, None])
    assert first.count == 2 and first.closed is None
    assert closed_shards(tmp_path) == []  # the open shard is not for readers
    second = writer.append(*numbered(2, 2), [4, 5])
    assert second.closed is not None and second.closed.name.startswith("shard-")
    writer.append(*numbered(4, 1), [None])
    assert len(closed_shards(tmp_path)) == 1
    last = writer.close()
    shards = read_closed_shards(tmp_path)
    assert [s.path for s in shards] == [second.closed, last]
    assert stored_numbers(shards) == [0, 1, 2, 3, 4]
    assert shards[0].versions == (4, None, 4, 5) and shards[1].versions == (None,)
    assert not list(tmp_path.glob(OPEN_PREFIX + "*"))
    assert writer.close() is None  # nothing open: nothing to close


def test_a_closed_shard_is_an_mnist_folder(tmp_path):
    writer = open_writer(tmp_path)
    images, labels = numbered(7, 2)
    writer.append(images, labels, [None, None])
    shard = writer.close()
    data = (shard / IMAGES_FILE).read_bytes()
    assert struct.unpack(">IIII", data[:16]) == (2051, 2, 28, 28)
    assert data[16:] == images.tobytes()
    assert (shard / LABELS_FILE).read_bytes() == struct.pack(">II", 2049, 2) + labels.tobytes()
    assert (shard / VERSIONS_FILE).read_text() == "\n\n"


def test_a_request_past_max_bytes_is_refused_whole_and_changes_nothing(tmp_path):
    # image, label, empty version line, provenance line
    one_image = 28 * 28 + 1 + 1 + len("2026-01-01T00:00:00Z anonymous\n")
    writer = open_writer(tmp_path, shard_images=100, max_bytes=16 + 8 + 3 * one_image)
    writer.append(*numbered(0, 2), [None, None])
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(FeedbackStoreFull, match="FEEDBACK_MAX_BYTES=2,475: nothing was stored"):
        writer.append(*numbered(2, 2), [None, None])
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    writer.append(*numbered(2, 1), [None])  # what still fits is stored
    writer.close()
    assert stored_numbers(read_closed_shards(tmp_path)) == [0, 1, 2]


def test_the_limit_counts_every_writer_of_the_folder(tmp_path):
    other = open_writer(tmp_path, shard_images=1)
    other.append(*numbered(0, 4), [None] * 4)  # closed at once: 4 images on disk
    writer = open_writer(tmp_path, max_bytes=feedback.store_bytes(tmp_path) + 100)
    with pytest.raises(FeedbackStoreFull):
        writer.append(*numbered(4, 1), [None])


def test_a_live_writers_open_shard_is_left_alone(tmp_path):
    alive = open_writer(tmp_path, shard_images=10)
    alive.append(*numbered(0, 2), [None, None])
    newcomer = open_writer(tmp_path)
    assert newcomer.recovered == []
    alive.append(*numbered(2, 1), [None])
    alive.close()
    assert stored_numbers(read_closed_shards(tmp_path)) == [0, 1, 2]


def test_a_writer_killed_while_appending_loses_at_most_the_request_being_written(tmp_path):
    """SIGKILL a writer in a loop of appends; every acknowledged image survives, whole."""
    process = run_writer(
        """
        writer = FeedbackWriter(directory, shard_images=5, max_bytes=10**9)
        writer.open()
        done = 0
        while True:
            size = 1 + done % 3
            writer.append(*numbered(done, size), [done] * size)
            done += size
            print(done, flush=True)
        """,
        tmp_path,
    )
    acknowledged = 0
    try:
        for line in process.stdout:
            acknowledged = int(line)
            if acknowledged >= 60:
                break
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait(KILL_TIMEOUT_SECONDS)
    # What it acknowledged until the kill landed (still in the pipe).
    for line in process.stdout:
        acknowledged = int(line)
    assert acknowledged >= 60, process.stderr.read()
    before = [s.path.name for s in read_closed_shards(tmp_path)]  # every closed shard reads
    assert len(before) >= 10
    assert len(list(tmp_path.glob(OPEN_PREFIX + "*"))) <= 1  # none right after a rotation
    newcomer = open_writer(tmp_path)
    assert len(newcomer.recovered) <= 1
    assert not list(tmp_path.glob(OPEN_PREFIX + "*"))
    shards = read_closed_shards(tmp_path)
    assert [s.path.name for s in shards if s.path.name in before] == before  # untouched
    numbers = stored_numbers(shards)
    # A prefix of what was sent: every acknowledged image, plus at most the one request
    # that was being written (a commit the kill came after, not yet acknowledged).
    assert numbers == list(range(len(numbers)))
    assert acknowledged <= len(numbers) <= acknowledged + 3


def test_a_torn_append_is_rolled_back_by_the_next_writer(tmp_path):
    """A writer dies after writing past the commit and raising one header of two."""
    process = run_writer(
        """
        import os, struct
        writer = FeedbackWriter(directory, shard_images=100, max_bytes=10**9)
        writer.open()
        writer.append(*numbered(0, 2), [1, 1])
        shard = writer._shard
        images, labels = numbered(2, 3)
        os.pwrite(shard.fds["train-images-idx3-ubyte"], images.tobytes(), 16 + 2 * 784)
        os.pwrite(shard.fds["train-labels-idx1-ubyte"], labels.tobytes()[:2], 8 + 2)
        os.pwrite(shard.fds["versions.txt"], b"1\\n1", shard.versions_end)
        os.pwrite(shard.fds["train-images-idx3-ubyte"], struct.pack(">I", 5), 4)
        os._exit(0)
        """,
        tmp_path,
    )
    assert process.wait(KILL_TIMEOUT_SECONDS) == 0, process.stderr.read()
    newcomer = open_writer(tmp_path)
    (recovered,) = newcomer.recovered
    shard = read_shard(recovered)
    assert stored_numbers([shard]) == [0, 1]
    assert shard.versions == (1, 1)


def test_no_room_on_the_disk_refuses_the_request_and_keeps_what_was_stored(tmp_path):
    """A real partial write: a file-size limit (RLIMIT_FSIZE, EFBIG) stops the second append
    in the middle of its images."""
    process = run_writer(
        """
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        writer = FeedbackWriter(directory, shard_images=100, max_bytes=10**9)
        writer.open()
        writer.append(*numbered(0, 2), [3, 3])
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 + 3 * 784 + 100, resource.RLIM_INFINITY))
        try:
            writer.append(*numbered(2, 4), [3] * 4)
            print(json.dumps({"stored": True}))
        except FeedbackStoreFull as err:
            print(json.dumps({"refused": str(err)}))
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
        writer.append(*numbered(2, 1), [3])
        writer.close()
        """,
        tmp_path,
    )
    out, err = process.communicate(timeout=KILL_TIMEOUT_SECONDS)
    assert process.returncode == 0, err
    result = json.loads(out)
    assert "nothing of this request was stored" in result["refused"], result
    assert "File too large" in result["refused"]
    assert stored_numbers(read_closed_shards(tmp_path)) == [0, 1, 2]


@pytest.mark.parametrize(
    "damage, message",
    [
        pytest.param(lambda d: (d / IMAGES_FILE).write_bytes((d / IMAGES_FILE).read_bytes()[:-5]), "header says 2 images", id="truncated-images"),
        pytest.param(lambda d: (d / LABELS_FILE).write_bytes(struct.pack(">II", 2049, 2) + b"\x01\x0c"), "a label is outside 0-9", id="label-out-of-range"),
        pytest.param(lambda d: (d / LABELS_FILE).write_bytes(struct.pack(">II", 2049, 1) + b"\x01"), "2 images but 1 labels", id="count-mismatch"),
        pytest.param(lambda d: (d / LABELS_FILE).unlink(), "cannot read", id="missing-labels"),
        pytest.param(lambda d: (d / VERSIONS_FILE).write_text("3\nx\n"), "expected 2 lines of version numbers", id="bad-versions"),
    ],
)  # fmt: skip
def test_a_damaged_closed_shard_is_named(tmp_path, damage, message):
    writer = open_writer(tmp_path)
    writer.append(*numbered(0, 2), [None, None])
    shard = writer.close()
    damage(shard)
    with pytest.raises(FeedbackFormatError, match=message) as caught:
        read_closed_shards(tmp_path)
    assert str(shard) in str(caught.value)


@pytest.mark.parametrize(
    "make_path",
    [
        pytest.param(lambda tmp: Path("/sys/feedback-store"), id="read-only-sysfs"),
        pytest.param(lambda tmp: Path("/proc/feedback-store"), id="proc"),
        pytest.param(lambda tmp: (tmp / "a-file").write_text("") or tmp / "a-file" / "m", id="file-where-a-folder-is-expected"),
    ],
)  # fmt: skip
def test_a_folder_that_cannot_be_written_fails_at_open(tmp_path, make_path):
    path = make_path(tmp_path)
    with pytest.raises(OSError):
        FeedbackWriter(path, 10, 10**6).open()
