"""The type checker and the lint commands: mypy finds no error in artifact/ and service/,
no check is switched off to hide one, and the pre-commit hooks run what `make lint` runs.

mypy keeps its cache in build/mypy ([tool.mypy] in pyproject.toml): the first run of a clone
makes it (seconds), the later ones read it."""

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
# What ships no type information, with no stubs for the versions here: typed Any.
UNTYPED = {"tensorflow", "tensorflow.*", "tensorflow_serving.*", "fsspec", "fsspec.*"}
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
    return [line.strip().replace("$(PY)", ".venv/bin/python") for line in recipe[1].splitlines()]


def package_sources() -> list[Path]:
    return [path for package in CHECKED for path in sorted((ROOT / package).rglob("*.py"))]


def test_mypy_finds_no_error_in_artifact_and_service():
    result = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    checked = re.search(r"^Success: no issues found in (\d+) source files$", result.stdout, re.M)
    assert checked, result.stdout
    # Every module of the packages was read (mypy counts a folder without code as one too).
    assert int(checked[1]) >= len(package_sources()) > 70


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
    for path in package_sources():
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


def test_make_lint_runs_ruff_then_mypy():
    assert lint_commands() == [
        ".venv/bin/python -m ruff check .",
        ".venv/bin/python -m ruff format --check .",
        ".venv/bin/python -m mypy",
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
