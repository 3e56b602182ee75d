"""schemathesis against a real service: every route, generated requests valid and invalid, no
5xx and no status or content type the OpenAPI schema does not list.

Bounded and repeatable: a fixed number of examples per operation, derandomized (the same
requests every run); every operation runs in one test, which lists each failing operation.
"""

from __future__ import annotations

import hypothesis
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, status_code_conformance
from support.servers import copy_repository, start_server

EXAMPLES_PER_OPERATION = 25
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance]


@pytest.fixture(scope="module")
def api_server(trained_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("openapi")
    base = copy_repository(trained_model, root)
    server = start_server(root / "server.log", MODEL_BASE_PATH=str(base), MAX_IMAGES="4")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def operations(api_server) -> dict:
    schema = schemathesis.openapi.from_url(f"{api_server.url}/openapi.json")
    found = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        found[f"{operation.method.upper()} {operation.path}"] = operation
    return found


def test_the_schema_lists_every_route(operations):
    assert len(operations) >= 25, sorted(operations)
    for key in ("POST /v1/models/{name}:predict", "POST /predict", "POST /v2/models/{name}/infer",
                "GET /v1/models/{name}/rollout", "GET /metrics"):  # fmt: skip
        assert key in operations


def test_every_answer_is_documented_and_none_is_a_server_error(operations, api_server):
    failures = []
    for key, operation in sorted(operations.items()):

        @hypothesis.given(case=operation.as_strategy())
        @hypothesis.settings(
            max_examples=EXAMPLES_PER_OPERATION,
            derandomize=True,
            deadline=None,
            suppress_health_check=list(hypothesis.HealthCheck),
            database=None,
            phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
        )
        def exercise(case):
            case.call_and_validate(base_url=api_server.url, checks=CHECKS, timeout=30)

        try:
            exercise()
        except Exception as err:  # noqa: BLE001 - every operation is tried; all failures shown
            failures.append(f"{key}: {str(err)[:1500]}")
    assert not failures, "\n\n".join(failures)
