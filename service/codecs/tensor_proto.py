"""TensorFlow's TensorProto to numpy and back, as TF Serving's gRPC Predict reads a request's
inputs and writes its outputs (servables/tensorflow/predict_util.cc; TensorFlow's
tensorflow/core/framework/tensor.cc).

The messages are read and filled through their fields alone (the callers hand them in): nothing
here imports TensorFlow or its protos. The image contract's input (`image` float32
[-1, 28, 28]) is read by the same reader, with what the contract adds: at least one image, and
the first image that is not finite named.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from service.codecs.dtypes import DT_STRING, TF_OF_NUMPY, tf_type_name
from service.codecs.pixels import as_model_input
from service.codecs.signatures import is_image_signature
from service.errors import BadInput
from service.types import Inputs, SignatureSpec, TensorSpec

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


def _no_limit(count: int) -> None:
    """check_count for a caller without a limit."""


# --- reading --------------------------------------------------------------------------------


def missing_alias(sent: Mapping, signature: SignatureSpec) -> str | None:
    """TF Serving's first checks of a Predict request's inputs against the signature: as
    many as it takes (predict_util.cc, VerifyRequestInputsSize), then each of its aliases
    sent (TensorFlow's cc/saved_model/util.cc, GetInputValues).

    Returns:
        the first alias the request lacks (alias_not_found's words name the graph tensor it
        feeds, the caller's to look up), or None.
    Raises:
        BadInput: another number of inputs than the signature's (TF Serving's words).
    """
    names = sorted(sent)
    wanted = sorted(spec.name for spec in signature.inputs)
    if len(names) != len(wanted):
        raise BadInput(
            f"input size does not match signature: {len(names)}!={len(wanted)} "
            f"len({{{','.join(names)}}}) != len({{{','.join(wanted)}}}). "
            f"Sent extra: {{{','.join(k for k in names if k not in wanted)}}}. "
            f"Missing but required: {{{','.join(k for k in wanted if k not in names)}}}."
        )
    return next((alias for alias in wanted if alias not in sent), None)


def alias_not_found(alias: str, feed_name: str, sent: Mapping) -> BadInput:
    """TensorFlow's words for a signature input the request lacks (GetInputValues)."""
    return BadInput(
        f"Signature input alias: {alias}(feed name: {feed_name}) not found in request and no "
        f"default value provided. Inputs expected to be in the request "
        f"{{{','.join(sorted(sent))}}}, or default input alias set: "
    )


def read_inputs(
    protos: Mapping,
    signature: SignatureSpec,
    check_count: Callable[[int], None] = _no_limit,
    strict: bool = True,
) -> Inputs:
    """A Predict request's inputs (its `inputs` map, missing_alias having passed), each read
    by read_tensor.

    Returns:
        each input by name; the image contract's one array [n, 28, 28] as it is.
    Raises:
        BadInput: what read_tensor refuses, or inputs whose batch sizes differ.
    """
    contract = is_image_signature(signature)
    inputs = {
        spec.name: read_tensor(protos[spec.name], spec, position, check_count, strict, contract)
        for position, spec in enumerate(signature.inputs)
    }
    rows = {
        len(array)
        for spec, array in zip(signature.inputs, inputs.values(), strict=True)
        if spec.shape and spec.shape[0] == -1
    }
    if len(rows) > 1:
        raise BadInput(
            f"the inputs' batch sizes differ ({sorted(rows)}); each must hold as many instances"
        )
    return inputs[signature.inputs[0].name] if contract else inputs


def read_tensor(
    proto,
    spec: TensorSpec,
    position: int,
    check_count: Callable[[int], None] = _no_limit,
    strict: bool = True,
    contract: bool = False,
) -> np.ndarray:
    """One input of any signature from a TensorProto, as TensorFlow reads it
    (tensorflow/core/framework/tensor.cc, FromProto): `tensor_content` (raw little-endian
    values, what tf.make_tensor_proto writes for arrays) or the dtype's typed field with one
    value per element, or one for all (what it writes for a scalar and a shape); strings
    from `string_val`. Not strict: fewer values than the shape has are filled with the last
    (none: zeros), and NaN and Inf pass.

    Args:
        proto: the tensorflow.TensorProto (read through its fields only).
        spec: the signature's input it feeds.
        position: the input's place among the signature's inputs (TF's arg[i] in messages).
        check_count: called with the batch size before any value is read (the limit).
        strict: STRICT_NUMBERS: refuse float values that are not finite, and a value count
            of neither one nor one per element.
        contract: the image contract's input: at least one image, float32 as TF Serving
            feeds it, and (strict) the first image that is not finite named.
    Raises:
        BadInput: another dtype than the input's, a shape not fully defined or not the
            signature's, a value or byte count that does not match the shape.
    """
    alias, dtype = spec.name, spec.dtype
    expected = TF_OF_NUMPY.get(dtype) if dtype is not None else None
    if dtype is None or proto.dtype != expected:
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
    if contract and dims[0] == 0:
        raise BadInput(f"input '{alias}' has no images (shape {dims}); send at least one")
    if dims and spec.shape and spec.shape[0] == -1:
        check_count(dims[0])
    elements = int(np.prod(dims, dtype=np.int64))
    if proto.dtype == DT_STRING:
        return _strings(list(proto.string_val), alias, dims, elements, strict)
    content = proto.tensor_content
    if content:
        size = elements * dtype.itemsize
        if len(content) != size:
            raise BadInput(
                f"tensor parsing error: {alias} (tensor_content has {len(content)} bytes; "
                f"shape {dims} of {tf_type_name(proto.dtype)} takes {size})"
            )
        array = np.frombuffer(content, dtype.newbyteorder("<")).reshape(dims)
        if not contract:  # as_model_input copies the contract's
            array = array.astype(dtype)  # native byte order, and not the request's bytes
    else:
        array = _typed_values(proto, dtype, alias, dims, elements, strict)
    if contract:
        return as_model_input(array, f"input '{alias}'", strict)
    if strict and array.dtype.kind == "f" and array.size and not np.isfinite(array).all():
        raise BadInput(f"input '{alias}': values must be finite numbers (NaN/Inf or too large)")
    return array


def _typed_values(proto, dtype, alias: str, dims: list[int], elements: int, strict: bool):
    field = _FIELD_OF_TF.get(proto.dtype)
    values: Sequence | np.ndarray = getattr(proto, field) if field else ()
    if field == "half_val":  # float16's bits, one per int
        values = np.array(values, np.uint16).view(np.float16)
    count = len(values)
    if count == elements:
        flat = np.fromiter(values, dtype, count=count)
    elif count == 1 or (count < elements and not strict):
        flat = np.empty(elements, dtype)
        flat[:count] = values
        flat[count:] = values[-1] if count else 0
    else:
        raise BadInput(
            f"tensor parsing error: {alias} ({field} has {count} values; shape {dims} "
            f"takes {elements}, or 1 for all)"
        )
    return flat.reshape(dims)


def _strings(values: list, alias: str, dims: list[int], elements: int, strict: bool):
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


# --- writing --------------------------------------------------------------------------------


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
