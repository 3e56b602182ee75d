"""One retrain at a time: the lock file, its holder, waiting, and a stale lock taken over.
No TensorFlow (the fast tier); the holders are real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.helpers import REPO_ROOT as ROOT

from training import lock

TIMEOUT_SECONDS = 60


def holder(path: Path, then: str = "signal.pause()") -> subprocess.Popen:
    """A process that takes the lock, says so on stdout, then runs `then`."""
    code = textwrap.dedent(
        f"""
        import signal, sys
        from training import lock
        with lock.hold(sys.argv[1]) as me:
            print(me["pid"], flush=True)
            {then}
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    assert line.strip() == str(process.pid), process.stderr.read()
    return process


def stop(process: subprocess.Popen) -> None:
    process.kill()
    process.wait(TIMEOUT_SECONDS)


def test_a_second_holder_is_refused_with_the_first_ones_pid_and_start(tmp_path):
    path = tmp_path / lock.LOCK_FILE
    first = holder(path)
    try:
        recorded = json.loads(path.read_text())
        assert recorded["pid"] == first.pid and recorded["started"]
        with pytest.raises(lock.LockHeld) as refused, lock.hold(path):
            pytest.fail("the lock was taken twice")
        message = str(refused.value)
        assert f"another retrain holds {path}: pid {first.pid}" in message
        assert f"started {recorded['started']}" in message and "try again later" in message
    finally:
        stop(first)


def test_waiting_for_the_holder_ends_when_it_is_done(tmp_path):
    path = tmp_path / lock.LOCK_FILE
    first = holder(path, then="sys.stdin.readline()")  # holds it until told to finish
    notes = []

    def note(line: str) -> None:
        notes.append(line)
        first.stdin.write("done\n")  # once we wait, the holder finishes
        first.stdin.flush()

    try:
        with lock.hold(path, wait_seconds=TIMEOUT_SECONDS, note=note) as me:
            assert me["pid"] == os.getpid()
            assert json.loads(path.read_text())["pid"] == os.getpid()
            assert first.wait(TIMEOUT_SECONDS) == 0
    finally:
        stop(first)
    assert len(notes) == 1 and notes[0].startswith(f"Waiting up to 60 s for pid {first.pid}")
    assert path.read_text() == ""  # released: emptied, not deleted


def test_a_wait_that_runs_out_says_so(tmp_path):
    path = tmp_path / lock.LOCK_FILE
    first = holder(path)
    notes = []
    try:
        with (
            pytest.raises(lock.LockHeld, match=r"\(waited 0.6 s\)"),
            lock.hold(path, 0.6, notes.append),
        ):
            pytest.fail("the lock was taken twice")
    finally:
        stop(first)
    assert len(notes) == 1 and notes[0].startswith(f"Waiting up to 0.6 s for pid {first.pid}")


def test_a_stale_lock_of_a_killed_holder_is_taken_over(tmp_path):
    path = tmp_path / lock.LOCK_FILE
    first = holder(path)
    first.send_signal(signal.SIGKILL)
    first.wait(TIMEOUT_SECONDS)
    assert json.loads(path.read_text())["pid"] == first.pid  # left behind
    notes = []
    with lock.hold(path, note=notes.append):
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert len(notes) == 1
    assert notes[0].startswith(f"Taking over a stale lock {path} of pid {first.pid}")
    assert notes[0].endswith("which is gone")


def test_a_folder_is_locked_without_writing_in_it(tmp_path):
    repository = tmp_path / "models" / "fashion_mnist"
    repository.mkdir(parents=True)
    before = sorted(tmp_path.rglob("*"))
    with lock.hold_directory(repository) as held:
        assert held == repository
        refused = pytest.raises(
            lock.LockHeld, match=f"another retrain is publishing into {repository}"
        )
        with refused, lock.hold_directory(repository):
            pass
    with lock.hold_directory(repository):  # released
        pass
    assert sorted(tmp_path.rglob("*")) == before  # not a file written


def test_a_folder_not_made_yet_locks_its_nearest_parent(tmp_path):
    with lock.hold_directory(tmp_path / "models" / "new_model") as held:
        assert held == tmp_path
        with pytest.raises(lock.LockHeld), lock.hold_directory(tmp_path / "models"):
            pass
    assert not (tmp_path / "models").exists()  # nothing made
