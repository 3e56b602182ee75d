"""A fast lane for TF Serving's `:predict`, the one route under load.

FastAPI's per-request machinery (its middleware stack, route matching and dependency
solving) cost as much as the rest of a one-image prediction: about a quarter of the
throughput at 64 concurrent clients (README, Throughput). This ASGI middleware sends
`POST /v1/models/{name}[/versions/{v}]:predict` straight to the same endpoint function the
routes in service/api.py use, with the same error bodies and the same metrics labels; every
other request goes through FastAPI as usual. The FastAPI routes stay for the OpenAPI docs.
"""

from __future__ import annotations

import re

from fastapi import Request
from fastapi.routing import APIRoute

from service.api import tf_serving_predict

PREDICT_PATH = re.compile(r"^/v1/models/(?P<name>[^/]+?)(?:/versions/(?P<version>[^/]+))?:predict$")


class PredictFastLane:
    """ASGI middleware answering `:predict` requests without FastAPI's routing.

    Args:
        app: the rest of the application.
        routes: the FastAPI routes of the two predict URL forms, keyed by whether the URL
            names a version; set as scope["route"] so metrics label requests by template.
        error_response: turns an exception into the response the app's handlers would give.
    """

    def __init__(self, app, routes: dict[bool, APIRoute], error_response):
        self.app = app
        self.routes = routes
        self.error_response = error_response

    async def __call__(self, scope, receive, send):
        match = None
        if scope["type"] == "http" and scope["method"] == "POST":
            match = PREDICT_PATH.match(scope["path"])
        if match is None:
            await self.app(scope, receive, send)
            return
        name, version = match["name"], match["version"]
        scope["route"] = self.routes[version is not None]
        scope["path_params"] = {"name": name, **({"version": version} if version else {})}
        request = Request(scope, receive, send)
        try:
            response = await tf_serving_predict(request, name, version)
        except Exception as err:  # noqa: BLE001 - rendered exactly as the app's handlers do
            response = self.error_response(request, err)
        await response(scope, receive, send)
