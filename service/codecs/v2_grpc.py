"""The Open Inference Protocol's gRPC messages (service/v2_proto.py: ModelInferRequest,
ModelInferResponse) to numpy and back, by the HTTP route's rules (service/codecs/v2_tensors.py):
the same checks, the same messages, the fields named as gRPC names them.

Pure numpy: nothing here imports TensorFlow.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from artifact.contract import OUTPUT_KEYS
from service import v2_proto
from service.codecs.dtypes import NUMPY_OF_V2, v2_datatype
from service.codecs.signatures import is_image_signature
from service.codecs.v2_tensors import (
    INPUT_DATATYPE,
    INPUT_TEXT,
    InferRequest,
    WireInput,
    as_bytes,
    blob,
    check_output,
    inputs_text,
    model_input,
    output_names,
    signature_inputs,
)
from service.errors import BadInput
from service.types import Inputs, PredictResult, SignatureSpec

# A datatype -> the InferTensorContents field that holds its values (inference_grpc.md).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    **dict.fromkeys(("INT8", "INT16", "INT32"), "int_contents"),
    "INT64": "int64_contents",
    **dict.fromkeys(("UINT8", "UINT16", "UINT32"), "uint_contents"),
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def _no_limit(count: int) -> None:
    """check_count for a caller without a limit."""


def parse_grpc_infer_request(
    request,
    check_count: Callable[[int], None] = _no_limit,
    signature: SignatureSpec | None = None,
) -> InferRequest:
    """A gRPC ModelInferRequest (service/v2_proto.py) to inputs and outputs, by the HTTP
    route's rules: the same checks, the same messages, the fields named as gRPC names them.

    Inputs come as typed `contents` or as `raw_input_contents` (one entry per input, in
    order); the answer uses the same form (`InferRequest.binary_output`).

    Raises:
        BadInput: the message names the field and says what was expected and what came.
    """
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise BadInput(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs; "
            "send one per input, in the order of 'inputs'"
        )
    # Any signature but the image contract's, read by its own tensors.
    generic = signature if signature is not None and not is_image_signature(signature) else None
    if not request.inputs:
        if generic is not None:
            raise BadInput(f"'inputs' must hold the model's inputs, {inputs_text(generic)}")
        raise BadInput(f"'inputs' must hold the model's one input, {INPUT_TEXT}")
    inputs = []
    for i, tensor in enumerate(request.inputs):
        where = f"input '{tensor.name}'"
        shape = list(tensor.shape)
        if any(d < 0 for d in shape):
            raise BadInput(f"{where}: 'shape' must hold non-negative integers, got {shape}")
        item = WireInput(where, tensor.name, tensor.datatype, shape)
        filled = [field.name for field, _ in tensor.contents.ListFields()]
        if raw:
            if filled:
                raise BadInput(
                    f"{where} sets contents, but the request has raw_input_contents: send "
                    "every input one way (inference_grpc.md)"
                )
            item.binary = memoryview(raw[i])
            item.binary_field = f"raw_input_contents[{i}] has"
        else:
            field = CONTENTS_FIELD.get(tensor.datatype)
            stray = [name for name in filled if name != field]
            if stray and tensor.datatype == INPUT_DATATYPE:
                raise BadInput(
                    f"{where}: its values are in contents.{stray[0]}; {INPUT_DATATYPE} "
                    f"takes contents.{field}"
                )
            item.data_field = f"contents.{field}"
            if generic is not None and stray:
                raise BadInput(
                    f"{where}: its values are in contents.{stray[0]}; {tensor.datatype} "
                    f"takes contents.{field}"
                )
            if field is not None and generic is not None:
                values = list(getattr(tensor.contents, field))
                dtype = NUMPY_OF_V2.get(tensor.datatype, np.dtype(np.object_))
                item.data = np.empty(len(values), dtype)
                item.data[:] = values
            elif field is not None:
                item.data = np.asarray(getattr(tensor.contents, field), np.float32)
        inputs.append(item)
    tensors: Inputs
    if generic is not None:
        tensors = signature_inputs(inputs, generic, check_count)
        names = output_names(generic)
    else:
        tensors = model_input(inputs, check_count)
        names = OUTPUT_KEYS
    requested: dict[str, bool | None] = {}
    for output in request.outputs:
        check_output(output.name, output.parameters, requested, names)
        requested[output.name] = None
    return InferRequest(request.id or None, tensors, requested or None, bool(raw))


def render_grpc_infer_response(result: PredictResult, request: InferRequest):
    """The answer as a ModelInferResponse: outputs as raw_output_contents when the request
    sent raw_input_contents, else as typed contents (as KServe answers)."""
    response = v2_proto.ModelInferResponse(
        model_name=result.model, model_version=str(result.version), id=request.id or ""
    )
    for name in list(request.outputs) if request.outputs else list(result.outputs):
        array = result.outputs[name]
        datatype = v2_datatype(array.dtype)
        output = response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        if request.binary_output:
            response.raw_output_contents.append(blob(array))
        elif array.dtype == np.object_:
            output.contents.bytes_contents.extend(as_bytes(v) for v in array.ravel())
        else:
            getattr(output.contents, CONTENTS_FIELD[datatype]).extend(array.ravel().tolist())
    return response
