"""tools/podman.py's build context: the .dockerignore's files, found without walking the
folders it leaves out (a checkout's venvs hold hundreds of thousands of files)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def podman():
    spec = importlib.util.spec_from_file_location("podman_tool", ROOT / "tools" / "podman.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_tree(root: Path, files: list[str], dockerignore: str) -> None:
    (root / ".dockerignore").write_text(dockerignore)
    for path in files:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(path)


def test_the_projects_dockerignore_keeps_the_locks_and_the_three_packages(
    tmp_path, podman, monkeypatch
):
    make_tree(
        tmp_path,
        [
            "requirements-service.lock", "requirements.in", "Dockerfile",
            "artifact/contract.py", "artifact/__pycache__/contract.cpython-311.pyc",
            "service/protocols/http.py", "service/stray.pyc", "training/train.py",
            "docs/index.md", ".venv/lib/site.py", "build/pytest/a/b.txt", "tests/unit/t.py",
        ],
        (ROOT / ".dockerignore").read_text(),
    )  # fmt: skip
    walked = []
    real_walk = os.walk

    def recording_walk(top, *args, **kwargs):
        for folder, dirs, names in real_walk(top, *args, **kwargs):
            walked.append(Path(folder).relative_to(tmp_path).as_posix())
            yield folder, dirs, names

    monkeypatch.setattr(podman.os, "walk", recording_walk)
    assert podman.context_files(tmp_path) == [
        "requirements-service.lock",
        "artifact/contract.py",
        "service/protocols/http.py",
        "training/train.py",
    ]
    # What is left out whole is never entered.
    assert sorted(walked) == [".", "artifact", "service", "service/protocols", "training"]


def test_an_exception_deeper_down_is_found_inside_a_folder_left_out(tmp_path, podman):
    make_tree(
        tmp_path,
        ["docs/keep/a.md", "docs/keep/b.txt", "docs/other.md", "lib/x.py"],
        "*\n!docs/keep/*.md\n",
    )
    assert podman.context_files(tmp_path) == ["docs/keep/a.md"]
