"""Each peer's own virtualenv under benchmarks/.peers/ (git-ignored), installed from its lock.

`ensure(peer)` creates benchmarks/.peers/<peer>/ with the interpreter running this code and
installs benchmarks/peers/requirements-<peer>.lock into it hash-checked (`--require-hashes`:
only the files the lock names, each with its sha256), constrained by the service's TensorFlow
runtime (`tensorflow-runtime.txt`: TensorFlow and every package it pins, as
requirements-service.lock has them), so a pin that drifted from the service's fails the
install instead of giving the peer another TensorFlow. Only the runtime: a peer's own web
stack (MLServer 1.7 wants an older FastAPI) is its own business. A stamp records what was
installed: the next run reuses the venv until a lock changes. `relock(peer)` writes the
runtime file from the service's lock, then compiles the peer's .in file with uv, with hashes,
constrained by it, keeping the lock's other pins (as `make lock` does for the project's
locks, tools/lock.py).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PEERS_DIR = ROOT / "benchmarks" / ".peers"
PROJECT_LOCK = ROOT / "requirements-service.lock"
# TensorFlow and what it pins, from PROJECT_LOCK: what every peer shares with the service.
RUNTIME_CONSTRAINTS = HERE / "tensorflow-runtime.txt"
PEERS = ("mlserver", "bentoml")
# The command each venv must have for the benchmark to start the peer.
COMMANDS = {"mlserver": "mlserver", "bentoml": "bentoml"}


def lock_file(peer: str) -> Path:
    return HERE / f"requirements-{peer}.lock"


def in_file(peer: str) -> Path:
    return HERE / f"requirements-{peer}.in"


def venv_dir(peer: str, base: Path = PEERS_DIR) -> Path:
    return base / peer


def python(peer: str, base: Path = PEERS_DIR) -> Path:
    return venv_dir(peer, base) / "bin" / "python"


def command(peer: str, base: Path = PEERS_DIR) -> Path:
    return venv_dir(peer, base) / "bin" / COMMANDS[peer]


def fingerprint(peer: str) -> str:
    """What an installed venv must match: the peer's lock and the project's lock."""
    digest = hashlib.sha256()
    for path in (lock_file(peer), RUNTIME_CONSTRAINTS):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def stamp(peer: str, base: Path = PEERS_DIR) -> Path:
    return venv_dir(peer, base) / ".installed"


def is_installed(peer: str, base: Path = PEERS_DIR) -> bool:
    """The venv is there, has the peer's command and was installed from the current locks."""
    path = stamp(peer, base)
    return (
        path.is_file()
        and path.read_text().strip() == fingerprint(peer)
        and command(peer, base).is_file()
    )


def install_command(peer: str, venv_python: Path, requirements: Path) -> list[str]:
    """pip installing a requirements file into a venv, held to the project's pins."""
    return [
        str(venv_python),
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--require-hashes",
        "-r",
        str(requirements),
        "-c",
        str(RUNTIME_CONSTRAINTS),
    ]


def _create(directory: Path) -> Path:
    shutil.rmtree(directory, ignore_errors=True)
    directory.parent.mkdir(parents=True, exist_ok=True)
    # From inside a venv, `-m venv` builds on the base interpreter: the same Python 3.11.
    subprocess.run([sys.executable, "-m", "venv", str(directory)], check=True)
    return directory / "bin" / "python"


def _pip(cmd: list[str], log_path: Path) -> None:
    with open(log_path, "ab") as log:
        result = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        lines = [
            line
            for line in log_path.read_text(errors="replace").splitlines()
            if "is ignored: it is neither a file nor a directory" not in line
        ]
        tail = "\n".join(lines[-30:])
        raise RuntimeError(f"{' '.join(cmd)} failed (log: {log_path}):\n{tail}")


def ensure(peer: str, base: Path = PEERS_DIR, log=print) -> Path:
    """The peer's venv, installed from its lock if it is missing or stale; its python."""
    if is_installed(peer, base):
        return python(peer, base)
    directory = venv_dir(peer, base)
    log(
        f"Installing {peer} and TensorFlow into {directory} from {lock_file(peer).name} "
        "(a minute or two, 2 GB; once per lock change)...",
        flush=True,
    )
    start = time.monotonic()
    venv_python = _create(directory)
    log_path = directory / "install.log"
    _pip(install_command(peer, venv_python, lock_file(peer)), log_path)
    if not command(peer, base).is_file():
        raise RuntimeError(f"{command(peer, base)} missing after the install (log: {log_path})")
    stamp(peer, base).write_text(fingerprint(peer) + "\n")
    log(f"Installed {peer} in {time.monotonic() - start:.0f} s.", flush=True)
    return venv_python


def installed_versions(peer: str, base: Path = PEERS_DIR) -> dict[str, str]:
    """A few versions from the venv, for the results: the peer, TensorFlow, numpy..."""
    wanted = {peer, "tensorflow", "numpy", "protobuf", "uvloop", "uvicorn", "starlette"}
    out = subprocess.run(
        [str(python(peer, base)), "-m", "pip", "list", "--format", "freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return parse_freeze(out, wanted)


def parse_freeze(text: str, wanted: set[str]) -> dict[str, str]:
    """name -> version for the `name==version` lines whose name is wanted."""
    versions = {}
    for line in text.splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and name.lower().replace("_", "-") in wanted:
            versions[name.lower().replace("_", "-")] = version
    return versions


# The interpreter and platform the peers' venvs run on, as for the project's locks.
LOCK_PYTHON_VERSION = "3.11.7"
LOCK_PYTHON_PLATFORM = "x86_64-manylinux_2_28"
RELOCK_COMMAND = "python -m benchmarks.peers lock"


def uv_compile(source: str, constraint: Path, *options: str) -> list[str]:
    """uv compiling `source` (a file, or "-" for stdin) for the peers' interpreter and
    platform, held to `constraint`."""
    from uv import find_uv_bin

    return [
        find_uv_bin(), "pip", "compile", source,
        "--constraint", str(constraint.relative_to(ROOT)),
        "--python-version", LOCK_PYTHON_VERSION,
        "--python-platform", LOCK_PYTHON_PLATFORM,
        "--custom-compile-command", RELOCK_COMMAND,
        "--quiet", *options,
    ]  # fmt: skip


def relock_command(peer: str) -> list[str]:
    """uv compiling requirements-<peer>.in into its hashed lock, held to the service's
    TensorFlow runtime."""
    return uv_compile(
        str(in_file(peer).relative_to(ROOT)),
        RUNTIME_CONSTRAINTS,
        "--output-file", str(lock_file(peer).relative_to(ROOT)),
        "--generate-hashes",
    )  # fmt: skip


def runtime_command() -> list[str]:
    """uv compiling the service's TensorFlow pin, held to PROJECT_LOCK: its closure's pins."""
    return uv_compile("-", PROJECT_LOCK, "--no-annotate")


def write_runtime_constraints() -> Path:
    """RUNTIME_CONSTRAINTS: TensorFlow at the service's pin and everything it needs, pinned as
    the service's lock pins them."""
    tensorflow = next(
        line.split()[0]
        for line in PROJECT_LOCK.read_text().splitlines()
        if line.startswith("tensorflow==")
    )
    pinned = subprocess.run(
        runtime_command(),
        input=tensorflow + "\n",
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    header = (
        "# TensorFlow and what it pins, as requirements-service.lock has them: the runtime every\n"
        "# peer shares with the service (benchmarks/peers/venvs.py). Written by\n"
        f"#    {RELOCK_COMMAND}\n"
    )
    body = [line for line in pinned.splitlines() if line and not line.startswith("#")]
    RUNTIME_CONSTRAINTS.write_text(header + "\n".join(body) + "\n")
    return RUNTIME_CONSTRAINTS


def relock(peer: str, log=print) -> Path:
    """Compile requirements-<peer>.in into requirements-<peer>.lock (hashed) with uv, after
    writing the runtime constraints from the service's lock."""
    write_runtime_constraints()
    subprocess.run(relock_command(peer), cwd=ROOT, check=True)
    log(f"Wrote {lock_file(peer)}", flush=True)
    return lock_file(peer)


# --- the service itself on the trainer's TensorFlow, for `make bench`'s comparison -----------

# The service on TensorFlow 2.15 (the trainer's), beside its own current TensorFlow: the rows of
# `make bench` that report it on both (docs/figures.md, "Both TensorFlows").
SERVICE_ON_TF215 = "service-tf2.15"
# What the service's lock installs for OTLP export (service/tracing.py), left out there.
OTLP_PREFIXES = ("opentelemetry-exporter-otlp", "opentelemetry-proto")
TRAINING_LOCK = ROOT / "requirements-training.lock"


def lock_entries(text: str) -> dict[str, str]:
    """normalized name -> the lock's whole entry for it (its pin and its --hash lines)."""
    entries: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if line.startswith(("#", "-r ")) or not line.strip():
            continue
        if not line[0].isspace():
            name = line.split("==", 1)[0].split("[", 1)[0].strip().lower().replace("_", "-")
            entries[name] = [line]
        elif name is not None and line.strip().startswith("--hash="):
            entries[name].append(line)
    return {name: "\n".join(lines) for name, lines in entries.items()}


def service_on_tf215_requirements() -> str:
    """Hash-checked requirements of the service on TensorFlow 2.15: every entry of the
    trainer's lock (TensorFlow 2.15.1, its serving API, numpy<2, protobuf<5...), and of the
    service's lock what TensorFlow's runtime and the trainer's lock do not name (the web
    stack), as the service's lock pins it."""
    training = lock_entries(TRAINING_LOCK.read_text())
    runtime = set(lock_entries(RUNTIME_CONSTRAINTS.read_text()))
    service = lock_entries(PROJECT_LOCK.read_text())
    ours = {name: entry for name, entry in service.items() if name not in runtime | set(training)}
    ours.pop("tensorflow-serving-api", None)  # the trainer's lock has 2.15's
    # The OTLP exporter's packages need protobuf 5 and TensorFlow 2.15 protobuf 4; the
    # benchmark traces nothing, and the service imports them only when tracing is on.
    for name in [name for name in ours if name.startswith(OTLP_PREFIXES)]:
        del ours[name]
    return "\n".join([*training.values(), *ours.values()]) + "\n"


def service_on_tf215_fingerprint() -> str:
    digest = hashlib.sha256()
    for path in (TRAINING_LOCK, PROJECT_LOCK, RUNTIME_CONSTRAINTS):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def service_on_tf215_install_command(venv_python: Path, requirements: Path) -> list[str]:
    """uv installing the hash-checked requirements into the venv, as `make setup` installs the
    project's locks. Not pip: the trainer's lock pins google-api-core without the `grpc`
    extra that google-cloud-storage-control asks for, and pip's --require-hashes then
    refuses the extra as unpinned (uv installs the extra's pinned packages)."""
    from uv import find_uv_bin

    return [find_uv_bin(), "pip", "install", "--quiet", "--python", str(venv_python),
            "--require-hashes", "-r", str(requirements)]  # fmt: skip


def ensure_service_on_tf215(base: Path = PEERS_DIR, log=print) -> Path:
    """A venv with the service's packages on TensorFlow 2.15 (benchmarks/.peers/
    service-tf2.15), installed hash-checked if it is missing or stale; its python."""
    directory = venv_dir(SERVICE_ON_TF215, base)
    done = directory / ".installed"
    fingerprint_now = service_on_tf215_fingerprint()
    if done.is_file() and done.read_text().strip() == fingerprint_now:
        return directory / "bin" / "python"
    log(
        f"Installing the service's packages on TensorFlow 2.15 into {directory} "
        "(a minute or two; once per lock change)...",
        flush=True,
    )
    start = time.monotonic()
    venv_python = _create(directory)
    requirements = directory / "requirements.txt"
    requirements.write_text(service_on_tf215_requirements())
    _pip(service_on_tf215_install_command(venv_python, requirements), directory / "install.log")
    done.write_text(fingerprint_now + "\n")
    log(f"Installed it in {time.monotonic() - start:.0f} s.", flush=True)
    return venv_python
