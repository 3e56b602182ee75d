"""`python -m training --log-format json`: every line the trainer prints, on stdout and on
stderr, is one JSON object (artifact/logs.py), so a retrain CronJob's log can be parsed; its
refusals stay exit code 2, as one ERROR line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from support.helpers import REPO_ROOT

FIELDS = {"time", "level", "logger", "message"}


def run_training(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "training", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def json_lines(text: str) -> list[dict]:
    """Every line of `text`, parsed: a line that is not one JSON object fails the test."""
    entries = []
    for line in text.splitlines():
        entry = json.loads(line)
        assert isinstance(entry, dict) and set(entry) >= FIELDS, line
        entries.append(entry)
    return entries


def test_a_command_writes_only_json_lines(tmp_path):
    # After the command, as a CronJob's args would put it.
    result = run_training("sample-data", "--out", str(tmp_path / "sample"), "--log-format", "json")
    assert result.returncode == 0, result.stderr
    out, err = json_lines(result.stdout), json_lines(result.stderr)
    messages = [entry["message"] for entry in out]
    assert messages and messages[0].startswith("Wrote "), messages
    assert {entry["logger"] for entry in out} == {"training.stdout"}
    assert all(entry["logger"].startswith(("training", "tensorflow")) for entry in err), err
    assert (tmp_path / "sample" / "classification.csv").is_file()


def test_a_refusal_is_one_json_error_line(tmp_path):
    # Before the command, with `=`.
    result = run_training(
        "--log-format=json",
        "train",
        "--data-dir", str(tmp_path / "absent"),
        "--model-dir", str(tmp_path / "run"),
        "--export-dir", str(tmp_path / "models"),
        "--max-steps", "1",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert json_lines(result.stdout) == []
    (error,) = [entry for entry in json_lines(result.stderr) if entry["level"] == "ERROR"]
    assert error["message"] == f"error: {tmp_path / 'absent'}: data directory not found"
    assert error["logger"] == "training.stderr"


def test_text_stays_the_default(tmp_path):
    result = run_training("sample-data", "--out", str(tmp_path / "sample"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Wrote "), result.stdout
