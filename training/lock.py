"""One retrain at a time: a lock file that says who holds it.

The file holds the holder's pid, host, start time and command (JSON) while it runs, under an
exclusive flock; the kernel drops the flock when its process dies, however it dies. So a
file with a holder written in it but no flock on it is a stale lock from a dead process, and
the next retrain takes it over (and says so). The file is emptied, not deleted, on release:
deleting a locked file lets a third process lock a new file of the same name while a second
still waits on the old one.

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
        deadline = time.monotonic() + wait_seconds
        waiting = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _holder(fd)
                if time.monotonic() >= deadline:
                    raise LockHeld(
                        f"another retrain holds {path}: {describe(holder)}; it publishes "
                        "when it is done: try again later"
                        + (f" (waited {wait_seconds:g} s)" if wait_seconds else "")
                    ) from None
                if not waiting:
                    note(f"Waiting up to {wait_seconds:g} s for {describe(holder)} ({path})")
                    waiting = True
                time.sleep(POLL_SECONDS)
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
