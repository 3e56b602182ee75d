"""One retrain at a time: a lock file that says who holds it.

The file holds the holder's pid, host, start time and command (JSON) while it runs, under an
exclusive flock; the kernel drops the flock when its process dies, however it dies. So a
file with a holder written in it but no flock on it is a stale lock from a dead process, and
the next retrain takes it over (and says so). The file is emptied, not deleted, on release:
deleting a locked file lets a third process lock a new file of the same name while a second
still waits on the old one.

Retrains with different run folders may still publish into the same repository, so the
repository is locked too (`hold_directory` on the folder that holds the model's folder, the
repository root: it exists before the first version does, so a first publish, which makes
the model's folder, does not move the lock). A flock on the folder itself writes nothing
there: a retrain that is not blessed changes nothing in the repository, not even a lock file.
Retrains of two models in one repository take turns too.

No TensorFlow here (the fast tier tests it).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = "retrain.lock"
POLL_SECONDS = 0.5


class LockHeld(Exception):
    """Another live process holds the lock; the message names it."""


def _holder(fd: int) -> dict | None:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 65536).decode("utf-8", errors="replace").strip()
    if not text:
        return None
    try:
        holder = json.loads(text)
    except ValueError:
        return {"pid": "?", "started": "?", "command": text[:200]}
    return holder if isinstance(holder, dict) else None


def describe(holder: dict | None) -> str:
    """'pid 123 on host-a, started 2026-11-30T02:00:00+00:00 (python -m training retrain ...)'."""
    if not holder:
        return "an unknown process"
    text = f"pid {holder.get('pid', '?')}"
    if holder.get("host"):
        text += f" on {holder['host']}"
    text += f", started {holder.get('started', '?')}"
    if holder.get("command"):
        text += f" ({holder['command']})"
    return text


def _flock(fd: int, wait_seconds: float, refusal, waiting_note, note) -> None:
    """An exclusive flock on fd, waiting up to wait_seconds (polling, saying so once).

    Args:
        refusal: () -> the message of the LockHeld raised when the wait runs out.
        waiting_note: () -> the line noted when the wait begins.
    """
    deadline = time.monotonic() + wait_seconds
    waiting = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                waited = f" (waited {wait_seconds:g} s)" if wait_seconds else ""
                raise LockHeld(refusal() + waited) from None
            if not waiting:
                note(waiting_note())
                waiting = True
            time.sleep(POLL_SECONDS)


@contextlib.contextmanager
def hold_directory(path: str | Path, wait_seconds: float = 0.0, note=print) -> Iterator[Path]:
    """An exclusive flock on a folder (its nearest existing one when it does not exist yet)
    for the block; nothing is written or made. Yields the folder locked.

    Raises:
        LockHeld: another process holds it after wait_seconds.
        OSError: the folder cannot be opened.
    """
    folder = Path(path).absolute()
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _flock(
            fd,
            wait_seconds,
            lambda: (
                f"another retrain is publishing into {folder} (from another --model-dir, "
                "whose retrain.lock names it): try again later"
            ),
            lambda: f"Waiting up to {wait_seconds:g} s for another retrain on {folder}",
            note,
        )
        yield folder
    finally:
        os.close(fd)  # drops the flock


@contextlib.contextmanager
def hold(path: str | Path, wait_seconds: float = 0.0, note=print) -> Iterator[dict]:
    """Hold the lock file at path for the block; yields what it records about this process.

    Args:
        path: the lock file (created when missing; its folder must exist).
        wait_seconds: how long to wait for a live holder to finish; 0 = not at all.
        note: prints one line when a stale lock is taken over or the wait begins.
    Raises:
        LockHeld: a live process still holds it after wait_seconds.
    """
    path = Path(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _flock(
            fd,
            wait_seconds,
            lambda: (
                f"another retrain holds {path}: {describe(_holder(fd))}; it publishes "
                "when it is done: try again later"
            ),
            lambda: f"Waiting up to {wait_seconds:g} s for {describe(_holder(fd))} ({path})",
            note,
        )
        stale = _holder(fd)
        if stale is not None:
            note(f"Taking over a stale lock {path} of {describe(stale)}, which is gone")
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": " ".join(["python -m training", *sys.argv[1:]])[:500],
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        os.fsync(fd)
        try:
            yield me
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # drops the flock
