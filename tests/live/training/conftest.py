"""Fixtures of the training tests; plain helpers are in tests/support/training_harness.py."""

from __future__ import annotations

import io
from contextlib import redirect_stdout
from pathlib import Path
from typing import NamedTuple

import pytest
from support.shared import shared_folder
from support.training_harness import COMPARE_BATCH_SIZE, COMPARE_STEPS, call_main

from training import determinism

# The tests run `python -m training` in this process (call_main), and TensorFlow sizes its
# intra-op pool once per process: here, before any test runs an op, as a `--deterministic`
# command of its own sizes it.
determinism.pin_thread_pools()


class Comparison(NamedTuple):
    """What the `comparison` fixture's `python -m training compare` run produced."""

    work_dir: Path
    stdout: str


@pytest.fixture(scope="session")
def comparison(tmp_path_factory, small_data_dir) -> Comparison:
    """`compare` over every kind on the small data: COMPARE_STEPS steps each, exported.

    Treat it as read-only: the baseline, compare and TensorBoard tests share it.
    """

    def make(root: Path) -> None:
        out = io.StringIO()
        with redirect_stdout(out):
            code = call_main(
                "compare",
                "--data-dir", small_data_dir,
                "--work-dir", root / "work",
                "--max-steps", COMPARE_STEPS,
                "--batch-size", COMPARE_BATCH_SIZE,
                "--labels", "fashion",
                "--deterministic",
            )  # fmt: skip
        assert code == 0, f"compare failed with exit code {code}:\n{out.getvalue()}"
        (root / "stdout.txt").write_text(out.getvalue())

    root = shared_folder(tmp_path_factory, "compare", make)
    return Comparison(root / "work", (root / "stdout.txt").read_text())
