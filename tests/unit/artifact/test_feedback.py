"""The feedback store's format: append, fsync, rotate, bound, read; and what a crash leaves.

Pure Python and numpy (the fast tier). Crashes are real: a writer in a subprocess is killed
with SIGKILL, or runs out of room under a file-size limit (RLIMIT_FSIZE), and a new writer
then opens the same folder. The MNIST-format shards of earlier versions still read and are
recovered when their writer died.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from support.feedback_stores import (
    closed_name,
    files_of,
    numbered,
    numbered_records,
    stored_numbers,
    write_idx_shard,
)
from support.helpers import REPO_ROOT as ROOT

from artifact import feedback, tfrecord
from artifact.feedback import (
    COMMITTED_FILE,
    EXAMPLES_FILE,
    LABEL_FEATURE,
    OPEN_PREFIX,
    VERSIONS_FILE,
    FeedbackFormatError,
    FeedbackStoreFull,
    FeedbackWriter,
    closed_shards,
    read_examples,
    read_info,
    read_shard,
)

KILL_TIMEOUT_SECONDS = 60


def open_writer(directory: Path, shard_examples: int = 3, max_bytes: int = 10**9) -> FeedbackWriter:
    writer = FeedbackWriter(directory, shard_examples, max_bytes)
    writer.open()
    return writer


def run_writer(script: str, directory: Path, **popen) -> subprocess.Popen:
    """A writer in its own process (so that killing it is a real crash)."""
    code = textwrap.dedent(
        """
        import json, sys
        import numpy as np
        from artifact import feedback
        from artifact.feedback import FeedbackWriter, FeedbackStoreFull
        directory = sys.argv[1]
        """
    )
    helpers = inspect.getsource(numbered) + inspect.getsource(numbered_records)
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            code + helpers.replace("INPUT_KEY", '"image"') + textwrap.dedent(script),
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
    writer = open_writer(tmp_path, shard_examples=3)
    first = writer.append(numbered_records(0, 2), [4, None])
    assert first.count == 2 and first.closed is None
    assert closed_shards(tmp_path) == []  # the open shard is not for readers
    second = writer.append(numbered_records(2, 2), [4, 5])
    assert second.closed is not None and second.closed.name.startswith("shard-")
    writer.append(numbered_records(4, 1), [None])
    assert len(closed_shards(tmp_path)) == 1
    last = writer.close()
    assert closed_shards(tmp_path) == [second.closed, last]
    assert stored_numbers(tmp_path) == [0, 1, 2, 3, 4]
    assert read_info(second.closed).versions == (4, None, 4, 5)
    assert read_info(last).versions == (None,)
    assert not list(tmp_path.glob(OPEN_PREFIX + "*"))
    assert writer.close() is None  # nothing open: nothing to close


def test_a_closed_shard_is_a_tfrecord_file_of_tf_examples(tmp_path):
    """The framing TensorFlow's reader checks (lengths and masked CRC32Cs), one tf.Example a
    record: the pixels as floats under `image`, the class id under the label's feature.
    (tests/live/service/test_feedback_any.py reads them with tf.data too.)"""
    writer = open_writer(tmp_path)
    records = numbered_records(7, 2)
    writer.append(records, [None, 3])
    shard = writer.close()
    data = (shard / EXAMPLES_FILE).read_bytes()
    spans = tfrecord.record_spans(data)
    assert [data[s : s + n] for s, n in spans] == records
    assert data == tfrecord.frame(records[0]) + tfrecord.frame(records[1])
    (example, _) = read_examples(shard)
    assert example[LABEL_FEATURE] == ("int64", [7])
    assert example["image"][0] == "float"
    np.testing.assert_array_equal(example["image"][1], np.float32(7 / 255))
    assert (shard / COMMITTED_FILE).read_text() == f"{2:020d}\n"
    assert (shard / VERSIONS_FILE).read_text() == "\n3\n"
    assert read_info(shard).format == feedback.EXAMPLES_FORMAT


def test_the_crc32c_is_the_castagnoli_one():
    assert tfrecord.crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C
    assert tfrecord.crc32c(b"") == 0
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, 256, 300, dtype=np.uint8).tobytes() for _ in range(64)]
    assert tfrecord.crc32c_many(rows) == [tfrecord.crc32c(r) for r in rows]  # numpy's lanes


def test_a_request_past_max_bytes_is_refused_whole_and_changes_nothing(tmp_path):
    one = (
        len(tfrecord.frame(numbered_records(0, 1)[0])) + 1 + len("2026-01-01T00:00:00Z anonymous\n")
    )  # a framed record, an empty version line, a provenance line
    writer = open_writer(tmp_path, shard_examples=100, max_bytes=21 + 3 * one)
    writer.append(numbered_records(0, 2), [None, None])
    before = files_of(tmp_path)
    with pytest.raises(FeedbackStoreFull, match=f"FEEDBACK_MAX_BYTES={21 + 3 * one:,}: nothing"):
        writer.append(numbered_records(2, 2), [None, None])
    assert files_of(tmp_path) == before
    writer.append(numbered_records(2, 1), [None])  # what still fits is stored
    writer.close()
    assert stored_numbers(tmp_path) == [0, 1, 2]


def test_the_limit_counts_every_writer_of_the_folder(tmp_path):
    other = open_writer(tmp_path, shard_examples=1)
    other.append(numbered_records(0, 4), [None] * 4)  # closed at once: 4 examples on disk
    writer = open_writer(tmp_path, max_bytes=feedback.store_bytes(tmp_path) + 100)
    with pytest.raises(FeedbackStoreFull):
        writer.append(numbered_records(4, 1), [None])


def test_a_live_writers_open_shard_is_left_alone(tmp_path):
    alive = open_writer(tmp_path, shard_examples=10)
    alive.append(numbered_records(0, 2), [None, None])
    newcomer = open_writer(tmp_path)
    assert newcomer.recovered == []
    alive.append(numbered_records(2, 1), [None])
    alive.close()
    assert stored_numbers(tmp_path) == [0, 1, 2]


def test_a_writer_killed_while_appending_loses_at_most_the_request_being_written(tmp_path):
    """SIGKILL a writer in a loop of appends; every acknowledged example survives, whole."""
    process = run_writer(
        """
        writer = FeedbackWriter(directory, shard_examples=5, max_bytes=10**9)
        writer.open()
        done = 0
        while True:
            size = 1 + done % 3
            writer.append(numbered_records(done, size), [done] * size)
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
    before = [p.name for p in closed_shards(tmp_path)]
    stored_numbers(tmp_path)  # every closed shard reads
    assert len(before) >= 10
    assert len(list(tmp_path.glob(OPEN_PREFIX + "*"))) <= 1  # none right after a rotation
    newcomer = open_writer(tmp_path)
    assert len(newcomer.recovered) <= 1
    assert not list(tmp_path.glob(OPEN_PREFIX + "*"))
    assert [p.name for p in closed_shards(tmp_path) if p.name in before] == before  # untouched
    numbers = stored_numbers(tmp_path)
    # A prefix of what was sent: every acknowledged example, plus at most the one request
    # that was being written (a commit the kill came after, not yet acknowledged).
    assert numbers == list(range(len(numbers)))
    assert acknowledged <= len(numbers) <= acknowledged + 3


def _torn_last_record(records: bytes, lines: bytes) -> tuple[bytes, bytes]:
    return records[:-7], lines


def _a_crc_wrong(records: bytes, lines: bytes) -> tuple[bytes, bytes]:
    return records[:20] + b"x" * 12 + records[32:], lines


@pytest.mark.parametrize(
    "tear",
    [
        pytest.param(_torn_last_record, id="last-record-torn"),
        pytest.param(_a_crc_wrong, id="a-crc-wrong"),
        pytest.param(lambda records, lines: (records, lines[:2]), id="version-lines-short"),
        pytest.param(lambda records, lines: (records, lines), id="all-written-not-committed"),
    ],
)
def test_a_torn_append_is_rolled_back_by_the_next_writer(tmp_path, tear):
    """A writer dies after writing past its commit, before raising the committed count (its
    files closed as a dying process's are: the flock goes with them)."""
    writer = open_writer(tmp_path, shard_examples=100)
    writer.append(numbered_records(0, 2), [1, 1])
    shard = writer._shard
    records, lines = tear(tfrecord.frame_many(numbered_records(2, 3)), b"1\n1\n1\n")
    os.pwrite(shard.fds[EXAMPLES_FILE], records, shard.examples_end)
    os.pwrite(shard.fds[VERSIONS_FILE], lines, shard.versions_end)
    provenance = feedback.provenance_line("anonymous", dt.datetime.now(dt.UTC)) * 3
    os.pwrite(shard.fds[feedback.PROVENANCE_FILE], provenance, shard.provenance_end)
    shard.release()
    newcomer = open_writer(tmp_path)
    (recovered,) = newcomer.recovered
    assert stored_numbers(tmp_path) == [0, 1]
    assert read_info(recovered).versions == (1, 1)


def test_a_commit_past_the_records_is_cut_to_the_whole_ones(tmp_path):
    """A count raised over records that are not all there (a disk that reordered writes):
    the next writer keeps the whole records only."""
    writer = open_writer(tmp_path, shard_examples=100)
    writer.append(numbered_records(0, 3), [1, 1, 1])
    shard = writer._shard
    path = shard.path
    os.truncate(path / EXAMPLES_FILE, shard.examples_end - 5)
    shard.release()  # the process died holding it
    newcomer = open_writer(tmp_path)
    assert newcomer.recovered and stored_numbers(tmp_path) == [0, 1]


def test_no_room_on_the_disk_refuses_the_request_and_keeps_what_was_stored(tmp_path):
    """A real partial write: a file-size limit (RLIMIT_FSIZE, EFBIG) stops the second append
    in the middle of its records."""
    process = run_writer(
        """
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        writer = FeedbackWriter(directory, shard_examples=100, max_bytes=10**9)
        writer.open()
        writer.append(numbered_records(0, 2), [3, 3])
        limit = writer._shard.examples_end + 4000
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        try:
            writer.append(numbered_records(2, 4), [3] * 4)
            print(json.dumps({"stored": True}))
        except FeedbackStoreFull as err:
            print(json.dumps({"refused": str(err)}))
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
        writer.append(numbered_records(2, 1), [3])
        writer.close()
        """,
        tmp_path,
    )
    out, err = process.communicate(timeout=KILL_TIMEOUT_SECONDS)
    assert process.returncode == 0, err
    result = json.loads(out)
    assert "nothing of this request was stored" in result["refused"], result
    assert "File too large" in result["refused"]
    assert stored_numbers(tmp_path) == [0, 1, 2]


def _damage_a_crc(shard: Path) -> None:
    data = bytearray((shard / EXAMPLES_FILE).read_bytes())
    data[40] ^= 0xFF  # inside the first record's data
    (shard / EXAMPLES_FILE).write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, message, reader",
    [
        pytest.param(lambda d: (d / EXAMPLES_FILE).write_bytes((d / EXAMPLES_FILE).read_bytes()[:-5]), "is cut short", read_examples, id="truncated-records"),
        pytest.param(_damage_a_crc, "data's CRC does not match", read_examples, id="damaged-record"),
        pytest.param(lambda d: (d / COMMITTED_FILE).write_text(f"{3:020d}\n"), "expected 3 lines of version numbers", read_info, id="count-past-the-lines"),
        pytest.param(lambda d: (d / COMMITTED_FILE).write_text("two\n"), "expected a count of examples", read_info, id="bad-count"),
        pytest.param(lambda d: (d / COMMITTED_FILE).unlink(), "cannot read", read_info, id="missing-count"),
        pytest.param(lambda d: (d / VERSIONS_FILE).write_text("3\nx\n"), "expected 2 lines of version numbers", read_info, id="bad-versions"),
    ],
)  # fmt: skip
def test_a_damaged_closed_shard_is_named(tmp_path, damage, message, reader):
    writer = open_writer(tmp_path)
    writer.append(numbered_records(0, 2), [None, None])
    shard = writer.close()
    damage(shard)
    with pytest.raises(FeedbackFormatError, match=message) as caught:
        reader(shard)
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


# --- the MNIST-format shards of earlier versions ----------------------------------------------


def test_an_mnist_format_shard_of_an_earlier_version_still_reads(tmp_path):
    images, labels = numbered(0, 3)
    name = closed_name(dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "old")
    old = write_idx_shard(tmp_path, name, images, labels, [2, None, 2], senders=["alice"] * 3)
    writer = open_writer(tmp_path, shard_examples=10)
    writer.append(numbered_records(3, 2), [None, None])
    new = writer.close()
    assert closed_shards(tmp_path) == [old, new]  # the old one first: it was closed first
    assert stored_numbers(tmp_path) == [0, 1, 2, 3, 4]
    info = read_info(old)
    assert (info.format, len(info), info.versions) == (feedback.IDX_FORMAT, 3, (2, None, 2))
    assert info.senders == ("alice",) * 3
    shard = read_shard(old)
    np.testing.assert_array_equal(shard.images, images)
    with pytest.raises(FeedbackFormatError, match="holds tf.Examples"):
        read_shard(new)


def test_an_earlier_versions_open_shard_is_recovered_and_closed(tmp_path):
    """A dead writer of the version before tf.Example left an MNIST-format open shard with a
    torn append: the next writer cuts it to its commit (the smaller header count) and closes
    it; new examples go to a tf.Example shard of its own."""
    images, labels = numbered(0, 3)
    path = write_idx_shard(tmp_path, OPEN_PREFIX + "old-writer", images, labels, [None] * 3)
    header = (path / feedback.LABELS_FILE).read_bytes()
    (path / feedback.LABELS_FILE).write_bytes(header[:4] + (2).to_bytes(4, "big") + header[8:])
    writer = open_writer(tmp_path)
    (recovered,) = writer.recovered
    assert read_shard(recovered).labels.tolist() == [0, 1]
    writer.append(numbered_records(5, 1), [None])
    writer.close()
    assert stored_numbers(tmp_path) == [0, 1, 5]
