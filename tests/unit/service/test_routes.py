"""service/routes.py: routes declared once, matched by path then method, TF Serving's words in
any case where a route says so, and the same declarations behind the OpenAPI document."""

from __future__ import annotations

import pytest
from support.fakes import FakeBackend

from service.app import create_app
from service.openapi import openapi_document
from service.routes import Body, NoSuchMethod, Route, RouteTable
from service.settings import Settings


async def handler(call, **params):
    return params


def route(method: str, path: str, **more) -> Route:
    return Route(method, path, handler, f"{method} {path}", None, **more)


TABLE = RouteTable(
    [
        route("POST", "/v1/models/{name:name}:predict", any_case=True),
        route("POST", "/v1/models/{name:name}/versions/{version}:predict", any_case=True),
        route("GET", "/v1/models/{name:name}", any_case=True),
        route("GET", "/v2/models/{name}"),
        route("POST", "/predict"),
        route("POST", "/predict/{name:name}"),
        route("GET", "/healthz"),
    ]
)


@pytest.mark.parametrize(
    "method, path, template, params",
    [
        pytest.param("POST", "/v1/models/m:predict", "/v1/models/{name}:predict", {"name": "m"},
                     id="verb"),
        pytest.param("POST", "/V1/MODELS/Mixed_Case:PREDICT", "/v1/models/{name}:predict",
                     {"name": "Mixed_Case"}, id="any-case-words-keep-the-name"),
        pytest.param("POST", "/v1/Models/m/Versions/3:Predict",
                     "/v1/models/{name}/versions/{version}:predict",
                     {"name": "m", "version": "3"}, id="version"),
        pytest.param("GET", "/v1/models/m", "/v1/models/{name}", {"name": "m"}, id="status"),
        pytest.param("HEAD", "/v1/models/m", "/v1/models/{name}", {"name": "m"}, id="head"),
        pytest.param("GET", "/v2/models/a:b", "/v2/models/{name}", {"name": "a:b"},
                     id="v2-names-may-hold-colons"),
        pytest.param("POST", "/predict", "/predict", {}, id="exact"),
        pytest.param("POST", "/predict/m", "/predict/{name}", {"name": "m"}, id="friendly"),
    ],
)  # fmt: skip
def test_a_request_finds_its_route_and_parameters(method, path, template, params):
    found = TABLE.match(method, path)
    assert (found.route.template, found.params) == (template, params)


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/v1/models/m:predict/x", id="trailing"),
        pytest.param("/V2/models/m", id="v2-is-case-sensitive"),
        pytest.param("/HEALTHZ", id="exact-is-case-sensitive"),
        pytest.param("/v1/models/a/b:predict", id="a-name-is-one-segment"),
        pytest.param("/v1/models/m:predict:predict", id="a-name-has-no-colon"),
        pytest.param("/nothing", id="unknown"),
    ],
)
def test_paths_no_route_has(path):
    assert TABLE.match("GET", path) is None and TABLE.match("POST", path) is None


def test_a_known_path_with_another_method_says_which_it_takes():
    with pytest.raises(NoSuchMethod) as caught:
        TABLE.match("GET", "/V1/models/m:predict")
    assert caught.value.allowed == ("POST",)
    assert caught.value.template == "/v1/models/{name}:predict"
    with pytest.raises(NoSuchMethod) as caught:
        TABLE.match("DELETE", "/healthz")
    assert caught.value.allowed == ("GET",)


def test_two_routes_of_one_method_and_path_are_refused():
    with pytest.raises(ValueError, match="two routes for GET /V1/MODELS/{name:name}"):
        RouteTable([route("GET", "/v1/models/{name:name}", any_case=True),
                    route("GET", "/V1/MODELS/{name:name}", any_case=True)])  # fmt: skip
    with pytest.raises(ValueError, match="unknown parameter kind 'int'"):
        RouteTable([route("GET", "/x/{n:int}")])


def test_the_service_declares_each_route_once_and_documents_what_it_dispatches():
    table = create_app(Settings(), FakeBackend()).ingress.table
    document = openapi_document(table, "t", "0", "d")
    documented = {
        (method.upper(), path) for path, operations in document["paths"].items()
        for method in operations
    }  # fmt: skip
    declared = {(r.method, r.template) for r in table.routes if r.documented}
    assert documented == declared
    assert len(declared) >= 30
    # Each protocol's route is there, with its body where it takes one.
    predict = document["paths"]["/v1/models/{name}:predict"]["post"]
    assert predict["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert {"200", "400", "401", "403", "413", "503"} <= set(predict["responses"])
    assert "requestBody" not in document["paths"]["/v1/models/{name}"]["get"]
    names = [p for p in predict["parameters"] if p["in"] == "path"]
    assert names == [{"name": "name", "in": "path", "required": True,
                      "schema": {"type": "string", "pattern": "^[^/:]+$"}}]  # fmt: skip


def test_a_route_with_a_body_documents_its_other_media_types():
    body = Body({"type": "object"}, {"a": 1}, {"multipart/form-data": {"schema": {}}})
    table = RouteTable([route("POST", "/upload", body=body)])
    content = openapi_document(table, "t", "0", "d")["paths"]["/upload"]["post"]["requestBody"]
    assert set(content["content"]) == {"application/json", "multipart/form-data"}
    assert content["content"]["application/json"]["example"] == {"a": 1}
