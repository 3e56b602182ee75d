"""Operations endpoints: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from service.dataplane import DataPlane
from service.errors import redact_paths
from service.protocols.http import json_response


class Operations:
    """/healthz, /readyz and /metrics over a data plane."""

    def __init__(self, dataplane: DataPlane):
        self.dataplane = dataplane
        self.router = APIRouter(tags=["operations"])
        self.router.add_api_route("/healthz", self.healthz, summary="The process is alive")
        self.router.add_api_route(
            "/readyz", self.readyz, summary="200 once a model is loaded and answering"
        )
        self.router.add_api_route("/metrics", self.metrics, summary="Prometheus metrics")

    async def healthz(self):
        return json_response({"status": "ok"})

    async def readyz(self):
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

    async def metrics(self):
        self.dataplane.update_gauges()
        return PlainTextResponse(
            self.dataplane.metrics.exposition(), media_type=CONTENT_TYPE_LATEST
        )
