"""Session fixtures made once per test run, however many pytest processes the run has.

`make test` (tools/test_sides.py) runs several pytest sessions at once, some with xdist
workers, and each process would otherwise train the live tier's models for itself. The run
names a folder in TEST_SHARED_DIR; `shared_folder(name, make)` makes `name` there under an
exclusive lock, the first process to ask doing the work and the others waiting, then reading
the same folder. A folder is complete once its marker is written: one left by a process that
died half-way is removed and made again. Without TEST_SHARED_DIR (a plain `pytest`), each
session makes its own in its base temp folder, as any session fixture does.

What is made here is read-only for the tests: copy it before changing it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

SHARED_DIR_VARIABLE = "TEST_SHARED_DIR"
COMPLETE_MARKER = ".complete"


def shared_folder(
    tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]
) -> Path:
    """The folder `name`, filled by `make(folder)` once per run; its path."""
    root = os.environ.get(SHARED_DIR_VARIABLE)
    if not root:
        folder = tmp_path_factory.mktemp(name, numbered=True)
        make(folder)
        return folder
    folder = Path(root) / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / COMPLETE_MARKER).exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / COMPLETE_MARKER).touch()
    return folder
