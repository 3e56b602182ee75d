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

`--repeat N` (`make test-repeat`) is the flake hunt: the chosen sides run N times over, each
run from nothing (the shared models made again), and a table lists every test that failed
in any run, how often and in which runs (from each session's JUnit XML), with each run's
time; the exit code is non-zero when any test failed in any run. A failed session's temp
folder stays in build/pytest/repeat/run-N/SIDE until the next hunt, to be looked into.
`--cpu-hog K` keeps K CPU-bound processes busy beside the sessions meanwhile, as a loaded CI
machine would.

Standard library only: it runs from any interpreter.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
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
REPEAT_DIR = ROOT / "build" / "pytest" / "repeat"
# pytest's exit codes that mean its tests ran and some failed (the rest: it could not run them).
TESTS_FAILED = 1


def interpreter(venv: str) -> Path:
    return ROOT / venv / "bin" / "python"


def side_command(side: str, extra: list[str], basetemp: Path | None = None) -> list[str]:
    venv, selection = SIDES[side]
    # A base temp folder of its own: two sessions sharing /tmp/pytest-of-<user> delete each
    # other's folders (pytest keeps the newest three there).
    basetemp = basetemp or ROOT / "build" / "pytest" / side
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


def _relay(side: str, process: subprocess.Popen, lock: threading.Lock, ended: dict) -> None:
    prefix = f"{side:<10} | "
    for line in process.stdout:
        with lock:
            sys.stdout.write(prefix + line)
            sys.stdout.flush()
    ended[side] = time.monotonic()  # its output closed: the session is over


def missing_interpreter(sides: list[str]) -> Path | None:
    for side in sides:
        python = interpreter(SIDES[side][0])
        if not python.exists():
            return python
    return None


def run(sides: list[str], extra: list[str]) -> int:
    """Start every side's session, relay their output, and wait for all; the worst exit code."""
    missing = missing_interpreter(sides)
    if missing is not None:
        print(f"error: {missing} is missing: run `make setup`", file=sys.stderr)
        return 2
    codes = {side: code for side, (code, _) in run_sides(sides, lambda side: extra).items()}
    verdicts = (f"{side} {'passed' if code == 0 else 'FAILED'}" for side, code in codes.items())
    print("sides: " + ", ".join(verdicts))
    return max(codes.values(), default=0)


def run_sides(
    sides: list[str], extra_of, folder: Path | None = None
) -> dict[str, tuple[int, float]]:
    """Every side's session at once (extra_of(side): its extra pytest arguments; folder: where
    each side's base temp folder goes, build/pytest by default), output relayed; each side's
    exit code and seconds."""
    # What an earlier run made is not this run's: its sessions make the shared models anew.
    shutil.rmtree(SHARED_DIR, ignore_errors=True)
    lock = threading.Lock()
    started = time.monotonic()
    running, ended = {}, {}
    for side in sides:
        process = subprocess.Popen(
            side_command(side, extra_of(side), folder / side if folder else None),
            cwd=ROOT,
            env=side_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        relay = threading.Thread(target=_relay, args=(side, process, lock, ended), daemon=True)
        relay.start()
        running[side] = (process, relay)
    done = {}
    try:
        for side, (process, relay) in running.items():
            code = process.wait()
            relay.join()
            seconds = ended.get(side, time.monotonic()) - started
            done[side] = (code, seconds)
            print(f"{side:<10} | exit code {code} after {seconds:.0f} s")
    except KeyboardInterrupt:
        for process, _ in running.values():
            process.terminate()
        raise
    return done


@dataclasses.dataclass(frozen=True)
class SideRun:
    """One side's session in one run of a repeat: its exit code, time and failed tests."""

    side: str
    run: int  # 1, 2, ...
    code: int
    seconds: float
    failed: tuple[str, ...]  # test ids, "module::test[params]"


def failed_tests(junit_xml: str) -> tuple[str, ...]:
    """The ids of the tests a pytest JUnit XML report records as failed or in error (a
    fixture's error counts: the test did not pass), in the report's order, each once."""
    found: list[str] = []
    for case in ElementTree.fromstring(junit_xml).iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            test = f"{case.get('classname', '')}::{case.get('name', '')}"
            if test not in found:
                found.append(test)
    return tuple(found)


def repeat_report(results: list[SideRun], repeats: int) -> tuple[str, bool]:
    """The flake hunt's table: each run's time per side, then every test that failed in any
    run with how often and in which runs, and each session that exited non-zero with no
    failed test to show for it (it crashed, or could not collect). (the text, all green)."""
    sides = list(dict.fromkeys(r.side for r in results))
    lines = [f"Repeated {repeats} time(s):"]
    for side in sides:
        times = ", ".join(
            f"run {r.run} {r.seconds:.0f} s (exit {r.code})" for r in results if r.side == side
        )
        lines.append(f"  {side}: {times}")
    runs_of: dict[str, list[int]] = {}
    for result in results:
        for test in result.failed:
            runs_of.setdefault(f"{result.side}: {test}", []).append(result.run)
    silent = [r for r in results if r.code != 0 and not r.failed]
    if not runs_of and not silent:
        lines.append(f"No test failed in any of the {repeats} run(s).")
        return "\n".join(lines), True
    if runs_of:
        width = max(len(test) for test in runs_of)
        lines.append(f"{'failed test':<{width}}  failed  in runs")
        ordered = sorted(runs_of.items(), key=lambda item: (-len(item[1]), item[0]))
        for test, runs in ordered:
            count = f"{len(runs)} of {repeats}"
            lines.append(f"{test:<{width}}  {count:<6}  {', '.join(map(str, runs))}")
    for result in silent:
        what = "tests failed" if result.code == TESTS_FAILED else "its tests did not all run"
        lines.append(
            f"{result.side}: run {result.run} exited {result.code} with no failed test "
            f"recorded ({what}: see its output above)"
        )
    return "\n".join(lines), False


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """`count` processes that keep a core busy each until the block ends."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def repeat(sides: list[str], extra: list[str], repeats: int, hogs: int) -> int:
    """Run the sides `repeats` times over (beside `hogs` CPU-bound processes); print the
    table of every test that failed in any run. 0 when none did, 1 otherwise."""
    missing = missing_interpreter(sides)
    if missing is not None:
        print(f"error: {missing} is missing: run `make setup`", file=sys.stderr)
        return 2
    shutil.rmtree(REPEAT_DIR, ignore_errors=True)
    results: list[SideRun] = []
    with cpu_hogs(hogs):
        for number in range(1, repeats + 1):
            folder = REPEAT_DIR / f"run-{number}"
            folder.mkdir(parents=True)
            print(f"=== run {number} of {repeats}: {', '.join(sides)}", flush=True)

            def junit(side: str, folder: Path = folder) -> list[str]:
                return [*extra, "--junitxml", str(folder / f"{side}.xml")]

            # A failed session's files are kept (REPEAT_DIR/run-N/SIDE) to be looked into; a
            # green one's go (the training side's are gigabytes a run).
            for side, (code, seconds) in run_sides(sides, junit, folder).items():
                report = folder / f"{side}.xml"
                failed = failed_tests(report.read_text()) if report.is_file() else ()
                results.append(SideRun(side, number, code, seconds, failed))
                if code == 0:
                    shutil.rmtree(folder / side, ignore_errors=True)
    text, green = repeat_report(results, repeats)
    print(text)
    return 0 if green else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=sorted(SIDES), action="append", help="run only this side")
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        metavar="N",
        help="the flake hunt: run the sides N times over and list every test that failed in "
        "any run",
    )
    parser.add_argument(
        "--cpu-hog",
        type=int,
        default=0,
        metavar="K",
        help="with --repeat: keep K CPU-bound processes running beside the sessions",
    )
    args, extra = parser.parse_known_args(argv)
    if args.repeat is not None and args.repeat < 1:
        parser.error(f"--repeat: must be 1 or more, got {args.repeat}")
    if args.cpu_hog < 0 or (args.cpu_hog and args.repeat is None):
        parser.error("--cpu-hog: 0 or more, and only with --repeat")
    if args.repeat is not None:
        return repeat(args.side or list(SIDES), extra, args.repeat, args.cpu_hog)
    return run(args.side or list(SIDES), extra)


if __name__ == "__main__":
    sys.exit(main())
