"""Operations endpoints: liveness, readiness and Prometheus metrics (at /metrics, and at a
MonitoringConfig's path too: TF Serving's /monitoring/prometheus/metrics)."""

from __future__ import annotations

from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.responses import Response

from service.dataplane import DataPlane
from service.errors import redact_paths
from service.protocols.http import json_response
from service.routes import Answers, Call, Route
from service.security import STATUS


class Operations:
    """/healthz, /readyz and /metrics over a data plane."""

    def __init__(self, dataplane: DataPlane):
        self.dataplane = dataplane

    def routes(self) -> list[Route]:
        """The probes (open to all, whatever Host they name) and the metrics."""
        tags = ("operations",)
        return [
            Route("GET", "/healthz", self.healthz, "The process is alive", None, tags,
                  probe=True),
            Route("GET", "/readyz", self.readyz, "200 once a model is loaded and answering",
                  None, tags, answers=Answers(errors=(503,)), probe=True),
            self.metrics_route("/metrics"),
        ]  # fmt: skip

    def metrics_route(self, path: str) -> Route:
        """The metrics at `path` (/metrics; MONITORING_CONFIG_FILE's path)."""
        return Route("GET", path, self.metrics, "Prometheus metrics", STATUS, ("operations",),
                     answers=Answers(("text/plain",)))  # fmt: skip

    async def healthz(self, call: Call):
        return json_response({"status": "ok"})

    async def readyz(self, call: Call):
        readiness = self.dataplane.readiness()
        if not readiness.ready:
            return json_response({"error": f"not ready: {redact_paths(readiness.reason)}"}, 503)
        return json_response(
            {
                "status": "ready",
                "model": readiness.model,
                "version": str(readiness.version),
                "device": readiness.device,
            }
        )

    async def metrics(self, call: Call):
        self.dataplane.update_gauges()
        await self.dataplane.update_version_states()
        return Response(self.dataplane.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
