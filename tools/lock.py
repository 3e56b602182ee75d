"""Compile the requirements-*.in files into hashed locks: `make lock` runs this.

Each lock is `uv pip compile` of its .in file with every distribution's sha256
(`--generate-hashes`), for the images' interpreter and platform (CPython 3.11 on x86-64 glibc
Linux), so that `uv pip install --require-hashes` (`make setup`) and `pip install
--require-hashes` (the Dockerfile) install nothing that is not in a lock. The two sides run
different TensorFlows (the service current, the trainer 2.15 with tf.estimator), so each has
a lock of its own and the others are layered on one of them:

    requirements-uv.lock              uv, which `make setup` installs first and the rest with
    requirements-pip.lock             pip, which each image installs first and the rest with
    requirements-service.lock         the service's runtime (the API image, `.venv`)
    requirements-training.lock        the trainer's runtime (the trainer image, `.venv-training`)
    requirements-gpu.lock             -r requirements-service.lock, plus CUDA's wheels
    requirements-training-gpu.lock    -r requirements-training.lock, plus CUDA's wheels
    requirements-dev.lock             tests, lint, docs, on top of the service's lock (`.venv`)
    requirements-training-dev.lock    the training side's tests, on top of the trainer's lock

A layered lock is compiled constrained by the locks under it (so a package they share is
pinned once, the same) and leaves their packages out (`--no-emit-package`). uv keeps the pins
of the existing lock it writes over, so running this again changes nothing until an .in file
does; `--upgrade-package NAME` (passed through, like any uv option) moves one package.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The oldest interpreter the locks serve: the developers' venv (the images run 3.11.11);
# pymdown-extensions (docs) needs 3.11.5 or newer.
PYTHON_VERSION = "3.11.7"
PYTHON_PLATFORM = "x86_64-manylinux_2_28"
# What the lock headers say generated them (uv writes it instead of its own command line).
COMPILE_COMMAND = "make lock"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(\S+)")


@dataclass(frozen=True)
class Lock:
    source: str
    output: str
    # The locks this one is installed on top of: its constraints, whose packages it leaves out.
    base: tuple[str, ...] = ()
    # Written as `-r` lines after the header, so that installing this lock installs them too.
    includes: tuple[str, ...] = ()


LOCKS = (
    Lock("requirements-uv.in", "requirements-uv.lock"),
    Lock("requirements-pip.in", "requirements-pip.lock"),
    Lock("requirements-service.in", "requirements-service.lock"),
    Lock("requirements-training.in", "requirements-training.lock"),
    Lock(
        "requirements-gpu.in",
        "requirements-gpu.lock",
        base=("requirements-service.lock",),
        includes=("requirements-service.lock",),
    ),
    Lock(
        "requirements-training-gpu.in",
        "requirements-training-gpu.lock",
        base=("requirements-training.lock",),
        includes=("requirements-training.lock",),
    ),
    Lock(
        "requirements-dev.in",
        "requirements-dev.lock",
        base=("requirements-service.lock", "requirements-uv.lock"),
    ),
    Lock(
        "requirements-training-dev.in",
        "requirements-training-dev.lock",
        base=("requirements-training.lock",),
    ),
)


def normalize(name: str) -> str:
    """A project name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, str]:
    """normalized name -> version for each `name==version` line of a lock or .in file."""
    found = {}
    for line in text.splitlines():
        match = PIN.match(line.strip())
        if match:
            found[normalize(match.group(1))] = match.group(3)
    return found


def uv_command(lock: Lock, root: Path, extra: list[str]) -> list[str]:
    from uv import find_uv_bin

    command = [
        find_uv_bin(),
        "pip",
        "compile",
        lock.source,
        "--output-file",
        lock.output,
        "--generate-hashes",
        "--python-version",
        PYTHON_VERSION,
        "--python-platform",
        PYTHON_PLATFORM,
        "--custom-compile-command",
        COMPILE_COMMAND,
        "--quiet",
    ]
    for base in lock.base:
        command += ["--constraint", base]
        for name in sorted(pins((root / base).read_text())):
            command += ["--no-emit-package", name]
    return command + extra


def add_includes(text: str, includes: tuple[str, ...]) -> str:
    """The lock with `-r` lines for its includes after uv's header (once)."""
    lines = text.splitlines(keepends=True)
    body = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    wanted = [f"-r {name}\n" for name in includes]
    rest = [line for line in lines[body:] if line not in wanted]
    return "".join(lines[:body] + wanted + rest)


def compile_locks(root: Path = ROOT, extra: list[str] | None = None) -> None:
    """Compile every lock under root, each after the locks it is constrained by."""
    for lock in LOCKS:
        subprocess.run(uv_command(lock, root, list(extra or [])), cwd=root, check=True)
        path = root / lock.output
        path.write_text(add_includes(path.read_text(), lock.includes))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="where the .in files are")
    args, extra = parser.parse_known_args(argv)
    compile_locks(args.root, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
