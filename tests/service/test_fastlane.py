"""The fast lane answers the routes it is given from their own compiled path patterns, with
the app's error rendering and route labels, and leaves everything else to FastAPI."""

from __future__ import annotations

import warnings

import pytest
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse

from service.errors import NotFound, error_response
from service.fastlane import FastLane

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient


def build() -> tuple[FastAPI, list]:
    app = FastAPI()
    seen: list[dict] = []

    @app.post("/items/{name}/versions/{version:int}:run")
    async def run_through_fastapi(name: str, version: int):
        return JSONResponse({"via": "fastapi", "name": name, "version": version})

    @app.get("/items/{name}")
    async def show(name: str):
        return JSONResponse({"via": "fastapi", "name": name})

    async def fast(request: Request, name: str, version: int):
        seen.append({"route": request.scope["route"].path, "params": dict(request.path_params)})
        if name == "missing":
            raise NotFound("no such item")
        return JSONResponse({"via": "lane", "name": name, "version": version})

    (route,) = [r for r in app.routes if getattr(r, "path", "").endswith(":run")]
    app.add_middleware(FastLane, routes=[(route, fast)], error_response=error_response)
    return app, seen


@pytest.fixture
def lane():
    app, seen = build()
    with TestClient(app) as client:
        yield client, seen


def test_a_matching_request_is_answered_by_the_lane_with_converted_params(lane):
    client, seen = lane
    response = client.post("/items/shirt/versions/3:run")
    assert response.json() == {"via": "lane", "name": "shirt", "version": 3}
    assert seen == [
        {
            "route": "/items/{name}/versions/{version:int}:run",
            "params": {"name": "shirt", "version": 3},
        }
    ]


@pytest.mark.parametrize(
    "method, path",
    [
        pytest.param("GET", "/items/shirt/versions/3:run", id="other-method"),
        pytest.param("POST", "/items/shirt/versions/x:run", id="param-not-an-int"),
        pytest.param("POST", "/items/a/b/versions/3:run", id="slash-in-name"),
        pytest.param("POST", "/items/shirt/versions/3:runs", id="longer-path"),
    ],
)
def test_anything_else_goes_through_fastapi(lane, method, path):
    client, seen = lane
    response = client.request(method, path)
    assert response.status_code in (404, 405)
    assert seen == []


def test_other_routes_still_work(lane):
    client, seen = lane
    assert client.get("/items/shirt").json() == {"via": "fastapi", "name": "shirt"}
    assert seen == []


def test_errors_are_rendered_as_the_app_renders_them(lane):
    client, _ = lane
    response = client.post("/items/missing/versions/1:run")
    assert response.status_code == 404
    assert response.json() == {"error": "no such item"}
