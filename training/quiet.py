"""Quiet TensorFlow's start-up and deprecation noise in user-facing commands, keep real errors.

TensorFlow prints CUDA/TensorRT registration lines from C++ when it is imported, and the
Estimator API logs deprecation warnings on every call. Those lines are dropped by pattern;
anything else TensorFlow writes (a real error) still reaches stderr.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
import warnings

# C++ lines printed while TF is imported on a machine without CUDA or TensorRT.
_IMPORT_NOISE = re.compile(
    r"Unable to register cu(DNN|FFT|BLAS) factory"
    r"|TF-TRT Warning: Could not find TensorRT"
    r"|This TensorFlow binary is optimized to use available CPU instructions"
    r"|To enable the following instructions: .* rebuild TensorFlow"
    r"|oneDNN custom operations are on"
    r"|Could not find cuda drivers on your machine"
    r"|cuda_driver\.cc.*failed call to cuInit"
)
# Python-side warnings logged by tf.estimator / tf.compat.v1 at every call.
_LOG_NOISE = re.compile(
    r"is deprecated|deprecat|Instructions for updating|Use .* instead\.$"
    r"|Using temporary folder|Using default config|Estimator's model_fn .* includes params"
    r"|The name tf\.\S+ is deprecated|Layer .* is casting an input tensor"
    r"|Checkpoint directory|Tensorflow Serving"
    # Asynchronous (parameter server) training: another task may have moved the step.
    r"|global step \(tf\.train\.get_global_step\) has not been increased"
    # A TF_CONFIG evaluator polls faster than the chief saves checkpoints.
    r"|No new checkpoint ready for evaluation"
    # Every exported version gets its own predictor, traced once; TF counts that as retracing.
    r"|SavedModelPredictor\._runner.* triggered tf\.function retracing"
)


# INFO lines a person wants to see: LoggingTensorHook's train accuracy and evaluation results.
_EVAL_RESULT = re.compile(
    r"Saving dict for global step (?P<step>\d+): accuracy = (?P<accuracy>[\d.e-]+), "
    r"global_step = \d+, loss = (?P<loss>[\d.e-]+)"
)
_INFO_KEEP = re.compile(r"train_accuracy|Saving dict for global step")


class _DropNoise(logging.Filter):
    def __init__(self, verbose: bool):
        super().__init__()
        self.verbose = verbose

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if _LOG_NOISE.search(message):
            return False
        evaluated = _EVAL_RESULT.search(message)
        if evaluated and not self.verbose:
            # The full dict has 20 per-class metrics; the export's report carries them all.
            record.msg, record.args = (
                "[eval] step %s: accuracy %.4f, loss %.4f",
                (
                    evaluated["step"],
                    float(evaluated["accuracy"]),
                    float(evaluated["loss"]),
                ),
            )
        return record.levelno >= logging.WARNING or self.verbose or bool(_INFO_KEEP.search(message))


def import_tensorflow():
    """Import TensorFlow with its import-time C++ noise filtered out; return the module."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines():
                if line.strip() and not _IMPORT_NOISE.search(line):
                    print(line, file=sys.stderr)
    return tf


def quiet_tensorflow(verbose: bool = False) -> None:
    """Silence deprecation noise from TensorFlow's loggers; keep warnings, errors and progress.

    Args:
        verbose: keep TensorFlow's INFO lines too (checkpoint saves, step rates).
    """
    tf = import_tensorflow()
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
        handler.addFilter(_DropNoise(verbose))
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    tf.autograph.set_verbosity(0)
    # SavedModel loading logs "Fingerprint not found" at INFO through absl.
    logging.getLogger("absl").setLevel(logging.WARNING)
