"""The Open Inference Protocol's view of a model (KServe's V2): which signature it serves, the
model metadata object and Triton's model configuration, the same over HTTP and gRPC.

Pure Python: nothing here imports TensorFlow.
"""

from __future__ import annotations

from typing import Any

from artifact.contract import SIGNATURE_NAME
from service.codecs.dtypes import v2_datatype
from service.errors import NotFound
from service.types import ModelMetadata, SignatureSpec, TensorSpec

PLATFORM = "tensorflow_savedmodel"
EXTENSIONS = ("binary_tensor_data", "model_configuration")


def render_tensor(spec: TensorSpec) -> dict:
    """A signature's tensor as V2 metadata: name, datatype and shape, -1 for any size."""
    # A tensor of unknown rank has no V2 shape; one dimension of any size says the least.
    shape = list(spec.shape) if spec.shape is not None else [-1]
    return {"name": spec.name, "datatype": v2_datatype(spec.dtype), "shape": shape}


def v2_signature_name(signatures) -> str | None:
    """The signature the Open Inference Protocol serves (it names none): `serving_default`,
    or the only one a model has (a pre-made Estimator's `predict`); None otherwise."""
    if SIGNATURE_NAME in signatures:
        return SIGNATURE_NAME
    if len(signatures) == 1:
        return next(iter(signatures))
    return None


def serving_signature(metadata: ModelMetadata) -> SignatureSpec:
    """The signature the Open Inference Protocol serves (v2_signature_name); NotFound when
    the model has none it could."""
    name = v2_signature_name(metadata.signatures)
    if name is None:
        raise NotFound(
            f"version {metadata.version} of {metadata.name} has no {SIGNATURE_NAME!r} signature "
            f"and several others ({sorted(metadata.signatures)}): the Open Inference Protocol "
            "serves one; use TF Serving's API, which names the signature"
        )
    return metadata.signatures[name]


def render_model_metadata(metadata: ModelMetadata, versions: list[int]) -> dict:
    """A version's serving signature as the V2 model metadata object."""
    signature = serving_signature(metadata)
    return {
        "name": metadata.name,
        "versions": [str(v) for v in versions],
        "platform": PLATFORM,
        "inputs": [render_tensor(spec) for spec in signature.inputs],
        "outputs": [render_tensor(spec) for spec in signature.outputs],
    }


def _config_tensor(spec: TensorSpec) -> dict:
    # Triton's dims leave out the batch dimension; a tensor that is only a batch ([-1]) is
    # dims [1] reshaped to [] (docs/user_guide/model_configuration.md, "Reshape", in
    # triton-inference-server/server).
    datatype = v2_datatype(spec.dtype)
    tensor: dict[str, Any] = {
        "name": spec.name,
        "data_type": "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}",
    }
    dims = [-1] if spec.shape is None else list(spec.shape[1:])
    tensor["dims"] = dims or [1]
    if not dims:
        tensor["reshape"] = {"shape": []}
    return tensor


def render_model_config(metadata: ModelMetadata, max_batch_size: int) -> dict:
    """A version's serving signature as Triton's model configuration (the model configuration
    extension, docs/protocol/extension_model_configuration.md in
    triton-inference-server/server): the fields of model_config.proto that a signature
    decides.

    Args:
        max_batch_size: the most images one request may hold (MAX_IMAGES).
    """
    signature = serving_signature(metadata)
    return {
        "name": metadata.name,
        "platform": PLATFORM,
        "max_batch_size": max_batch_size,
        "input": [_config_tensor(spec) for spec in signature.inputs],
        "output": [_config_tensor(spec) for spec in signature.outputs],
    }
