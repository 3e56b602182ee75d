"""The training job's user-facing errors (the command line prints them as one line)."""

from __future__ import annotations


class DataError(Exception):
    """A data file is missing or not valid; the message names the file and the problem."""


class UsageError(Exception):
    """A user's mistake: printed as one line, exit code 2."""


class NumericsError(Exception):
    """--check-numerics stopped training: a NaN or Inf in a named tensor (exit code 1)."""
