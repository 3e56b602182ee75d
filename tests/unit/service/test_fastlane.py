"""The fast lane answers the routes it is given from their own compiled path patterns, with
the app's error rendering, body limits and route labels, and leaves everything else to
FastAPI."""

from __future__ import annotations

import warnings

import pytest
from fastapi import FastAPI
from starlette.responses import JSONResponse

from service.errors import NotFound, Overloaded, error_response
from service.fastlane import FastLane
from service.protocols.http import Call

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient


def build(full: bool = False) -> tuple[FastAPI, list]:
    app = FastAPI()
    seen: list[dict] = []

    def admit():
        if full:
            raise Overloaded("the queue is full")

    @app.post("/items/{name}/versions/{version:int}:run")
    async def run_through_fastapi(name: str, version: int):
        return JSONResponse({"via": "fastapi", "name": name, "version": version})

    @app.get("/items/{name}")
    async def show(name: str):
        return JSONResponse({"via": "fastapi", "name": name})

    async def fast(call: Call, name: str, version: int):
        seen.append({"params": {"name": name, "version": version}, "body": call.body,
                     "query": dict(call.query), "type": call.headers.get("content-type")})  # fmt: skip
        if name == "missing":
            raise NotFound("no such item")
        return JSONResponse({"via": "lane", "name": name, "version": version})

    (route,) = [r for r in app.routes if getattr(r, "path", "").endswith(":run")]
    app.add_middleware(
        FastLane,
        routes=[(route, fast)],
        error_response=error_response,
        max_body_bytes=100,
        body_timeout=5.0,
        admit=admit,
    )
    return app, seen


class RoutesSeen:
    """The app, noting each request's route template as an outer middleware sees it."""

    def __init__(self, app):
        self.app = app
        self.routes_seen: list[str] = []

    async def __call__(self, scope, receive, send):
        await self.app(scope, receive, send)
        if "route" in scope:
            self.routes_seen.append(scope["route"].path)


@pytest.fixture
def lane():
    app, seen = build()
    with TestClient(RoutesSeen(app)) as client:
        yield client, seen


def test_a_matching_request_is_answered_by_the_lane_with_converted_params(lane):
    client, seen = lane
    response = client.post(
        "/items/shirt/versions/3:run?a=1&a=2", content=b"{}", headers={"content-type": "x/y"}
    )
    assert response.json() == {"via": "lane", "name": "shirt", "version": 3}
    # For the metrics' labels, outside the lane.
    assert client.app.routes_seen == ["/items/{name}/versions/{version:int}:run"]
    assert seen == [
        {"params": {"name": "shirt", "version": 3}, "body": b"{}", "query": {"a": "2"},
         "type": "x/y"}
    ]  # fmt: skip


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


def test_the_body_is_bounded_and_a_full_queue_refuses_before_the_handler(lane):
    client, seen = lane
    response = client.post("/items/shirt/versions/3:run", content=b"x" * 101)
    assert response.status_code == 413 and "MAX_BODY_BYTES" in response.json()["error"]
    app, seen_full = build(full=True)
    with TestClient(app) as full:
        response = full.post("/items/shirt/versions/3:run", content=b"{}")
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert seen == seen_full == []
