"""TensorFlow's process-wide setup for the in-process backend: device, threads, GPU memory."""

from __future__ import annotations

import logging

import tensorflow as tf

from artifact.quiet import startup_noise_filtered

log = logging.getLogger("service.backends.device")


class DeviceError(RuntimeError):
    """DEVICE=gpu was asked for and TensorFlow sees no GPU."""


def configure_tensorflow(device: str, intra_op_threads: int, inter_op_threads: int) -> str:
    """Set threads and GPU memory growth before TF initialises; return the device to use.

    TF takes these settings only before its runtime starts; when it already runs in this
    process (a test suite, a second app) with other values, it keeps them and says so.

    Args:
        device: 'auto' (a GPU when TF sees one), 'cpu' or 'gpu'.
        intra_op_threads, inter_op_threads: TF's thread pools (0 = TF's default).
    Returns:
        '/GPU:0' or '/CPU:0'.
    Raises:
        DeviceError: device is 'gpu' and no GPU is visible.
    """
    # TensorFlow 2.21 logs a failed cuInit at ERROR level on a machine without a GPU.
    with startup_noise_filtered():
        gpus = tf.config.list_physical_devices("GPU")
    if device == "gpu" and not gpus:
        raise DeviceError("DEVICE=gpu but TensorFlow sees no GPU (is the CUDA build installed?)")
    use_gpu = device != "cpu" and bool(gpus)
    threading = tf.config.threading
    try:
        if threading.get_intra_op_parallelism_threads() != intra_op_threads:
            threading.set_intra_op_parallelism_threads(intra_op_threads)
        if threading.get_inter_op_parallelism_threads() != inter_op_threads:
            threading.set_inter_op_parallelism_threads(inter_op_threads)
        for gpu in gpus if use_gpu else ():
            # Grow into GPU memory as needed rather than taking the whole card at start.
            if not tf.config.experimental.get_memory_growth(gpu):
                tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError as err:
        log.warning("TensorFlow already started in this process; keeping its settings (%s)", err)
    return "/GPU:0" if use_gpu else "/CPU:0"
