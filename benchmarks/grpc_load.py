"""A small closed-loop load generator for TF Serving's gRPC Predict (ghz is not in Debian).

`concurrency` callers share one grpc.aio channel (one HTTP/2 connection, as TF Serving's
clients use) on uvloop; each sends the same PredictRequest (images from a .npy file, as
`tf.make_tensor_proto` writes them) again as soon as its answer comes, for `seconds` after a
one-second warm-up. Prints one JSON object: requests/s, p50 and p99 latency in ms, errors.

It is a Python process on the same 2 cores as the server: at high rates it takes CPU the
server could use, so its numbers are a floor for the server, not a ceiling.

    python -m benchmarks.grpc_load --address 127.0.0.1:8500 --images body.npy -c 64 -d 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import numpy as np

WARMUP_SECONDS = 1.0
CALL_TIMEOUT_SECONDS = 10.0


async def run(address: str, images: np.ndarray, concurrency: int, seconds: float) -> dict:
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "fashion_mnist"
    request.inputs["image"].CopyFrom(tf.make_tensor_proto(images))
    latencies: list[float] = []
    errors = 0
    loop = asyncio.get_running_loop()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

        async def caller(until: float, record: bool) -> None:
            nonlocal errors
            while loop.time() < until:
                start = time.perf_counter()
                try:
                    await stub.Predict(request, timeout=CALL_TIMEOUT_SECONDS)
                except grpc.aio.AioRpcError:
                    errors += record
                    continue
                if record:
                    latencies.append(time.perf_counter() - start)

        warm_until = loop.time() + WARMUP_SECONDS
        await asyncio.gather(*(caller(warm_until, False) for _ in range(concurrency)))
        started = time.perf_counter()
        until = loop.time() + seconds
        await asyncio.gather(*(caller(until, True) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    milliseconds = 1000 * np.array(latencies or [float("nan")])
    return {
        "requests_per_s": len(latencies) / elapsed,
        "p50_ms": float(np.percentile(milliseconds, 50)),
        "p99_ms": float(np.percentile(milliseconds, 99)),
        "errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True, help="host:port of the gRPC API")
    parser.add_argument("--images", required=True, help=".npy file of float32 [n, 28, 28]")
    parser.add_argument("-c", "--concurrency", type=int, default=64)
    parser.add_argument("-d", "--seconds", type=float, default=8.0)
    args = parser.parse_args()
    import uvloop

    images = np.load(args.images)
    result = uvloop.run(run(args.address, images, args.concurrency, args.seconds))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
