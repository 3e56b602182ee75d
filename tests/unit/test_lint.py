"""The type checker and the lint commands: mypy finds no error in artifact/ and service/
(in the service's venv) nor in training/ (against the trainer's venv), no check is switched
off to hide one, and the pre-commit hooks run what `make lint` runs.

mypy keeps its caches under build/ (build/mypy, build/mypy-training): the first run of a
clone makes them (seconds), the later ones read them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("artifact", "service")
TRAINING_PYTHON = ROOT / ".venv-training" / "bin" / "python"
# What ships no type information, with no stubs for the versions here: typed Any (protobuf
# only in the trainer's venv: the service's has its stubs).
UNTYPED = {
    "tensorflow",
    "tensorflow.*",
    "tensorflow_serving.*",
    "tensorboard.*",
    "fsspec",
    "fsspec.*",
    "google.protobuf",
    "google.protobuf.*",
}
# Settings that would hide errors rather than find them.
WEAKENING = (
    "ignore_errors",
    "ignore_missing_imports",
    "disable_error_code",
    "follow_imports",
    "exclude",
    "implicit_optional",
    "allow_untyped_globals",
)
IGNORE = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[a-z, -]+\])?")


def mypy_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]


def lint_commands() -> list[str]:
    """`make lint`'s recipe, a command a line, the venv's Python spelled out."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^lint: .*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe, "Makefile has no lint target"
    return [
        line.strip()
        .replace("$(PY)", ".venv/bin/python")
        .replace("$(TPY)", ".venv-training/bin/python")
        for line in recipe[1].splitlines()
    ]


def package_sources(*packages: str) -> list[Path]:
    return [path for package in packages for path in sorted((ROOT / package).rglob("*.py"))]


def run_mypy(*options: str) -> int:
    """mypy from the service's venv with these options; the number of files it checked."""
    result = subprocess.run(
        [sys.executable, "-m", "mypy", *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    checked = re.search(r"^Success: no issues found in (\d+) source files$", result.stdout, re.M)
    assert checked, result.stdout
    return int(checked[1])


def test_mypy_finds_no_error_in_artifact_and_service():
    # Every module of the packages was read (mypy counts a folder without code as one too).
    assert run_mypy() >= len(package_sources(*CHECKED)) > 70


def test_mypy_finds_no_error_in_training_on_the_trainers_venv():
    """training/ imports TF 2.15 and tf.estimator, which only the trainer's venv has: mypy
    (the service venv's) reads that venv's packages (numpy 1.26's types among them)."""
    assert TRAINING_PYTHON.exists(), "no .venv-training: `make setup` makes it"
    checked = run_mypy(
        "--python-executable", str(TRAINING_PYTHON), "--cache-dir", "build/mypy-training",
        "-p", "training",
    )  # fmt: skip
    assert checked >= len(package_sources("training")) > 30


def test_no_check_is_switched_off_to_hide_an_error():
    config = mypy_config()
    assert sorted(config["packages"]) == sorted(CHECKED)
    assert config["python_version"] == "3.11"
    assert config["check_untyped_defs"] is True
    # A `# type: ignore` that no longer hides an error is an error itself.
    assert config["warn_unused_ignores"] is True
    assert not [key for key in config if key in WEAKENING]
    for override in config.get("overrides", []):
        assert set(override) == {"module", "ignore_missing_imports"}, override
        assert set(override["module"]) <= UNTYPED, override


def test_each_type_ignore_names_its_error_and_says_why():
    """Allowed where a library's stubs are wrong: with the error's code, and a comment above
    saying what the stubs get wrong."""
    found = []
    for path in package_sources(*CHECKED, "training"):
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            ignore = IGNORE.search(line)
            if ignore is None:
                continue
            found.append(path)
            where = f"{path.relative_to(ROOT)}:{number + 1}"
            assert ignore["codes"], f"{where}: a bare `# type: ignore` hides any error"
            assert number and lines[number - 1].strip().startswith("#"), (
                f"{where}: say on the line above why the library's types are wrong"
            )
    assert len(found) <= 5, found  # a few, each a library's fault


@pytest.mark.parametrize(
    "line, bare",
    [
        pytest.param("x = f(y)  # type: ignore", True, id="bare"),
        pytest.param("x = f(y)  # type:ignore", True, id="bare-no-space"),
        pytest.param("x = f(y)  # type: ignore[arg-type]", False, id="with-code"),
        pytest.param("x = f(y)  # type: ignore[arg-type, union-attr]", False, id="codes"),
    ],
)
def test_the_ignore_pattern_tells_a_bare_ignore_from_one_with_a_code(line, bare):
    ignore = IGNORE.search(line)
    assert ignore is not None and (ignore["codes"] is None) == bare


def test_make_lint_runs_ruff_then_mypy_on_both_sides():
    assert lint_commands() == [
        ".venv/bin/python -m ruff check .",
        ".venv/bin/python -m ruff format --check .",
        ".venv/bin/python -m mypy",
        ".venv/bin/python -m mypy --python-executable .venv-training/bin/python "
        "--cache-dir build/mypy-training -p training",
    ]


def test_the_pre_commit_hooks_run_make_lints_commands_from_the_venv():
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    # Local hooks only: no hook repository is cloned, nothing is fetched when they run.
    assert [repo["repo"] for repo in config["repos"]] == ["local"]
    hooks = config["repos"][0]["hooks"]
    assert [hook["entry"] for hook in hooks] == lint_commands()
    for hook in hooks:
        # The command as it is, over the whole tree, as make lint runs it.
        assert hook["language"] == "unsupported", hook
        assert hook["pass_filenames"] is False, hook


def test_pre_commit_reads_the_config(tmp_path):
    """pre-commit's own schema check (its hook keys and languages), offline."""
    result = subprocess.run(
        [sys.executable, "-m", "pre_commit", "validate-config", ".pre-commit-config.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PRE_COMMIT_HOME": str(tmp_path)},
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
