"""Run the whole test suite as its two sides, each in its own venv, both at once: `make test`.

The service runs current TensorFlow and the trainer TensorFlow 2.15 (tf.estimator), each in a
venv of its own (`make setup`), so the suite is two pytest sessions:

    training   .venv-training/bin/python -m pytest tests/live/training
    service    .venv/bin/python -m pytest  (everything else: tests/unit, the rest of tests/live)

Each side reaches the other only through its command line (tests/support/sides.py, told the
interpreters by TRAINING_PYTHON and SERVICE_PYTHON here). Run at once, they keep both cores
busy: much of either session is spent waiting on a server or a subprocess. Each session's
lines are printed as they come, prefixed with its side, and the exit code is non-zero when
either fails. Extra arguments go to both pytest sessions (`--side NAME` runs one).

Standard library only: it runs from any interpreter.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAINING_TESTS = "tests/live/training"
SIDES = {
    # side: (venv, what it collects)
    "training": (".venv-training", [TRAINING_TESTS]),
    "service": (".venv", ["--ignore", TRAINING_TESTS]),
}


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
    return env


def _relay(side: str, process: subprocess.Popen, lock: threading.Lock) -> None:
    prefix = f"{side:<8} | "
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
            print(f"{side:<8} | exit code {codes[side]} after {time.monotonic() - started:.0f} s")
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
