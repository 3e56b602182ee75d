"""The two sides' interpreters: the service on current TensorFlow, the trainer on TensorFlow 2.15.

The service and the trainer run in virtualenvs of their own (`make setup`: `.venv` for the
service, with the tests' tools; `.venv-training` for `python -m training`, which needs
`tf.estimator`, gone after TensorFlow 2.15). A test on one side reaches the other only through
its command line, in the other side's interpreter: a service test makes its models with
`run_training(...)`, a training test serves a version with `support.servers.start_server`
(`python -m service` in `SERVICE_PYTHON`), never by importing the other package.

`TRAINING_PYTHON` and `SERVICE_PYTHON` name the interpreters (`make test` sets both); unset,
each is the checkout's own venv when it exists, else this interpreter (one venv with both
sides, as on a machine set up before the split).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from support.helpers import REPO_ROOT

TRAINING_TIMEOUT_SECONDS = 600.0


def _interpreter(variable: str, venv: str) -> str:
    named = os.environ.get(variable)
    if named:
        return named
    own = REPO_ROOT / venv / "bin" / "python"
    return str(own) if own.exists() else sys.executable


def training_python() -> str:
    """The interpreter `python -m training` runs in (TRAINING_PYTHON, or .venv-training's)."""
    return _interpreter("TRAINING_PYTHON", ".venv-training")


def service_python() -> str:
    """The interpreter `python -m service` runs in (SERVICE_PYTHON, or .venv's)."""
    return _interpreter("SERVICE_PYTHON", ".venv")


def on_the_training_side(
    program: str,
    payload: object,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = TRAINING_TIMEOUT_SECONDS,
) -> subprocess.CompletedProcess:
    """`program` (Python source) run by the training side's interpreter, `payload` as JSON on
    its stdin, its output captured as text.

    Args:
        cwd: the working directory (default: the checkout, so `training` is this one).
        env: the whole environment (default: this process's).
    """
    return subprocess.run(
        [training_python(), "-c", program],
        input=json.dumps(payload),
        cwd=cwd or REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# One interpreter runs a batch of commands: TensorFlow's import (seconds) is paid once.
_RUN_COMMANDS = """
import json, sys
from training.__main__ import main
for argv in json.load(sys.stdin):
    code = main(argv)
    if code != 0:
        print(f"exit {code}: python -m training {' '.join(argv)}", file=sys.stderr)
        sys.exit(code)
"""


def run_trainings(
    commands: list[list[object]],
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Each command line of `python -m training` in turn, in one process of the training side's
    interpreter, stopping at the first that exits non-zero (its exit code is the process's).

    Args:
        commands: command lines after `python -m training` (str() of each part).
        cwd: the working directory (default: the checkout, so `training` is this one).
        env: the whole environment (default: this process's).
        check: fail the test, with the output, unless every command exits 0.
    """
    argvs = [[str(part) for part in argv] for argv in commands]
    done = on_the_training_side(
        _RUN_COMMANDS, argvs, cwd, env, timeout=TRAINING_TIMEOUT_SECONDS * len(argvs)
    )
    if check and done.returncode != 0:
        import pytest

        pytest.fail(
            f"python -m training exited {done.returncode}:\n"
            f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        )
    return done


def run_training(
    *argv: object, cwd: Path | None = None, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    """`python -m training ARGV...` in the training side's interpreter, output captured
    (`run_trainings` with one command)."""
    return run_trainings([list(argv)], cwd=cwd, env=env, check=check)


# Each job: a SavedModel's signature called by the training side's TensorFlow on inputs from an
# .npz file, its outputs written to another (strings as bytes arrays: no pickles either way).
_SIGNATURE_ANSWERS = """
import json, sys
import numpy as np
from artifact.quiet import import_tensorflow
tf = import_tensorflow()
for version, signature, inputs, outputs in json.load(sys.stdin):
    function = tf.saved_model.load(version).signatures[signature]
    with np.load(inputs, allow_pickle=False) as data:
        feeds = {name: tf.constant(data[name]) for name in data.files}
    answer = function(**feeds)
    np.savez(outputs, **{
        name: value.numpy().astype(bytes) if value.dtype == tf.string else value.numpy()
        for name, value in answer.items()
    })
"""


def signature_answers_on_the_training_side(
    calls: list[tuple[Path, str, dict[str, np.ndarray]]], work: Path
) -> list[dict[str, np.ndarray]]:
    """What the trainer's own TensorFlow (2.15) answers: each (version folder, signature name,
    inputs) loaded with `tf.saved_model.load` and called in one process of the training side's
    interpreter; each call's outputs by name (strings as bytes arrays)."""
    work.mkdir(parents=True, exist_ok=True)
    jobs = []
    for i, (version, signature, inputs) in enumerate(calls):
        np.savez(work / f"in-{i}.npz", **inputs)
        jobs.append(
            [str(version), signature, str(work / f"in-{i}.npz"), str(work / f"out-{i}.npz")]
        )
    done = on_the_training_side(_SIGNATURE_ANSWERS, jobs)
    assert done.returncode == 0, done.stderr[-4000:]
    answers = []
    for *_, outputs in jobs:
        with np.load(outputs, allow_pickle=False) as data:
            answers.append({name: data[name] for name in data.files})
    return answers
