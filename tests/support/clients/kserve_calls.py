"""KServe's own Python clients calling a running service; run in KServe's venv, not the project's.

    echo '{"grpc": "127.0.0.1:8500", "http": "http://127.0.0.1:8000",
           "model": "fashion_mnist", "images": "images.npy", "token": null}' |
        build/client-venvs/kserve/bin/python tests/support/clients/kserve_calls.py

The call's settings come as JSON on stdin, not as options: `import kserve` parses the
process's command line (its model server's argparse, at import time) and exits on options
it does not know. `images` is a .npy file of float32 [n, 28, 28] images; `token`, when set,
is sent as a bearer token with every call.

Imports nothing of this project (its venv has only `kserve` and what that needs: see
requirements-kserve.in). Each call is made with the SDK's public API as its docs show it
(`InferenceGRPCClient`, `InferenceRESTClient` with `RESTConfig`, `InferRequest`, `InferInput`,
`RequestedOutput`); the gRPC client has no metadata method, so ModelMetadata goes through the
SDK's own generated stub (`client._client_stub`, `GRPCInferenceServiceStub`). Prints one JSON
object: each call's name -> {"ok": what it answered} or {"error": {"type", "code", "message"}},
so that one failing call leaves the others' answers to be checked.
"""

from __future__ import annotations

import asyncio
import json
import sys
import types

import grpc
import httpx
import numpy as np
from google.protobuf.json_format import MessageToDict
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.grpc.grpc_predict_v2_pb2 import ModelMetadataRequest
from kserve.protocol.infer_type import RequestedOutput

TIMEOUT = 30.0


def image_input(images: np.ndarray, binary: bool) -> InferInput:
    tensor = InferInput(name="image", shape=list(images.shape), datatype="FP32")
    tensor.set_data_from_numpy(images, binary_data=binary)
    return tensor


def answer(response, headers: dict | None = None) -> dict:
    """An InferResponse as JSON: float32 values become floats that read back exactly."""
    found = {
        "id": response.id,
        "model_name": response.model_name,
        "model_version": response.model_version,
        "outputs": [
            {
                "name": output.name,
                "datatype": output.datatype,
                "shape": list(output.shape),
                # Where the values came from: raw bytes (gRPC raw_output_contents, REST binary
                # data after the JSON) or typed contents / JSON data. The SDK keeps the bytes
                # in the output's _raw_data; from_bytes turns binary REST data into a list.
                "raw": output._raw_data is not None,
                "data": output.as_numpy().tolist(),
            }
            for output in response.outputs
        ],
    }
    if headers is not None:
        found["content_type"] = headers.get("content-type")
    return found


def failure(error: BaseException) -> dict:
    if isinstance(error, grpc.aio.AioRpcError):
        return {"type": "AioRpcError", "code": error.code().name, "message": error.details()}
    if isinstance(error, httpx.HTTPStatusError):
        return {
            "type": "HTTPStatusError",
            "code": error.response.status_code,
            "message": str(error),
        }
    return {"type": type(error).__name__, "code": None, "message": str(error)}


async def grpc_calls(args, images: np.ndarray, metadata) -> dict:
    calls = {}
    async with InferenceGRPCClient(args.grpc, timeout=TIMEOUT, retries=0) as client:
        calls["server_live"] = lambda: client.is_server_live()
        calls["server_ready"] = lambda: client.is_server_ready()
        calls["model_ready"] = lambda: client.is_model_ready(args.model, headers=metadata)
        calls["model_ready_unknown"] = lambda: client.is_model_ready("nope", headers=metadata)

        async def model_metadata():
            request = ModelMetadataRequest(name=args.model)
            reply = await client._client_stub.ModelMetadata(
                request, metadata=metadata, timeout=TIMEOUT
            )
            return MessageToDict(reply)

        calls["model_metadata"] = model_metadata

        async def infer(binary: bool, **fields):
            request = InferRequest(args.model, [image_input(images, binary)], **fields)
            return answer(await client.infer(request, headers=metadata))

        calls["infer_raw"] = lambda: infer(True, request_id="grpc-raw")
        calls["infer_typed"] = lambda: infer(False, request_id="grpc-typed")
        calls["infer_probabilities_v1"] = lambda: infer(
            True, model_version="1", request_outputs=[RequestedOutput("probabilities")]
        )
        calls["infer_unknown_model"] = lambda: client.infer(
            InferRequest("nope", [image_input(images, True)]), headers=metadata
        )
        calls["infer_fp64"] = lambda: client.infer(
            InferRequest(args.model, [fp64_input(images)]), headers=metadata
        )
        return {name: await outcome(call) for name, call in calls.items()}


def fp64_input(images: np.ndarray) -> InferInput:
    tensor = InferInput(name="image", shape=list(images.shape), datatype="FP64")
    tensor.set_data_from_numpy(images.astype(np.float64), binary_data=True)
    return tensor


async def rest_calls(args, images: np.ndarray, headers: dict) -> dict:
    calls = {}
    v2 = InferenceRESTClient(RESTConfig(protocol="v2", timeout=TIMEOUT, retries=0))
    v1 = InferenceRESTClient(RESTConfig(protocol="v1", timeout=TIMEOUT, retries=0))
    url = args.http
    try:
        calls["server_live"] = lambda: v2.is_server_live(url, headers=headers)
        calls["server_ready"] = lambda: v2.is_server_ready(url, headers=headers)
        calls["model_ready"] = lambda: v2.is_model_ready(url, args.model, headers=headers)
        calls["model_ready_unknown"] = lambda: v2.is_model_ready(url, "nope", headers=headers)

        async def infer(binary: bool, **fields):
            answered = {}
            response = await v2.infer(
                url,
                InferRequest(args.model, [image_input(images, binary)], **fields),
                args.model,
                dict(headers),
                response_headers=answered,
            )
            return answer(response, answered)

        calls["infer_json"] = lambda: infer(False, request_id="rest-json")
        calls["infer_binary"] = lambda: infer(
            True, request_id="rest-binary", parameters={"binary_data_output": True}
        )
        calls["infer_probabilities"] = lambda: infer(
            False, request_outputs=[RequestedOutput("probabilities")]
        )
        calls["infer_unknown_model"] = lambda: v2.infer(
            url, InferRequest("nope", [image_input(images, False)]), "nope", dict(headers)
        )
        calls["v1_predict"] = lambda: v1.infer(
            url, {"instances": images.tolist()}, args.model, dict(headers)
        )
        return {name: await outcome(call) for name, call in calls.items()}
    finally:
        await v2.close()
        await v1.close()


async def outcome(call) -> dict:
    try:
        return {"ok": await call()}
    except Exception as error:  # every failure is an answer to report, not a crash
        return {"error": failure(error)}


async def run(args) -> dict:
    images = np.load(args.images)
    metadata = [("authorization", f"Bearer {args.token}")] if args.token else None
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    return {
        "grpc": await grpc_calls(args, images, metadata),
        "rest": await rest_calls(args, images, headers),
    }


FIELDS = ("grpc", "http", "model", "images", "token")


def main() -> int:
    settings = json.load(sys.stdin)
    missing = [name for name in FIELDS if name not in settings]
    if missing or set(settings) - set(FIELDS):
        expected = ", ".join(FIELDS)
        sys.exit(f"stdin must be a JSON object with exactly {expected}; got {sorted(settings)}")
    json.dump(asyncio.run(run(types.SimpleNamespace(**settings))), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
