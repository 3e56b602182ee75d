"""Virtualenvs of their own for the clients the tests run that cannot share the project's.

KServe's SDK (`kserve`, its `InferenceGRPCClient` and `InferenceRESTClient`) brings its own
FastAPI, Starlette and uvicorn (and a model server) where the service's venv pins its exact
web stack. Its clients speak to the service over the wire only, so they run in a venv of their
own, `build/client-venvs/<client>/` (git-ignored), installed from
`tests/support/clients/requirements-<client>.lock`: hashed, resolved on its own (not against
requirements-service.lock, as benchmarks/peers/venvs.py's peers are held to the service's
TensorFlow: a client shares no package with the service process).

`ensure(client)` creates the venv with the interpreter running this code and installs the
lock into it with uv, hash-checked (`--require-hashes`); a stamp records which lock was
installed, so the next run reuses the venv until the lock changes. uv, not pip: the same
hashed install took 16 s with uv and 70 s with pip here, cold caches both. From the
repository's root:

    python tests/support/client_venvs.py setup [CLIENT...]   install (what the tests do first)
    python tests/support/client_venvs.py lock [CLIENT...]    re-resolve the .in into the .lock
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CLIENTS_DIR = HERE / "clients"
VENVS_DIR = ROOT / "build" / "client-venvs"
CLIENTS = ("kserve",)
# The module each client's venv must import; importing it once after the install also writes
# its bytecode (uv installs without it), so later runs do not compile it again.
IMPORTS = {"kserve": "kserve"}
# The interpreter and platform the locks are resolved for, as the project's (tools/lock.py).
LOCK_PYTHON_VERSION = "3.11.7"
LOCK_PYTHON_PLATFORM = "x86_64-manylinux_2_28"
RELOCK_COMMAND = "python tests/support/client_venvs.py lock"
# What uv prints when it cannot reach the package index at all (no network, no DNS, refused):
# then the client cannot be installed here, which is not the lock's fault.
UNREACHABLE = (
    "dns error",
    "error sending request",
    "failed to connect",
    "connection refused",
    "network connectivity is disabled",
    "operation timed out",
)


class IndexUnreachable(RuntimeError):
    """The package index could not be reached: the client cannot be installed on this machine."""


def in_file(client: str) -> Path:
    return CLIENTS_DIR / f"requirements-{client}.in"


def lock_file(client: str) -> Path:
    return CLIENTS_DIR / f"requirements-{client}.lock"


def venv_dir(client: str, base: Path = VENVS_DIR) -> Path:
    return base / client


def python(client: str, base: Path = VENVS_DIR) -> Path:
    return venv_dir(client, base) / "bin" / "python"


def stamp(client: str, base: Path = VENVS_DIR) -> Path:
    return venv_dir(client, base) / ".installed"


def fingerprint(client: str) -> str:
    """What an installed venv must match: the client's lock and the interpreter's version."""
    digest = hashlib.sha256(lock_file(client).read_bytes())
    digest.update(sys.version.encode())
    return digest.hexdigest()


def is_installed(client: str, base: Path = VENVS_DIR) -> bool:
    """The venv is there, with its python, installed from the current lock."""
    path = stamp(client, base)
    return (
        path.is_file()
        and path.read_text().strip() == fingerprint(client)
        and python(client, base).is_file()
    )


def uv_bin() -> str:
    from uv import find_uv_bin

    return find_uv_bin()


def install_command(client: str, venv_python: Path) -> list[str]:
    """uv installing the client's lock into a venv, every file checked against its sha256."""
    return [
        uv_bin(),
        "pip",
        "install",
        "--python",
        str(venv_python),
        "--require-hashes",
        "--no-progress",
        "--quiet",
        "-r",
        str(lock_file(client)),
    ]


def is_unreachable(output: str) -> bool:
    """Whether uv's output says the index could not be reached (not a bad lock or a bad file)."""
    text = output.lower()
    return any(words in text for words in UNREACHABLE)


def ensure(client: str, base: Path = VENVS_DIR, log=print) -> Path:
    """The client's venv, installed from its lock if missing or stale; its python.

    Raises:
        IndexUnreachable: the package index could not be reached.
        RuntimeError: the install failed otherwise (a bad lock, a hash that does not match).
    """
    if is_installed(client, base):
        return python(client, base)
    directory = venv_dir(client, base)
    log(f"Installing {client}'s client into {directory} from {lock_file(client).name}...")
    start = time.monotonic()
    shutil.rmtree(directory, ignore_errors=True)
    directory.parent.mkdir(parents=True, exist_ok=True)
    # From inside a venv, `-m venv` builds on the base interpreter; uv installs, so no pip.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True)
    command = install_command(client, python(client, base))
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        (directory / "install.log").write_text(output + "\n")
        error = IndexUnreachable if is_unreachable(output) else RuntimeError
        tail = "\n".join(output.splitlines()[-15:])
        raise error(f"{' '.join(command)} failed (exit {result.returncode}):\n{tail}")
    # With PYTHONDONTWRITEBYTECODE set (as in many shells and images) every run would compile
    # the ~1,000 modules `import kserve` loads again: 7 s of CPU each time, measured here.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    imported = subprocess.run(
        [str(python(client, base)), "-c", f"import {IMPORTS[client]}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=directory,
    )
    if imported.returncode != 0:
        raise RuntimeError(f"import {IMPORTS[client]} failed after the install:\n{imported.stderr}")
    stamp(client, base).write_text(fingerprint(client) + "\n")
    log(f"Installed {client}'s client in {time.monotonic() - start:.0f} s.")
    return python(client, base)


def relock_command(client: str) -> list[str]:
    """uv compiling requirements-<client>.in into its hashed lock (its own pins kept)."""
    return [
        uv_bin(),
        "pip",
        "compile",
        str(in_file(client).relative_to(ROOT)),
        "--output-file",
        str(lock_file(client).relative_to(ROOT)),
        "--generate-hashes",
        "--python-version",
        LOCK_PYTHON_VERSION,
        "--python-platform",
        LOCK_PYTHON_PLATFORM,
        "--custom-compile-command",
        RELOCK_COMMAND,
        "--quiet",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("setup", "lock"))
    parser.add_argument("clients", nargs="*", help=f"of {', '.join(CLIENTS)} (default: all)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.clients) - set(CLIENTS))
    if unknown:
        parser.error(f"unknown client {', '.join(unknown)}; the clients are {', '.join(CLIENTS)}")
    for client in args.clients or CLIENTS:
        if args.command == "setup":
            ensure(client)
        else:
            subprocess.run(relock_command(client), cwd=ROOT, check=True)
            print(f"Wrote {lock_file(client)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
