"""Tensors on the wire, without TensorFlow: type names, signature specs and TensorProto fields.

TensorFlow Serving's protos (TensorProto, SignatureDefMap) are read and filled here through
their fields alone; the callers hand the messages in. So this module imports neither
TensorFlow nor its protos (importing either takes seconds), and the Open Inference Protocol
adapter and the fast tests can use it. Three type vocabularies meet here: TensorFlow's
DataType numbers and names, numpy's dtypes, and the Open Inference Protocol's datatypes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from artifact.contract import IMAGE_SHAPE, INPUT_KEY
from service import codec
from service.errors import BadInput
from service.types import SignatureSpec, TensorSpec

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
V2_DATATYPES = frozenset(V2_OF_NUMPY.values()) | {"BF16"}

IMAGE_ELEMENTS = int(np.prod(IMAGE_SHAPE))
IMAGE_BATCH_SHAPE = [-1, *IMAGE_SHAPE]


def tf_type_name(number: int) -> str:
    """TensorFlow's name of a DataType number ("float", "double", ...)."""
    return TF_TYPE_NAMES.get(number, f"DataType {number}")


def v2_datatype(dtype: np.dtype | None) -> str:
    """The Open Inference Protocol's name of a numpy dtype (BYTES for strings)."""
    if dtype is None or dtype not in V2_OF_NUMPY:
        raise ValueError(f"no Open Inference Protocol datatype for {dtype}")
    return V2_OF_NUMPY[dtype]


# --- signatures -----------------------------------------------------------------------------


IMAGE_INPUT = TensorSpec(INPUT_KEY, np.dtype(np.float32), (-1, *IMAGE_SHAPE))


def is_image_signature(signature: SignatureSpec) -> bool:
    """Whether a signature takes exactly the image contract's input (one float32 `image`
    [-1, 28, 28]): requests to it take the fast paths built for that input."""
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


# --- TensorProto ----------------------------------------------------------------------------


def images_from_tensor_proto(
    proto,
    alias: str,
    check_count: Callable[[int], None] = lambda count: None,
    strict: bool = True,
) -> np.ndarray:
    """float32 images [n, 28, 28] from a TensorProto, in any form a TF Serving client sends.

    `tensor_content` (raw little-endian floats, what tf.make_tensor_proto writes for arrays)
    or `float_val` with one value per element, or a single value for every element (what
    tf.make_tensor_proto writes for a scalar and a shape). Not strict, as TensorFlow reads a
    TensorProto (tensorflow/core/framework/tensor.cc, FromProtoField): fewer values than
    the shape has are filled with the last one (none: zeros), and NaN and Inf pass.

    Args:
        proto: the tensorflow.TensorProto (read through its fields only).
        alias: the input's name, for messages.
        check_count: called with the number of images before any value is read (the limit).
        strict: STRICT_NUMBERS: refuse values that are not finite, and a float_val of
            neither one value nor one per element.
    Raises:
        BadInput: not DT_FLOAT, not [n, 28, 28] with n >= 1, a value count or byte count that
            does not match the shape, or (strict) values that are not finite.
    """
    if proto.dtype != DT_FLOAT:
        raise BadInput(
            f"Expects arg[0] to be float but {tf_type_name(proto.dtype)} is provided (input "
            f"'{alias}' takes float {IMAGE_BATCH_SHAPE})"
        )
    shape = proto.tensor_shape
    dims = [int(d.size) for d in shape.dim]
    if shape.unknown_rank or any(size < 0 for size in dims):
        raise BadInput(
            f"tensor parsing error: {alias} (its shape must be fully defined; got "
            f"{'an unknown rank' if shape.unknown_rank else dims})"
        )
    if len(dims) != 3 or tuple(dims[1:]) != IMAGE_SHAPE:
        raise BadInput(f"input '{alias}' has shape {dims}; the signature takes {IMAGE_BATCH_SHAPE}")
    count = dims[0]
    if count == 0:
        raise BadInput(f"input '{alias}' has no images (shape {dims}); send at least one")
    check_count(count)
    elements = count * IMAGE_ELEMENTS
    content = proto.tensor_content
    if content:
        if len(content) != elements * 4:
            raise BadInput(
                f"tensor parsing error: {alias} (tensor_content has {len(content)} bytes; "
                f"shape {dims} of float takes {elements * 4})"
            )
        images = np.frombuffer(content, "<f4").reshape(dims)
    else:
        values = proto.float_val
        if len(values) == elements:
            images = np.fromiter(values, np.float32, count=elements).reshape(dims)
        elif len(values) == 1:
            images = np.full(dims, values[0], np.float32)
        elif len(values) < elements and not strict:
            flat = np.empty(elements, np.float32)
            flat[: len(values)] = values
            flat[len(values) :] = values[-1] if len(values) else 0.0
            images = flat.reshape(dims)
        else:
            raise BadInput(
                f"tensor parsing error: {alias} (float_val has {len(values)} values; shape "
                f"{dims} takes {elements}, or 1 for all)"
            )
    return codec.as_model_input(images, f"input '{alias}'", strict)


DT_STRING = 7
# TensorFlow's DataType -> the TensorProto field its values may come in besides
# tensor_content (tensorflow/core/framework/tensor.proto).
_FIELD_OF_TF = {
    1: "float_val",
    2: "double_val",
    3: "int_val",
    4: "int_val",
    5: "int_val",
    6: "int_val",
    7: "string_val",
    9: "int64_val",
    10: "bool_val",
    17: "int_val",
    19: "half_val",
    22: "uint32_val",
    23: "uint64_val",
}


def array_from_tensor_proto(
    proto,
    spec: TensorSpec,
    position: int,
    check_count: Callable[[int], None] = lambda count: None,
    strict: bool = True,
) -> np.ndarray:
    """One input of any signature from a TensorProto, as TensorFlow reads it
    (tensorflow/core/framework/tensor.cc, FromProto): `tensor_content` (raw little-endian
    values) or the dtype's typed field with one value per element, or one for all; strings
    from `string_val`. Not strict: fewer values than the shape has are filled with the last.

    Args:
        proto: the tensorflow.TensorProto (read through its fields only).
        spec: the signature's input it feeds.
        position: the input's place among the signature's inputs (TF's arg[i] in messages).
        check_count: called with the batch size before any value is read (the limit).
        strict: STRICT_NUMBERS: refuse float values that are not finite, and a value count
            of neither one nor one per element.
    Raises:
        BadInput: another dtype than the input's, a shape not fully defined or not the
            signature's, a value or byte count that does not match the shape.
    """
    alias, dtype = spec.name, spec.dtype
    expected = TF_OF_NUMPY.get(dtype) if dtype is not None else None
    if proto.dtype != expected:
        raise BadInput(
            f"Expects arg[{position}] to be {tf_type_name(expected or 0)} but "
            f"{tf_type_name(proto.dtype)} is provided (input '{alias}' takes "
            f"{tf_type_name(expected or 0)} {list(spec.shape) if spec.shape else spec.shape})"
        )
    shape = proto.tensor_shape
    dims = [int(d.size) for d in shape.dim]
    if shape.unknown_rank or any(size < 0 for size in dims):
        raise BadInput(
            f"tensor parsing error: {alias} (its shape must be fully defined; got "
            f"{'an unknown rank' if shape.unknown_rank else dims})"
        )
    if spec.shape is not None and not (
        len(spec.shape) == len(dims)
        and all(want in (-1, got) for want, got in zip(spec.shape, dims, strict=True))
    ):
        raise BadInput(f"input '{alias}' has shape {dims}; the signature takes {list(spec.shape)}")
    if dims and spec.shape and spec.shape[0] == -1:
        check_count(dims[0])
    elements = int(np.prod(dims, dtype=np.int64))
    if proto.dtype == DT_STRING:
        values = list(proto.string_val)
        array = np.empty(elements, dtype=object)
        if len(values) == elements:
            array[:] = values
        elif len(values) == 1 or (len(values) < elements and not strict):
            array[: len(values)] = values
            array[len(values) :] = values[-1] if values else b""
        else:
            raise BadInput(
                f"tensor parsing error: {alias} (string_val has {len(values)} values; shape "
                f"{dims} takes {elements}, or 1 for all)"
            )
        return array.reshape(dims)
    content = proto.tensor_content
    if content:
        size = elements * dtype.itemsize
        if len(content) != size:
            raise BadInput(
                f"tensor parsing error: {alias} (tensor_content has {len(content)} bytes; "
                f"shape {dims} of {tf_type_name(proto.dtype)} takes {size})"
            )
        array = np.frombuffer(content, dtype.newbyteorder("<")).astype(dtype).reshape(dims)
    else:
        field = _FIELD_OF_TF.get(proto.dtype)
        values = getattr(proto, field) if field else ()
        if field == "half_val":  # float16's bits, one per int
            values = np.array(values, np.uint16).view(np.float16)
        count = len(values)
        flat = np.empty(elements, dtype)
        if count == elements:
            flat[:] = values
        elif count == 1 or (count < elements and not strict):
            flat[:count] = values
            flat[count:] = values[-1] if count else 0
        else:
            raise BadInput(
                f"tensor parsing error: {alias} ({field} has {count} values; shape {dims} "
                f"takes {elements}, or 1 for all)"
            )
        array = flat.reshape(dims)
    if strict and array.dtype.kind == "f" and array.size and not np.isfinite(array).all():
        raise BadInput(f"input '{alias}': values must be finite numbers (NaN/Inf or too large)")
    return array


# numpy's dtype -> the TensorProto field TensorFlow writes its values in
# (tensorflow/core/framework/tensor.proto; tensor.cc, AsProtoField).
_VALUE_FIELDS = {
    np.dtype(np.float32): "float_val",
    np.dtype(np.float64): "double_val",
    np.dtype(np.int32): "int_val",
    np.dtype(np.int16): "int_val",
    np.dtype(np.int8): "int_val",
    np.dtype(np.uint8): "int_val",
    np.dtype(np.uint16): "int_val",
    np.dtype(np.int64): "int64_val",
    np.dtype(np.bool_): "bool_val",
    np.dtype(np.uint32): "uint32_val",
    np.dtype(np.uint64): "uint64_val",
}


def fill_tensor_proto(proto, array: np.ndarray, tensor_content: bool = False) -> None:
    """Write a numpy array into an empty TensorProto: dtype, shape and its values, as TF
    Serving answers by default (servables/tensorflow/predict_util.cc with server_core.h's
    kAsProtoField): in the dtype's typed field (float_val, int64_val, ...), what its example
    clients read (tensorflow_serving/example/mnist_client.py); with `tensor_content`
    (GRPC_TENSOR_CONTENT), as little-endian bytes. tf.make_ndarray reads either.

    Strings (object arrays of bytes) go in `string_val`.

    Raises:
        ValueError: a dtype TensorFlow has no number for here.
    """
    if array.dtype == np.object_:
        proto.dtype = DT_STRING
        for size in array.shape:
            proto.tensor_shape.dim.add().size = size
        proto.string_val.extend(
            item if isinstance(item, bytes) else str(item).encode() for item in array.ravel()
        )
        return
    dtype = array.dtype.newbyteorder("=")
    number = TF_OF_NUMPY.get(dtype)
    if number is None:
        raise ValueError(f"cannot write a {array.dtype} array into a TensorProto")
    proto.dtype = number
    for size in array.shape:
        proto.tensor_shape.dim.add().size = size
    field = _VALUE_FIELDS.get(dtype)
    if tensor_content or field is None:  # float16, complex: bytes only here
        proto.tensor_content = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        return
    getattr(proto, field).extend(array.ravel().tolist())
