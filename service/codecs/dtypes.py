"""The type vocabularies that meet on the wire: TensorFlow's DataType numbers and names,
numpy's dtypes, and the Open Inference Protocol's datatypes.

Every codec names a type in the words its protocol uses; this is the one table between them.
"""

from __future__ import annotations

import numpy as np

# TensorFlow's DataType numbers (tensorflow/core/framework/types.proto), TensorFlow's own name
# for each (what its error messages say) and numpy's dtype, where numpy has one.
_TF_TYPES: tuple[tuple[int, str, type | None], ...] = (
    (1, "float", np.float32),
    (2, "double", np.float64),
    (3, "int32", np.int32),
    (4, "uint8", np.uint8),
    (5, "int16", np.int16),
    (6, "int8", np.int8),
    (7, "string", np.object_),
    (8, "complex64", np.complex64),
    (9, "int64", np.int64),
    (10, "bool", np.bool_),
    (14, "bfloat16", None),
    (17, "uint16", np.uint16),
    (18, "complex128", np.complex128),
    (19, "half", np.float16),
    (20, "resource", None),
    (21, "variant", None),
    (22, "uint32", np.uint32),
    (23, "uint64", np.uint64),
)
DT_FLOAT = 1
DT_STRING = 7
TF_TYPE_NAMES = {number: name for number, name, _ in _TF_TYPES}
NUMPY_OF_TF = {number: np.dtype(dtype) for number, _, dtype in _TF_TYPES if dtype is not None}
TF_OF_NUMPY = {dtype: number for number, dtype in NUMPY_OF_TF.items()}

# The Open Inference Protocol's datatypes (inference_rest.md, "Tensor Data Types").
V2_OF_NUMPY = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.uint16): "UINT16",
    np.dtype(np.uint32): "UINT32",
    np.dtype(np.uint64): "UINT64",
    np.dtype(np.int8): "INT8",
    np.dtype(np.int16): "INT16",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
    np.dtype(np.float16): "FP16",
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
    np.dtype(np.object_): "BYTES",
}
NUMPY_OF_V2 = {datatype: dtype for dtype, datatype in V2_OF_NUMPY.items()}
V2_DATATYPES = frozenset(V2_OF_NUMPY.values()) | {"BF16"}

# Each integer dtype's range, as Python ints.
INT_RANGES = {
    kind: (int(np.iinfo(kind).min), int(np.iinfo(kind).max))
    for kind in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
}


def tf_type_name(number: int) -> str:
    """TensorFlow's name of a DataType number ("float", "double", ...)."""
    return TF_TYPE_NAMES.get(number, f"DataType {number}")


def dtype_name(dtype: np.dtype | None) -> str:
    """TensorFlow's name of a numpy dtype, as its messages say it ("float", "string")."""
    if dtype is None:
        return "unknown"
    if dtype == np.object_:
        return "string"
    if dtype == np.float32:
        return "float"
    if dtype == np.float64:
        return "double"
    if dtype == np.float16:
        return "half"
    return dtype.name


def v2_datatype(dtype: np.dtype | None) -> str:
    """The Open Inference Protocol's name of a numpy dtype (BYTES for strings).

    Raises:
        ValueError: a dtype the protocol has no datatype for.
    """
    if dtype is None or dtype not in V2_OF_NUMPY:
        raise ValueError(f"no Open Inference Protocol datatype for {dtype}")
    return V2_OF_NUMPY[dtype]
