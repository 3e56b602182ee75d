"""The Open Inference Protocol's gRPC messages (service/v2_proto.py): the committed descriptor
is what service/grpc_predict_v2.proto compiles to, it is the wire format of tritonclient's own
protos (Triton's grpc_service.proto), and both load in one process.

Fast tier: protobuf and grpcio-tools' protoc, no TensorFlow, no server.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.service_pb2 as triton_pb2

from service import v2_proto


def test_the_committed_descriptor_is_what_the_proto_compiles_to():
    assert v2_proto.compile_proto() == v2_proto.SERIALIZED_FILE, (
        "service/v2_proto.py is stale: run `PYTHONPATH=. python -m service.v2_proto`"
    )


def test_a_changed_proto_compiles_to_other_bytes(tmp_path):
    # The check above can fail: one field renamed is another descriptor.
    proto = tmp_path / v2_proto.PROTO.name
    proto.write_text(v2_proto.PROTO.read_text().replace("bool live = 1;", "bool alive = 1;"))
    assert v2_proto.compile_proto(proto) != v2_proto.SERIALIZED_FILE


def _split_literal(text: str) -> tuple[str, str]:
    """(the module without its SERIALIZED_FILE assignment, that assignment)."""
    start = text.index("SERIALIZED_FILE = ")
    end = text.index("# --- end of generated")
    return text[:start] + text[end:], text[start:end]


def test_write_module_rewrites_only_the_generated_literal(tmp_path):
    source = Path(v2_proto.__file__).read_text()
    module = tmp_path / "v2_proto.py"
    module.write_text(source)
    data = bytes(range(256)) + b"\"'\\"
    v2_proto.write_module(data, module)
    rest, assignment = _split_literal(module.read_text())
    assert rest == _split_literal(source)[0]
    namespace: dict = {}
    exec(assignment, namespace)
    assert namespace["SERIALIZED_FILE"] == data
    assert max(len(line) for line in assignment.splitlines()) <= 100


def test_the_service_has_the_specifications_six_methods():
    assert v2_proto.SERVICE == "inference.GRPCInferenceService"
    assert list(v2_proto.METHODS) == [
        "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer",
    ]  # fmt: skip
    request, response = v2_proto.METHODS["ModelInfer"]
    assert (request, response) == (v2_proto.ModelInferRequest, v2_proto.ModelInferResponse)


def _triton_request() -> triton_pb2.ModelInferRequest:
    request = triton_pb2.ModelInferRequest(model_name="m", model_version="3", id="7")
    request.parameters["priority"].int64_param = 2
    tensor = request.inputs.add(name="image", datatype="FP32", shape=[1, 28, 28])
    tensor.parameters["binary_data_size"].int64_param = 3136
    request.outputs.add(name="classes").parameters["classification"].int64_param = 1
    request.raw_input_contents.append(np.arange(784, dtype="<f4").tobytes())
    typed = request.inputs.add(name="other", datatype="FP64", shape=[2])
    typed.contents.fp64_contents.extend([0.5, 1.5])
    return request


def test_messages_read_and_write_the_same_bytes_as_tritonclients_protos():
    sent = _triton_request()
    ours = v2_proto.ModelInferRequest.FromString(sent.SerializeToString())
    assert ours.model_name == "m" and ours.model_version == "3" and ours.id == "7"
    assert ours.parameters["priority"].int64_param == 2
    assert [tuple(t.shape) for t in ours.inputs] == [(1, 28, 28), (2,)]
    assert ours.inputs[0].parameters["binary_data_size"].int64_param == 3136
    assert ours.outputs[0].parameters["classification"].int64_param == 1
    assert ours.raw_input_contents[0] == sent.raw_input_contents[0]
    assert list(ours.inputs[1].contents.fp64_contents) == [0.5, 1.5]
    back = triton_pb2.ModelInferRequest.FromString(ours.SerializeToString())
    assert back == sent


@pytest.mark.parametrize(
    "ours, theirs",
    [
        pytest.param(v2_proto.ModelInferResponse(model_name="m", model_version="1", id="x", raw_output_contents=[b"\x01\x02"]), triton_pb2.ModelInferResponse, id="infer-response"),
        pytest.param(v2_proto.ModelMetadataResponse(name="m", versions=["1", "2"], platform="p", inputs=[{"name": "image", "datatype": "FP32", "shape": [-1, 28, 28]}]), triton_pb2.ModelMetadataResponse, id="metadata"),
        pytest.param(v2_proto.ServerMetadataResponse(name="s", version="1", extensions=["a"]), triton_pb2.ServerMetadataResponse, id="server-metadata"),
        pytest.param(v2_proto.ModelReadyRequest(name="m", version="2"), triton_pb2.ModelReadyRequest, id="model-ready"),
        pytest.param(v2_proto.ServerLiveResponse(live=True), triton_pb2.ServerLiveResponse, id="live"),
        pytest.param(v2_proto.ServerReadyResponse(ready=True), triton_pb2.ServerReadyResponse, id="ready"),
    ],
)  # fmt: skip
def test_every_answer_reads_the_same_in_tritonclients_protos(ours, theirs):
    read = theirs.FromString(ours.SerializeToString())
    assert read.SerializeToString() == ours.SerializeToString()
    assert str(read) == str(ours) and str(ours)
