"""The backend the settings ask for, with the batcher in front where it belongs."""

from __future__ import annotations

import os

from artifact.model_config import ModelEntry
from service.backends.base import Backend
from service.backends.batching import BatchingBackend
from service.backends.inprocess import InProcessBackend
from service.backends.tfserving import TFServingBackend
from service.config_files import BatchOptions, batch_options
from service.settings import Settings, default_model


def make_backend(settings: Settings, models: list[ModelEntry]) -> Backend:
    """In-process TensorFlow behind the dynamic batcher, or TF Serving over gRPC.

    BACKEND=tfserving forwards every call to TF Serving, which batches on its side
    (--enable_batching), so no batcher sits in front of it here: one would serialize the calls.

    Args:
        settings: the validated settings.
        models: the model config's entries (service.settings.initial_entries).
    """
    default = default_model(settings, models)
    if settings.backend == "tfserving":
        return TFServingBackend(
            models,
            settings.tfserving_grpc_address,
            settings.tfserving_deadline_seconds,
            default_model=default,
        )
    intra_op_threads, inter_op_threads = settings.tensorflow_threads(os.cpu_count())
    backend: Backend = InProcessBackend(
        models,
        device=settings.device,
        intra_op_threads=intra_op_threads,
        inter_op_threads=inter_op_threads,
        poll_seconds=settings.model_poll_seconds,
        allow_unavailable_labels=settings.allow_version_labels_for_unavailable_models,
        default_model=default,
        allow_signature_changes=settings.allow_signature_changes,
        allow_file_system_ops=settings.allow_file_system_ops,
        model_cache_dir=settings.model_cache_dir,
        replay_warmup=settings.enable_model_warmup,
    )
    batching = batching_options(settings)
    if batching is not None and batching.max_batch_size > 1:
        backend = BatchingBackend(
            backend,
            batching.max_batch_size,
            batching.timeout_ms,
            batching.max_queue,
            batching.allowed_batch_sizes,
        )
    return backend


def batching_options(settings: Settings) -> BatchOptions | None:
    """The batcher's options: BATCHING_PARAMETERS_FILE's when it is set, else BATCH_MAX_SIZE,
    BATCH_TIMEOUT_MS and BATCH_MAX_QUEUE; None with ENABLE_BATCHING=false.

    Raises:
        ServerFileError: the file cannot be used (main() has checked it at start).
    """
    if not settings.enable_batching:
        return None
    if settings.batching_parameters_file:
        return batch_options(settings.batching_parameters_file)
    return BatchOptions(
        settings.batch_max_size, settings.batch_timeout_ms, settings.batch_max_queue
    )
