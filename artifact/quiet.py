"""Quiet TensorFlow's start-up and deprecation noise in user-facing commands, keep real problems.

Each entry point (`python -m training`, `python -m service`, the benchmark) calls
`quiet_tensorflow()` before anything else imports TensorFlow:

- TensorFlow's C++ side prints CUDA/TensorRT registration lines while it is imported on a
  machine without them; those exact lines are dropped, anything else it prints goes through.
- tf.estimator and tf.compat.v1 log a deprecation notice on the first call of every
  deprecated symbol; those are switched off where TensorFlow makes them.
- Log records at WARNING and above always reach stderr. Below that, only the lines a person
  running a command wants (training accuracy, evaluation results) are kept, unless verbose.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator

# C++ lines printed while TF is imported, or first asked for its GPUs, on a machine without
# CUDA or TensorRT (TensorFlow 2.15's words, and 2.21's: absl's notice and cuda_platform.cc).
_IMPORT_NOISE = re.compile(
    r"Unable to register cu(DNN|FFT|BLAS) factory"
    r"|TF-TRT Warning: Could not find TensorRT"
    r"|This TensorFlow binary is optimized to use available CPU instructions"
    r"|To enable the following instructions: .* rebuild TensorFlow"
    r"|oneDNN custom operations are on"
    r"|Could not find cuda drivers on your machine"
    r"|cuda_(driver|platform)\.cc.*failed call to cuInit"
    r"|All log messages before absl::InitializeLog\(\) is called are written to STDERR"
)

# INFO lines a person wants to see: LoggingTensorHook's train accuracy and evaluation results.
_EVAL_RESULT = re.compile(
    r"Saving dict for global step (?P<step>\d+): accuracy = (?P<accuracy>[\d.e-]+), "
    r"global_step = \d+, loss = (?P<loss>[\d.e-]+)"
)
_INFO_KEEP = re.compile(r"train_accuracy|Saving dict for global step")


class InfoFilter(logging.Filter):
    """Passes every WARNING and ERROR; INFO and DEBUG only when verbose or worth a person's eye.

    Evaluation results are shortened to step, accuracy and loss (the full dict has 20
    per-class metrics; the export's report carries them all).
    """

    def __init__(self, verbose: bool):
        super().__init__()
        self.verbose = verbose

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING or self.verbose:
            return True
        message = record.getMessage()
        evaluated = _EVAL_RESULT.search(message)
        if evaluated:
            record.msg, record.args = (
                "[eval] step %s: accuracy %.4f, loss %.4f",
                (evaluated["step"], float(evaluated["accuracy"]), float(evaluated["loss"])),
            )
        return bool(_INFO_KEEP.search(message))


@contextlib.contextmanager
def startup_noise_filtered() -> Iterator[None]:
    """Within: what TensorFlow's C++ side prints to stderr (file descriptor 2) is held, and
    afterwards printed again without the lines of a machine that has no CUDA or TensorRT."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines():
                if line.strip() and not _IMPORT_NOISE.search(line):
                    print(line, file=sys.stderr)


def import_tensorflow():
    """Import TensorFlow with its import-time C++ noise filtered out; return the module."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    with startup_noise_filtered():
        import tensorflow as tf
    return tf


def quiet_tensorflow(verbose: bool = False, formatter: logging.Formatter | None = None) -> None:
    """Import TensorFlow quietly and keep its log to warnings, errors and progress.

    Args:
        verbose: keep TensorFlow's INFO lines too (checkpoint saves, step rates).
        formatter: how TensorFlow's log handler writes its lines (artifact/logs.py's JSON
            formatter, for JSON logs); None: `LEVEL: message`.
    """
    tf = import_tensorflow()
    # TensorFlow's own switch for its "From ...: X is deprecated" notices (a module flag that
    # its deprecation.silence() context manager also sets).
    from tensorflow.python.util import deprecation

    deprecation._PRINT_DEPRECATION_WARNINGS = verbose
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    # Keras' graph-mode code (model_to_estimator) warns about its own deprecated internals.
    warnings.filterwarnings("ignore", category=UserWarning, module="keras")
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")
    logger = tf.get_logger()
    logger.setLevel(logging.INFO)
    logger.propagate = False
    for handler in logger.handlers:
        handler.filters.clear()
        handler.addFilter(InfoFilter(verbose))
        handler.setFormatter(formatter or logging.Formatter("%(levelname)s: %(message)s"))
    tf.autograph.set_verbosity(0)
    # SavedModel loading logs "Fingerprint not found" at INFO through absl.
    logging.getLogger("absl").setLevel(logging.WARNING)
