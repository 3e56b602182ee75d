"""Run the whole test suite as its sides, each in its own venv, all at once: `make test`.

The service runs current TensorFlow and the trainer TensorFlow 2.15 (tf.estimator), each in a
venv of its own (`make setup`), so the suite is several pytest sessions:

    training    .venv-training/bin/python -m pytest tests/live/training
    service     .venv/bin/python -m pytest tests/live  (but training and containers)
    unit        .venv/bin/python -m pytest tests/unit  (the fast tier, no TensorFlow)
    containers  .venv/bin/python -m pytest tests/live/containers

Each side reaches the other only through its command line (tests/support/sides.py, told the
interpreters by TRAINING_PYTHON and SERVICE_PYTHON here). Run at once they keep both cores
busy: much of any session is spent waiting on a server, a container or a subprocess. xdist
workers on top do not help here: measured on 2 cores, two per side took about as long
(942 s against 903 s without) for a sixth more CPU time, TensorFlow's thread pools of every
process contending for the same cores. The models every session needs are trained
once per run, by whichever process asks first, in a folder they share (TEST_SHARED_DIR,
tests/support/shared.py). Each session's lines are printed as they come, prefixed with its
name, and the exit code is non-zero when any fails. Extra arguments go to every session
(`--side NAME` runs one).

Standard library only: it runs from any interpreter.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAINING_TESTS = "tests/live/training"
CONTAINER_TESTS = "tests/live/containers"
SIDES = {
    # side: (venv, what it collects)
    "training": (".venv-training", [TRAINING_TESTS]),
    "service": (".venv", ["tests/live", "--ignore", TRAINING_TESTS, "--ignore", CONTAINER_TESTS]),
    "unit": (".venv", ["tests/unit"]),
    "containers": (".venv", [CONTAINER_TESTS]),
}
SHARED_DIR = ROOT / "build" / "pytest" / "shared"


def interpreter(venv: str) -> Path:
    return ROOT / venv / "bin" / "python"


def side_command(side: str, extra: list[str]) -> list[str]:
    venv, selection = SIDES[side]
    # A base temp folder of its own: two sessions sharing /tmp/pytest-of-<user> delete each
    # other's folders (pytest keeps the newest three there).
    basetemp = ROOT / "build" / "pytest" / side
    basetemp.parent.mkdir(parents=True, exist_ok=True)
    return [str(interpreter(venv)), "-m", "pytest", *selection, "--basetemp", str(basetemp), *extra]


def side_env() -> dict[str, str]:
    env = dict(os.environ)
    env["TRAINING_PYTHON"] = str(interpreter(SIDES["training"][0]))
    env["SERVICE_PYTHON"] = str(interpreter(SIDES["service"][0]))
    # Some machines set it: then pytest keeps no rewritten test modules, and every
    # `python -m service` a test starts compiles the project again.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONUNBUFFERED"] = "1"
    # As the Makefile exports it: the CNN's channels_first pooling runs on CPU only with oneDNN.
    env.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    env["TEST_SHARED_DIR"] = str(SHARED_DIR)
    return env


def _relay(side: str, process: subprocess.Popen, lock: threading.Lock) -> None:
    prefix = f"{side:<10} | "
    for line in process.stdout:
        with lock:
            sys.stdout.write(prefix + line)
            sys.stdout.flush()


def run(sides: list[str], extra: list[str]) -> int:
    """Start every side's session, relay their output, and wait for all; the worst exit code."""
    for side in sides:
        python = interpreter(SIDES[side][0])
        if not python.exists():
            print(f"error: {python} is missing: run `make setup`", file=sys.stderr)
            return 2
    # What an earlier run made is not this run's: its sessions make the shared models anew.
    shutil.rmtree(SHARED_DIR, ignore_errors=True)
    lock = threading.Lock()
    started = time.monotonic()
    running = {}
    for side in sides:
        process = subprocess.Popen(
            side_command(side, extra),
            cwd=ROOT,
            env=side_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        relay = threading.Thread(target=_relay, args=(side, process, lock), daemon=True)
        relay.start()
        running[side] = (process, relay)
    codes = {}
    try:
        for side, (process, relay) in running.items():
            codes[side] = process.wait()
            relay.join()
            print(f"{side:<10} | exit code {codes[side]} after {time.monotonic() - started:.0f} s")
    except KeyboardInterrupt:
        for process, _ in running.values():
            process.terminate()
        raise
    verdicts = (f"{side} {'passed' if code == 0 else 'FAILED'}" for side, code in codes.items())
    print("sides: " + ", ".join(verdicts))
    return max(codes.values(), default=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=sorted(SIDES), action="append", help="run only this side")
    args, extra = parser.parse_known_args(argv)
    return run(args.side or list(SIDES), extra)


if __name__ == "__main__":
    sys.exit(main())
