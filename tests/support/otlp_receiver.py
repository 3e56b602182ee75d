"""An OTLP/HTTP trace receiver for the tests: a small HTTP server on a free loopback port that
takes `POST /v1/traces` with OpenTelemetry's `ExportTraceServiceRequest` protobuf
(`opentelemetry-proto`, gzip or not), answers as a collector does, and keeps every span it
got, decoded, for the test to look at (`Receiver.spans`)."""

from __future__ import annotations

import dataclasses
import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

TRACES_PATH = "/v1/traces"


@dataclasses.dataclass(frozen=True)
class ReceivedSpan:
    """One span as the receiver decoded it: ids as hex, attributes as Python values."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict
    links: tuple[tuple[str, str], ...]  # (trace id, span id) of each link
    service_name: str | None


def _value(any_value):
    kind = any_value.WhichOneof("value")
    return None if kind is None else getattr(any_value, kind)


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans of one ExportTraceServiceRequest."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    found = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                found.append(
                    ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        links=tuple(
                            (link.trace_id.hex(), link.span_id.hex()) for link in span.links
                        ),
                        service_name=resource.get("service.name"),
                    )
                )
    return found


class Receiver:
    """The receiver, started on a free loopback port; `endpoint` is what
    OTEL_EXPORTER_OTLP_ENDPOINT takes. Use as a context manager (stopped on exit)."""

    def __init__(self):
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self.refused: list[str] = []  # what came that was not an export, said why
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path != TRACES_PATH:
                    receiver.refused.append(f"POST {self.path}")
                    self.send_error(404)
                    return
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                try:
                    spans = decode(body)
                except Exception as err:  # noqa: BLE001 - told to the test
                    receiver.refused.append(f"undecodable export: {err}")
                    self.send_error(400)
                    return
                with receiver._lock:
                    receiver._spans.extend(spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def wait_for(self, condition, what: str, timeout: float = 30.0) -> list[ReceivedSpan]:
        """The spans once `condition(spans)` holds (bounded; not a timing assertion)."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans
            if condition(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({span.name for span in spans})
                raise AssertionError(f"timed out waiting for {what}; received: {names}")
            time.sleep(0.05)
