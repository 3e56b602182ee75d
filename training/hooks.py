"""Session hooks: a progress display, model statistics, train-accuracy logging; a registry.

The hooks a model_fn attaches to its EstimatorSpec (`training_hooks`, `evaluation_hooks`,
`prediction_hooks`) are picked by name from `HOOKS`, so the Estimator's `params` (which it
deep-copies) carry names rather than hook objects holding streams.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Iterable

import numpy as np
import tensorflow as tf

from artifact.contract import INPUT_KEY
from training.heads import TRAIN_ACCURACY_TENSOR

# TensorBoard tags written by ModelStatsHook during training.
EXAMPLES_PER_SEC_TAG = "examples_per_sec"
STEP_TIME_TAG = "step_time_ms"
MODES = tf.estimator.ModeKeys
_MODE_LABELS = {MODES.TRAIN: "train", MODES.EVAL: "eval", MODES.PREDICT: "predict"}


def count_parameters(variables=None) -> int:
    """Number of scalars in the graph's trainable variables (or the given ones)."""
    if variables is None:
        variables = tf.compat.v1.trainable_variables()
    return int(sum(np.prod(v.shape.as_list()) for v in variables))


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
        self.parameter_count = count_parameters()

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
        if self._global_step is not None:
            fetches["global_step"] = self._global_step
        return tf.estimator.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        results = run_values.results
        self._steps_run += 1
        # The step fetched beside the train op may be read before or after its increment;
        # other tasks of a distributed run move it too, which only the fetched value shows.
        self._step = max(self._start_step + self._steps_run, int(results.get("global_step", 0)))
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


class ModelStatsHook(tf.estimator.SessionRunHook):
    """Reports model statistics for one Estimator run: training, evaluation or prediction.

    At the start it counts the trainable parameters; around every step it times the session
    call and reads the batch's size; at the end it writes one line: parameters, steps,
    examples/sec and step time (median and 90th percentile). In training it also writes
    `examples_per_sec` and `step_time_ms` summaries to TensorBoard every `every_n_steps`.

    Args:
        mode: the tf.estimator.ModeKeys value it runs in (names the line: train/eval/predict).
        batch_size: a scalar int tensor, the examples in this step's batch (None: not counted).
        every_n_steps: summary interval in training.
        summary_dir: where training summaries go (the model dir); None writes none.
        stream: where the line goes; stderr (looked up when written) by default.
    """

    def __init__(self, mode, batch_size=None, every_n_steps=100, summary_dir=None, stream=None):
        self.mode = mode
        self.label = _MODE_LABELS.get(mode, str(mode))
        self._batch_size = batch_size
        self.every_n_steps = every_n_steps
        self.summary_dir = summary_dir
        self.stream = stream
        self.parameter_count = 0
        self.steps = 0
        self.examples = 0
        self.step_times: list[float] = []

    @property
    def examples_per_sec(self) -> float:
        """Examples over the wall time from the first step's start to the last step's end."""
        elapsed = (self._last_end - self._first_start) if self.steps else 0.0
        return self.examples / elapsed if elapsed > 0 else 0.0

    def begin(self):
        self.parameter_count = count_parameters()
        self._global_step = tf.compat.v1.train.get_global_step()
        self._writer = (
            tf.compat.v1.summary.FileWriterCache.get(self.summary_dir)
            if self.summary_dir and self.mode == MODES.TRAIN
            else None
        )
        self.steps = self.examples = 0
        self.step_times = []
        self._first_start = self._last_end = 0.0
        self._window = (0.0, 0)  # (start time, examples) since the last summary

    def before_run(self, run_context):
        fetches = {}
        if self._batch_size is not None:
            fetches["batch_size"] = self._batch_size
        if self._writer is not None and self._global_step is not None:
            fetches["global_step"] = self._global_step
        self._start = time.perf_counter()
        if not self.steps:
            self._first_start = self._start
            self._window = (self._start, 0)
        return tf.estimator.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        self._last_end = time.perf_counter()
        self.steps += 1
        self.step_times.append(self._last_end - self._start)
        results = run_values.results
        self.examples += int(results.get("batch_size", 0))
        step = results.get("global_step")
        if step is not None and self.steps % self.every_n_steps == 0:
            # Read beside the train op: the value before its increment (as StepCounterHook).
            self._summarize(int(step) + 1)

    def end(self, session):
        if self._writer is not None:
            if self.steps % self.every_n_steps:
                self._summarize(int(session.run(self._global_step)))
            # The Estimator's own summary hooks have flushed by now: this one must too.
            self._writer.flush()
        if not self.steps:
            return
        times_ms = sorted(1000 * t for t in self.step_times)
        p90 = times_ms[min(len(times_ms) - 1, int(0.9 * len(times_ms)))]
        stream = self.stream or sys.stderr
        stream.write(
            f"[{self.label}] model stats: {self.parameter_count:,} parameters, "
            f"{self.steps} steps, {self.examples:,} examples, "
            f"{self.examples_per_sec:,.0f} examples/s, step time median "
            f"{statistics.median(times_ms):.1f} ms, p90 {p90:.1f} ms\n"
        )
        stream.flush()

    def _summarize(self, global_step: int) -> None:
        writer = self._writer
        if writer is None:  # not training, or no summary folder: nothing to write to
            return
        start, examples_before = self._window
        elapsed = self._last_end - start
        examples = self.examples - examples_before
        recent = self.step_times[-self.every_n_steps :]
        values = [
            tf.compat.v1.Summary.Value(
                tag=STEP_TIME_TAG, simple_value=1000 * statistics.median(recent)
            )
        ]
        if elapsed > 0 and examples:
            values.append(
                tf.compat.v1.Summary.Value(
                    tag=EXAMPLES_PER_SEC_TAG, simple_value=examples / elapsed
                )
            )
        writer.add_summary(tf.compat.v1.Summary(value=values), global_step)
        self._window = (self._last_end, self.examples)


@dataclasses.dataclass(frozen=True)
class HookContext:
    """What a hook factory may use, given by the model_fn that attaches the hooks.

    Attributes:
        mode: the tf.estimator.ModeKeys value.
        features: the model_fn's features dict (graph tensors).
        model_dir: the Estimator's model dir (for summaries), or None.
    """

    mode: str
    features: dict
    model_dir: str | None = None


@dataclasses.dataclass(frozen=True)
class HookEntry:
    """A registered hook: the modes it applies to and how to build it for one model_fn call."""

    modes: tuple[str, ...]
    factory: Callable[[HookContext], tf.estimator.SessionRunHook]
    description: str


def _model_stats(context: HookContext) -> ModelStatsHook:
    image = context.features[INPUT_KEY] if isinstance(context.features, dict) else context.features
    return ModelStatsHook(
        context.mode, batch_size=tf.shape(image)[0], summary_dir=context.model_dir
    )


HOOKS: dict[str, HookEntry] = {
    "model_stats": HookEntry(
        (MODES.TRAIN, MODES.EVAL, MODES.PREDICT),
        _model_stats,
        "parameter count, examples/sec and step time, in every mode (TensorBoard in training)",
    ),
    "train_accuracy": HookEntry(
        (MODES.TRAIN,),
        lambda context: train_accuracy_hook(100),
        "log the training batch's accuracy every 100 steps",
    ),
}
DEFAULT_HOOKS = ("model_stats", "train_accuracy")


def check_hook_names(names: Iterable[str]) -> tuple[str, ...]:
    """The names, checked against the registry.

    Raises:
        ValueError: a name is not registered; the message lists the known ones.
    """
    names = tuple(names)
    unknown = [name for name in names if name not in HOOKS]
    if unknown:
        raise ValueError(
            f"unknown hook {', '.join(map(repr, unknown))}; known hooks: {', '.join(HOOKS)}"
        )
    return names


def build_hooks(names: Iterable[str], context: HookContext) -> list[tf.estimator.SessionRunHook]:
    """New instances of the named hooks that apply in context.mode, in the given order.

    Raises:
        ValueError: a name is not registered.
    """
    return [
        HOOKS[name].factory(context)
        for name in check_hook_names(names)
        if context.mode in HOOKS[name].modes
    ]
