"""Typed values the backends return and the data plane hands to the protocol adapters.

Nothing here is shaped for one protocol: the TF Serving REST adapter, the friendly /predict,
the Open Inference Protocol and gRPC each render these their own way.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Any, cast

import numpy as np


class VersionState(enum.IntEnum):
    """A version's state, TF Serving's ModelVersionStatus.State (names and numbers)."""

    UNKNOWN = 0
    START = 10
    LOADING = 20
    AVAILABLE = 30
    UNLOADING = 40
    END = 50


@dataclasses.dataclass(frozen=True)
class VersionStatus:
    """One version's state and, when it failed, TF Serving's error code and message."""

    version: int
    state: VersionState
    error_code: str = "OK"
    error_message: str = ""


# What a model call takes: each input of the signature by name, or one array (float32 images
# [n, 28, 28], the image contract's fast path, or the one input of any signature taking one).
Inputs = np.ndarray | dict[str, np.ndarray]


def rows_of(inputs: Inputs) -> int:
    """The instances a request holds: its inputs' batch dimension (1 without one)."""
    if isinstance(inputs, np.ndarray):
        return len(inputs) if inputs.ndim else 1
    for value in inputs.values():
        return len(value) if value.ndim else 1
    return 1


def inner_shapes(inputs: Inputs) -> tuple:
    """What must match for two requests' inputs to be joined along the batch dimension."""
    if isinstance(inputs, np.ndarray):
        return (inputs.shape[1:], inputs.dtype)
    return tuple((key, value.shape[1:], value.dtype) for key, value in sorted(inputs.items()))


def join_inputs(parts: list[Inputs]) -> Inputs:
    """Several requests' inputs as one batch, in order (inner_shapes equal)."""
    if isinstance(parts[0], np.ndarray):
        # Equal inner_shapes: every part is an array then.
        return _join(cast("list[np.ndarray]", parts))
    return {key: _join([part[key] for part in parts]) for key in parts[0]}


def _join(arrays: list[np.ndarray]) -> np.ndarray:
    """np.concatenate along the first axis, without letting go of the GIL.

    numpy releases the GIL for every copy of over 500 elements (one 28x28 image), and the batch
    thread then waits for it back behind the event loop, up to the interpreter's 5 ms switch
    interval each time: measured here, 4-7 ms to join 30 images that take 15 us to copy.
    bytearray.join copies under the GIL (below 1 MiB), in one pass, into an array of its own.
    """
    first = arrays[0]
    if first.ndim == 0 or first.dtype.hasobject or not all(a.flags.c_contiguous for a in arrays):
        return np.concatenate(arrays)
    # numpy declares ndarray's buffer protocol (__buffer__) to type checkers only on Python
    # 3.12 and later; it has one at run time on every version.
    joined = bytearray().join(arrays)  # type: ignore[arg-type]
    # The rows counted, not inferred: an inner dimension of 0 leaves no bytes to infer from.
    rows = sum(len(a) for a in arrays)
    return np.frombuffer(joined, dtype=first.dtype).reshape(rows, *first.shape[1:])


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One model call's result: which version answered and every output of the signature.

    `checked` is true once artifact.contract.output_problems found nothing wrong with these
    outputs, or with a batch's outputs that hold them: the data plane need not look again.
    `batch_size` is the instances of the model call that answered (the batcher's batch, its
    padding not counted); None: the request's own.
    """

    version: int
    outputs: dict[str, np.ndarray]
    checked: bool = False
    # Seconds the request waited in the batch queue before its batch ran (0: not batched).
    queued: float = 0.0
    batch_size: int | None = None


@dataclasses.dataclass(frozen=True)
class PredictResult:
    """A prediction as every protocol needs it: who answered, the outputs, the labels."""

    model: str
    version: int
    outputs: dict[str, np.ndarray]
    labels: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One named tensor a signature takes or returns.

    `dtype` is the numpy dtype (None for a TensorFlow type numpy has no match for); `shape`
    has -1 for a dimension of any size, and is None when even the rank is unknown.
    """

    name: str
    dtype: np.dtype | None
    shape: tuple[int, ...] | None

    @property
    def batched(self) -> bool:
        """Whether its first dimension is the batch, of any size (-1)."""
        return self.shape is not None and len(self.shape) >= 1 and self.shape[0] == -1


@dataclasses.dataclass(frozen=True)
class SignatureSpec:
    """A signature's method (TF Serving's predict, classify or regress) and tensors, in order."""

    name: str
    method_name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @functools.cached_property
    def batchable(self) -> bool:
        """Whether requests may share a model call (the function `batchable`); worked out once
        per signature, not per request."""
        tensors = (*self.inputs, *self.outputs)
        return bool(self.inputs) and all(spec.batched for spec in tensors)


def batchable(signature: SignatureSpec) -> bool:
    """Whether requests for a signature may share a model call: every input and output has a
    batch dimension of any size first (an input without one is fed as it is, alone)."""
    return signature.batchable


@dataclasses.dataclass(frozen=True)
class ModelMetadata:
    """A version's signatures: a SignatureDefMap proto (what TF Serving's metadata returns) and
    the same signatures as typed values, for protocols that must not parse protos (the Open
    Inference Protocol's metadata; service.codecs.signatures.signature_specs reads them off the
    proto)."""

    name: str
    version: int
    signature_defs: Any
    signatures: dict[str, SignatureSpec] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Readiness:
    """Whether the service answers predictions for its model, and if not, why."""

    ready: bool
    reason: str
    model: str
    version: int | None
    device: str
