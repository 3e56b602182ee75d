"""The training job's user-facing errors (the command line prints them as one line)."""

from __future__ import annotations

# A data file's problem: defined with the MNIST-format checks (artifact/idx.py, no TensorFlow).
from artifact.idx import DataError  # noqa: F401


class UsageError(Exception):
    """A user's mistake: printed as one line, exit code 2."""


class NumericsError(Exception):
    """--check-numerics stopped training: a NaN or Inf in a named tensor (exit code 1)."""
