"""`make serve` sets up only what serving needs and serves the shipped model at once; `make
test` (`make setup`) sets up everything; the venvs' layers are installed once in either order;
Python 3.11 is found, or one line says what to install (the Makefile).

The Makefile's own commands run here: dry runs (`make -n`), and for real where they only copy
files or ask an interpreter its version.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import REPO_ROOT, tree

SHIPPED = REPO_ROOT / "models" / "shipped" / "fashion_mnist" / "1"
# Under a make of its own (CI's `make test`), make would say which directory it enters, and
# pass its flags on: each make here runs alone, as from a user's shell.
OUTER_MAKE = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")


def make(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in OUTER_MAKE}
    return subprocess.run(
        [shutil.which("make") or "make", "--no-print-directory", *args],
        cwd=REPO_ROOT, env={**base, **(env or {})}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def dry_run(*args: str) -> list[str]:
    done = make("-n", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def syncs(lines: list[str]) -> list[str]:
    """The `uv pip sync` commands, each as the lock files it names."""
    return [
        " ".join(word for word in line.split() if word.endswith(".lock"))
        for line in lines
        if " pip sync " in line
    ]


# ---- what each target installs -------------------------------------------------------------


def test_make_serve_installs_the_runtimes_and_nothing_of_the_tests():
    # -B: as from a fresh clone, every rule on the way runs.
    lines = dry_run("-B", "serve", "PORT=8123")
    assert syncs(lines) == [
        "requirements-service.lock requirements-uv.lock",
        "requirements-training.lock",
    ]
    text = "\n".join(lines)
    for tool in ("chromium", "podman", "mmdebstrap", "docker-compose", "wrk", "crd-sdks"):
        assert tool not in text, tool
    assert "apt-get install -y -qq dataset-fashion-mnist" in text  # the data, as root


def test_make_test_still_installs_everything():
    lines = dry_run("-B", "test")
    assert syncs(lines) == [
        "requirements-service.lock requirements-uv.lock",
        "requirements-service.lock requirements-dev.lock requirements-uv.lock",
        "requirements-training.lock",
        "requirements-training.lock requirements-training-dev.lock",
    ]
    text = "\n".join(lines)
    for tool in ("chromium-driver", "podman", "mmdebstrap", "docker-compose", "wrk", "crd-sdks"):
        assert tool in text, tool


@pytest.mark.parametrize("target", ["train", "retrain"])
def test_training_targets_install_the_trainers_runtime_only(target):
    assert syncs(dry_run("-B", target)) == ["requirements-training.lock"]


# ---- the layers' stamps: installed once, in either order ------------------------------------

LOCKS = [
    REPO_ROOT / name
    for name in (
        "requirements-uv.lock", "requirements-service.lock", "requirements-dev.lock",
        "requirements-training.lock", "requirements-training-dev.lock", "pyproject.toml",
        "deploy/kubernetes/crd-sdks.txt",
    )
]  # fmt: skip


class Venvs:
    """Both venvs' stamps (and uv) in a temporary folder, each at a time we choose."""

    def __init__(self, root: Path):
        self.root = root
        # Every stamp newer than every lock unless a test says otherwise. A checkout gives its
        # files the time each was written, which can be minutes apart (a merge rewrites only
        # the locks it changed): "older" is measured from the oldest lock, "newer" from the newest.
        self.now = max(path.stat().st_mtime for path in LOCKS) + 100
        self.oldest = min(path.stat().st_mtime for path in LOCKS)
        self.paths = {
            "uv": root / "venv" / "bin" / "uv",
            "service": root / "venv" / ".installed-service",
            "dev": root / "venv" / ".installed",
            "crd": root / "venv" / "crd-sdks" / ".downloaded",
            "training": root / "training" / ".installed-runtime",
            "training-dev": root / "training" / ".installed",
        }
        for name, path in self.paths.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
            self.at(name, 0)

    def before_every_lock(self, name: str) -> None:
        moment = self.oldest - 100
        os.utime(self.paths[name], (moment, moment))

    def at(self, name: str, seconds: float) -> None:
        """Stamp `name` made `seconds` after the others' base time, itself newer than every
        lock (before_every_lock stamps older than all of them)."""
        moment = self.now + seconds
        os.utime(self.paths[name], (moment, moment))

    def syncs(self, target: str) -> list[str]:
        return syncs(
            dry_run(target, f"VENV={self.root}/venv", f"TRAINING_VENV={self.root}/training")
        )


@pytest.fixture
def venvs(tmp_path) -> Venvs:
    return Venvs(tmp_path)


def test_nothing_is_installed_again_when_nothing_changed(venvs):
    venvs.at("dev", 10)
    venvs.at("training-dev", 10)
    venvs.at("crd", 20)
    assert venvs.syncs("runtime") == []
    assert venvs.syncs("venv") == []


def test_make_serve_after_make_test_keeps_the_tools(venvs):
    # make test synced the tools' layers after the runtimes' ones: make serve has nothing to do
    # (a sync of the runtime alone would take the tools away, and make test would put them back).
    venvs.at("dev", 10)
    venvs.at("training-dev", 10)
    assert venvs.syncs("runtime") == []


def test_make_test_after_a_runtime_sync_puts_the_tools_back_only(venvs):
    # make serve synced a runtime again (its lock changed) after the tools' layer was made.
    venvs.at("service", 10)
    venvs.at("training", 10)
    venvs.at("crd", 20)
    assert venvs.syncs("venv") == [
        "requirements-service.lock requirements-dev.lock requirements-uv.lock",
        "requirements-training.lock requirements-training-dev.lock",
    ]


def test_a_changed_runtime_lock_syncs_the_runtime_then_the_tools(venvs):
    for name in ("service", "dev", "training", "training-dev", "crd"):
        venvs.before_every_lock(name)  # each lock "changed" since
    assert venvs.syncs("venv") == [
        "requirements-service.lock requirements-uv.lock",
        "requirements-service.lock requirements-dev.lock requirements-uv.lock",
        "requirements-training.lock",
        "requirements-training.lock requirements-training-dev.lock",
    ]


# ---- the shipped model ----------------------------------------------------------------------


def serve_commands(*settings: str) -> list[str]:
    """`make serve`'s own commands (its set-up taken as done)."""
    return dry_run("-o", "runtime", "-o", "data", "serve", "PORT=8123", *settings)


def test_make_serve_serves_the_shipped_model_when_no_version_is_exported(tmp_path):
    lines = serve_commands(f"MODEL_BASE_PATH={tmp_path}")
    (first_version,) = [line for line in lines if line.startswith("if ! ls -d ")]
    assert first_version.startswith(f"if ! ls -d {tmp_path}/fashion_mnist/[0-9]* ")
    assert "cp -R models/shipped/fashion_mnist/1 " in first_version
    assert "-m training train" not in "\n".join(lines)
    assert lines[-1] == (
        f"MODEL_NAME=fashion_mnist MODEL_BASE_PATH={tmp_path} HOST=127.0.0.1 PORT=8123 "
        ".venv/bin/python -m service"
    )


@pytest.mark.parametrize(
    "setting",
    [
        pytest.param("MODEL_NAME=digits", id="another-name"),
        pytest.param("DATA_DIR=/srv/mnist", id="other-data"),
    ],
)
def test_another_model_is_trained_first_as_before(tmp_path, setting):
    lines = serve_commands(f"MODEL_BASE_PATH={tmp_path}", setting)
    (first_version,) = [line for line in lines if line.startswith("if ! ls -d ")]
    assert "-m training train --data-dir " in first_version
    assert "models/shipped" not in "\n".join(lines)


def test_the_shipped_model_is_copied_whole_as_version_1(tmp_path):
    done = make("shipped-model", f"MODEL_BASE_PATH={tmp_path}")
    assert done.returncode == 0, done.stderr
    assert "serving the shipped model as version 1" in done.stdout
    model = tmp_path / "fashion_mnist"
    assert [p.name for p in model.iterdir()] == ["1"]  # no staging folder left behind
    copied, shipped = tree(model / "1"), tree(SHIPPED)
    assert copied.keys() == shipped.keys()
    for name, (is_dir, mode, size, _mtime, digest) in shipped.items():
        assert copied[name][:3] == (is_dir, mode, size) and copied[name][4] == digest, name


@pytest.mark.parametrize("existing", ["1", "7"])
def test_an_exported_version_is_left_alone(tmp_path, existing):
    version = tmp_path / "fashion_mnist" / existing
    version.mkdir(parents=True)
    before = tree(tmp_path)
    done = make("shipped-model", f"MODEL_BASE_PATH={tmp_path}")
    assert (done.returncode, done.stdout) == (0, "")
    assert tree(tmp_path) == before


def test_the_shipped_model_stays_small():
    files = [path for path in SHIPPED.rglob("*") if path.is_file()]
    names = {str(path.relative_to(SHIPPED)) for path in files}
    assert {"saved_model.pb", "assets.extra/labels.txt", "assets.extra/evaluation.json"} <= names
    assert 100_000 < sum(path.stat().st_size for path in files) < 600_000


# ---- Python 3.11 ----------------------------------------------------------------------------

FAKE_312 = '#!/bin/sh\ncase "$1" in -V|--version) echo "Python 3.12.1"; exit 0;; esac\nexit 1\n'


def interpreters(root: Path, **scripts: str) -> dict[str, str]:
    """A PATH holding only these interpreters (name -> script; `real` runs this 3.11)."""
    root.mkdir()
    for name, script in scripts.items():
        path = root / name
        path.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n' if script == "real" else script)
        path.chmod(0o755)
    return {"PATH": str(root)}


def python_choice(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    probe = "probe-python: ; @$(check_python) && echo chose $(PYTHON)"
    return make("--eval", probe, "probe-python", *args, env=env)


@pytest.mark.parametrize(
    "scripts, chosen",
    [
        pytest.param({"python3.11": "real", "python3": FAKE_312}, "python3.11", id="python3.11"),
        pytest.param({"python3": "real"}, "python3", id="python3-is-3.11"),
    ],
)
def test_python_311_is_found(tmp_path, scripts, chosen):
    done = python_choice(interpreters(tmp_path / "bin", **scripts))
    assert (done.returncode, done.stdout) == (0, f"chose {chosen}\n"), done.stderr


def test_a_python_given_is_used(tmp_path):
    env = interpreters(tmp_path / "bin", python3=FAKE_312)
    done = python_choice(env, f"PYTHON={sys.executable}")
    assert (done.returncode, done.stdout) == (0, f"chose {sys.executable}\n"), done.stderr


@pytest.mark.parametrize(
    "scripts, found",
    [
        pytest.param({"python3": FAKE_312}, "Python 3.12.1", id="python3-is-3.12"),
        pytest.param({}, "not found", id="no-python"),
    ],
)
def test_without_python_311_one_line_says_what_to_install(tmp_path, scripts, found):
    done = python_choice(interpreters(tmp_path / "bin", **scripts))
    assert done.returncode != 0
    (line,) = done.stdout.splitlines()
    assert line.startswith(f"Python 3.11 is needed, and python3 is {found}: install python3.11")
    assert "make PYTHON=/path/to/python3.11" in line


def test_the_check_runs_before_either_venv_is_made():
    # Both venvs are made only after the interpreter passed (a fresh clone: -B).
    lines = dry_run("-B", "runtime")
    made = [line for line in lines if "-m venv .venv" in line or " venv --quiet " in line]
    assert len(made) == 2, made
    for line, command in zip(made, ("-m venv .venv", " venv --quiet "), strict=True):
        assert line.index("sys.version_info[:2] != (3, 11)") < line.index(command)
