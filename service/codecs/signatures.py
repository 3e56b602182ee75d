"""A SignatureDefMap proto as typed signatures (service.types.SignatureSpec), and the image
contract's signature, which the readers specialise for.

The proto is read through its fields alone (the callers hand it in): nothing here imports
TensorFlow or its protos, which take seconds to import.
"""

from __future__ import annotations

import numpy as np

from artifact.contract import IMAGE_SHAPE, INPUT_KEY
from service.codecs.dtypes import NUMPY_OF_TF
from service.types import SignatureSpec, TensorSpec

# The image contract's one input: float32 images [n, 28, 28] (artifact.contract).
IMAGE_INPUT = TensorSpec(INPUT_KEY, np.dtype(np.float32), (-1, *IMAGE_SHAPE))
IMAGE_ELEMENTS = int(np.prod(IMAGE_SHAPE))
IMAGE_BATCH_SHAPE = [-1, *IMAGE_SHAPE]


def is_image_signature(signature: SignatureSpec) -> bool:
    """Whether a signature takes exactly the image contract's input (one float32 `image`
    [-1, 28, 28]): the readers read its requests by the fast paths built for that input."""
    return signature.inputs == (IMAGE_INPUT,)


def signature_specs(signature_defs) -> dict[str, SignatureSpec]:
    """The typed view of a SignatureDefMap proto: each signature's method and tensors, by key.

    Args:
        signature_defs: a tensorflow.serving.SignatureDefMap (read through its fields only).
    """
    return {
        name: SignatureSpec(
            name,
            signature.method_name,
            _tensor_specs(signature.inputs),
            _tensor_specs(signature.outputs),
        )
        for name, signature in sorted(signature_defs.signature_def.items())
    }


def _tensor_specs(tensor_infos) -> tuple[TensorSpec, ...]:
    specs = []
    for key, info in sorted(tensor_infos.items()):
        shape = info.tensor_shape
        dims = None if shape.unknown_rank else tuple(int(d.size) for d in shape.dim)
        specs.append(TensorSpec(key, NUMPY_OF_TF.get(info.dtype), dims))
    return tuple(specs)
