"""Fixtures of the training tests; plain helpers are in tests/support/training_harness.py."""

from __future__ import annotations

import io
from contextlib import redirect_stdout
from pathlib import Path
from typing import NamedTuple

import pytest
from support.training_harness import COMPARE_BATCH_SIZE, COMPARE_STEPS, call_main


class Comparison(NamedTuple):
    """What the `comparison` fixture's `python -m training compare` run produced."""

    work_dir: Path
    stdout: str


@pytest.fixture(scope="session")
def comparison(tmp_path_factory, small_data_dir) -> Comparison:
    """`compare` over every kind on the small data: COMPARE_STEPS steps each, exported.

    Treat it as read-only: the baseline, compare and TensorBoard tests share it.
    """
    work_dir = tmp_path_factory.mktemp("compare") / "work"
    out = io.StringIO()
    with redirect_stdout(out):
        code = call_main(
            "compare",
            "--data-dir", small_data_dir,
            "--work-dir", work_dir,
            "--max-steps", COMPARE_STEPS,
            "--batch-size", COMPARE_BATCH_SIZE,
            "--labels", "fashion",
        )  # fmt: skip
    assert code == 0, f"compare failed with exit code {code}:\n{out.getvalue()}"
    return Comparison(work_dir, out.getvalue())
