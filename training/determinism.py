"""`--deterministic`: training that repeats bit for bit (`train`, `retrain`, `compare`).

What made two runs of the same command differ, and what takes that away:

- The initial weights. Keras 2.15's initializers draw a seed of their own from Python's
  `random` when they are given none, whatever the graph's seed (RunConfig's tf_random_seed):
  every model built of Keras layers (the CNN, `keras`, the image-folder kinds) started from
  other weights on every run, --seed or not. Given a run's seed, each layer's initializer
  now gets one derived from it and from the layer's name (`kernel_initializer`), with or
  without --deterministic. The pre-made Estimators' initializers follow the graph's seed.
- The order of the examples: every shuffle and sampling takes the run's seed, and
  `--deterministic` without --seed uses DEFAULT_SEED.
- The ops: `tf.config.experimental.enable_op_determinism()` for the command (undone when it
  returns, for callers that run several commands in one process). It is one switch of
  TensorFlow's C++ runtime, read by graph-mode sessions as by eager ops (TF_DETERMINISTIC_OPS=1
  sets the same one): tf.data keeps its order whatever a dataset's options say, a kernel
  without a deterministic form fails instead of running, and an unseeded random op is refused.
- The threads: the Estimator's sessions run with INTRA_OP_THREADS and INTER_OP_THREADS
  (RunConfig's session_config; the inter-op threads are each session's own), and so does
  the process's eager context (data scans, the exported model's evaluation) when no
  TensorFlow op ran before the command: TensorFlow makes one intra-op pool per process,
  sized by whichever asks first (a session or the eager context), and keeps it.

Measured here (TF 2.15.1, 2 cores): with the seeded initializers, the same command gives
bit-identical checkpoints with 1, 2 or 8 intra-op threads and under a second CPU-bound
process; before them, no two runs of the CNN started from the same weights.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import sys
from collections.abc import Iterator

import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

# TensorFlow 2.15 exports enable_op_determinism only; the state and its undoing live here.
from tensorflow.python.framework import config as tf_config

from training.configs import DEFAULT_SEED

INTRA_OP_THREADS = 2
INTER_OP_THREADS = 1


def add_argument(p: argparse.ArgumentParser) -> None:
    """--deterministic (train, retrain and compare)."""
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="repeat bit for bit: the same command on the same data gives the same "
        "checkpoints, metrics and exported predictions on every run on this machine (seeded "
        f"weights and shuffles, --seed {DEFAULT_SEED} unless given; TensorFlow's op "
        f"determinism; {INTRA_OP_THREADS} intra-op and {INTER_OP_THREADS} inter-op threads)",
    )


def layer_seed(seed: int | None, layer: str) -> int | None:
    """The seed of one layer's initializer, from the run's seed and the layer's name (None:
    unseeded). Each layer gets its own: two layers of one shape must not start alike."""
    if seed is None:
        return None
    digest = hashlib.blake2b(f"{seed}/{layer}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") >> 1  # below 2**31: Keras passes it as an int32


def kernel_initializer(seed: int | None, layer: str):
    """Keras's default kernel initializer (Glorot uniform), seeded from the run's seed."""
    if seed is None:
        return "glorot_uniform"
    return tf.keras.initializers.GlorotUniform(seed=layer_seed(seed, layer))


def session_config(deterministic: bool) -> tf.compat.v1.ConfigProto | None:
    """The Estimator's session config for a deterministic run (the Estimator's default plus
    the fixed thread counts); None, the Estimator's own default, otherwise."""
    if not deterministic:
        return None
    rewrite = rewriter_config_pb2.RewriterConfig(
        meta_optimizer_iterations=rewriter_config_pb2.RewriterConfig.ONE
    )
    return tf.compat.v1.ConfigProto(
        allow_soft_placement=True,
        graph_options=tf.compat.v1.GraphOptions(rewrite_options=rewrite),
        intra_op_parallelism_threads=INTRA_OP_THREADS,
        inter_op_parallelism_threads=INTER_OP_THREADS,
        use_per_session_threads=True,
    )


def pin_thread_pools() -> bool:
    """Size the process's eager context (and so its intra-op pool, when it is the first to
    make one) as a deterministic session is sized. False when TensorFlow already runs in
    this process with other counts, which cannot change any more."""
    threading = tf.config.threading
    try:
        threading.set_intra_op_parallelism_threads(INTRA_OP_THREADS)
        threading.set_inter_op_parallelism_threads(INTER_OP_THREADS)
    except RuntimeError:  # set before, to other counts, and in use
        return False
    return True


@contextlib.contextmanager
def applied(deterministic: bool) -> Iterator[None]:
    """A command's run with --deterministic (nothing without it): the thread pools pinned, op
    determinism on until the command returns (the command's config defaults the seed:
    training/configs.py's run_seed)."""
    if not deterministic:
        yield
        return
    if not pin_thread_pools():
        print(
            "note: --deterministic: TensorFlow already runs in this process with "
            f"{tf.config.threading.get_intra_op_parallelism_threads()} intra-op threads (0: "
            f"one per core), which it keeps; a command of its own runs with {INTRA_OP_THREADS}",
            file=sys.stderr,
        )
    was_enabled = tf_config.is_op_determinism_enabled()
    tf.config.experimental.enable_op_determinism()
    try:
        yield
    finally:
        if not was_enabled:
            tf_config.disable_op_determinism()
