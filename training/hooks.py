"""Session hooks: a progress display with model statistics, and train-accuracy logging."""

from __future__ import annotations

import sys
import time

import numpy as np
import tensorflow as tf

TRAIN_ACCURACY_TENSOR = "train_accuracy"


class ProgressHook(tf.estimator.SessionRunHook):
    """Reports the parameter count at start, then step, loss, examples/sec and ETA.

    On a terminal the line redraws in place a few times a second; elsewhere (CI, a log file)
    it prints one line every `every_n_steps` and a last one at the end.

    Args:
        max_steps: the step training stops at (for the bar and the ETA); None for evaluation.
        batch_size: examples per step, for examples/sec.
        label: what is running ('train', 'eval').
        every_n_steps: line interval when the output is not a terminal.
        stream: where to write (stderr by default).
    """

    def __init__(self, max_steps, batch_size, label="train", every_n_steps=100, stream=None):
        self.max_steps = max_steps
        self.batch_size = batch_size
        self.label = label
        self.every_n_steps = every_n_steps
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.parameter_count = 0
        self.examples_per_sec = 0.0

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()
        losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)
        self._loss = losses[-1] if losses else None
        self.parameter_count = int(
            sum(np.prod(v.shape.as_list()) for v in tf.compat.v1.trainable_variables())
        )

    def after_create_session(self, session, coord):
        self._start_step = (
            int(session.run(self._global_step)) if self._global_step is not None else 0
        )
        self._start_time = self._last_draw = time.perf_counter()
        self._steps_run = 0
        self._last_loss = float("nan")
        self._write(
            f"[{self.label}] {self.parameter_count:,} trainable parameters; "
            f"starting at step {self._start_step}"
            + (f" of {self.max_steps}" if self.max_steps else ""),
            newline=True,
        )

    def before_run(self, run_context):
        fetches = {}
        if self._loss is not None:
            fetches["loss"] = self._loss
        return tf.estimator.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        results = run_values.results
        self._steps_run += 1
        # The step fetched beside the train op may be read before or after its increment.
        self._step = self._start_step + self._steps_run
        self._last_loss = float(results.get("loss", float("nan")))
        now = time.perf_counter()
        elapsed = now - self._start_time
        self.examples_per_sec = self._steps_run * self.batch_size / elapsed if elapsed > 0 else 0.0
        if self.tty and now - self._last_draw >= 0.25:
            self._last_draw = now
            self._write(self._line(elapsed))
        elif not self.tty and self._step % self.every_n_steps == 0:
            self._write(self._line(elapsed), newline=True)

    def end(self, session):
        if self._steps_run:
            self._write(self._line(time.perf_counter() - self._start_time) + " done", newline=True)

    def _line(self, elapsed: float) -> str:
        parts = [f"[{self.label}]"]
        if self.max_steps:
            done = self._step / self.max_steps
            filled = int(24 * min(done, 1.0))
            parts.append(f"[{'#' * filled}{'.' * (24 - filled)}] {self._step}/{self.max_steps}")
        else:
            parts.append(f"step {self._step}")
        parts.append(f"loss {self._last_loss:.4f}")
        parts.append(f"{self.examples_per_sec:,.0f} examples/s")
        step_rate = self._steps_run / elapsed if elapsed > 0 else 0.0
        if self.max_steps and step_rate > 0:
            remaining = max(self.max_steps - self._step, 0) / step_rate
            parts.append(f"ETA {int(remaining // 60)}:{int(remaining % 60):02d}")
        return "  ".join(parts)

    def _write(self, text: str, newline: bool = False) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + text + ("\n" if newline else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def train_accuracy_hook(every_n_iter: int = 100) -> tf.estimator.LoggingTensorHook:
    """LoggingTensorHook that logs the running training accuracy every `every_n_iter` steps."""
    return tf.estimator.LoggingTensorHook(
        {TRAIN_ACCURACY_TENSOR: TRAIN_ACCURACY_TENSOR}, every_n_iter=every_n_iter
    )
