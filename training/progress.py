"""A small progress display for loops outside a TensorFlow session (batch prediction)."""

from __future__ import annotations

import sys
import time


class ProgressBar:
    """A bar redrawn in place on a terminal; on a pipe or log, a line every tenth of the way.

    Args:
        total: the count the loop reaches.
        label: what runs, e.g. 'predict'.
        unit: what is counted, for the rate.
        stream: where to write; stderr by default.
    """

    def __init__(self, total: int, label: str, unit: str = "images", stream=None):
        self.total = max(int(total), 0)
        self.label = label
        self.unit = unit
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.done = 0
        self._start = self._last_draw = time.perf_counter()
        self._next_line = 0.1

    def update(self, n: int) -> None:
        """Count n more; redraw when it is time."""
        self.done += n
        now = time.perf_counter()
        fraction = self.done / self.total if self.total else 1.0
        if self.tty and now - self._last_draw >= 0.2:
            self._last_draw = now
            self._write(self._line(), newline=False)
        elif not self.tty and fraction >= self._next_line and self.done < self.total:
            self._next_line = (int(fraction * 10) + 1) / 10
            self._write(self._line(), newline=True)

    def close(self) -> None:
        """Write the final line."""
        self._write(self._line() + " done", newline=True)

    def _line(self) -> str:
        elapsed = time.perf_counter() - self._start
        fraction = min(self.done / self.total, 1.0) if self.total else 1.0
        filled = int(24 * fraction)
        rate = self.done / elapsed if elapsed > 0 else 0.0
        return (
            f"[{self.label}] [{'#' * filled}{'.' * (24 - filled)}] {self.done}/{self.total} "
            f"{self.unit}  {rate:,.0f} {self.unit}/s"
        )

    def _write(self, text: str, newline: bool) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + text + ("\n" if newline else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
