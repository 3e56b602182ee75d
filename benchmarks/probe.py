"""Latency by status, seen by a few clients inside a flood that wrk generates.

wrk keeps one latency distribution for all answers; under overload, fast 503s and slower
200s are mixed in it. These probe clients, each a plain keep-alive HTTP/1.1 connection on a
thread, send the same request again as soon as their answer comes and time each answer by
its status, so the overload row can say how long good answers and refusals took. They are a
handful among hundreds of wrk connections: their own load is negligible.
"""

from __future__ import annotations

import http.client
import threading
import time

import numpy as np


def _client(
    port, path, body, headers, deadline, at_least: int, out: list, lock: threading.Lock
) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    seen: list[tuple[int, float, bool]] = []
    try:
        while time.monotonic() < deadline or len(seen) < at_least:
            start = time.perf_counter()
            try:
                connection.request("POST", path, body, headers)
                response = connection.getresponse()
                response.read()
            except (OSError, http.client.HTTPException):
                seen.append((0, time.perf_counter() - start, False))
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                continue
            retry_after = response.getheader("retry-after") is not None
            seen.append((response.status, time.perf_counter() - start, retry_after))
    finally:
        connection.close()
        with lock:
            out.extend(seen)


def probe(
    port: int, path: str, body: bytes, seconds: float, clients: int = 8, at_least: int = 0
) -> dict:
    """Run `clients` probes for `seconds`, and each until it has `at_least` answers (so that a
    stalled machine still yields them); latency percentiles (ms) by status class."""
    headers = {"Content-Type": "application/json"}
    deadline = time.monotonic() + seconds
    answers: list = []
    lock = threading.Lock()
    threads = [
        threading.Thread(
            target=_client,
            args=(port, path, body, headers, deadline, at_least, answers, lock),
        )
        for _ in range(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    def percentiles(latencies: list[float]) -> dict:
        if not latencies:
            return {"count": 0, "p50_ms": None, "p99_ms": None}
        ms = 1000 * np.asarray(latencies)
        return {
            "count": len(ms),
            "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)),
        }

    return {
        "clients": clients,
        "ok": percentiles([t for status, t, _ in answers if status == 200]),
        "refused": percentiles([t for status, t, _ in answers if status == 503]),
        "refused_without_retry_after": sum(
            1 for status, _, retry in answers if status == 503 and not retry
        ),
        "other": sum(1 for status, _, _ in answers if status not in (200, 503)),
    }
