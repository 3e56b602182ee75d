"""Every HTTP request's id (X-Request-ID, kept or made), its trace id, the log records it
carries them in, and its JSON access line (service/ingress.py, artifact/logs.py); LOG_FORMAT
and LOG_CONFIG at start (service/__main__.py)."""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest
from support.entry import run_main_in_process
from support.fakes import MODEL_NAME, FakeBackend, app_client
from support.servers import run_service

from artifact.logs import REQUEST_FIELDS, JSONFormatter
from service.settings import Settings

NEW_ID = re.compile(r"[0-9a-f]{32}")
PREDICT = f"/v1/models/{MODEL_NAME}:predict"
BODY = {"instances": np.zeros((3, 28, 28)).tolist()}
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


class JSONLines(logging.Handler):
    """The JSON lines a logger writes, parsed."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.setFormatter(JSONFormatter())
        self.entries: list[dict] = []

    def emit(self, record):
        self.entries.append(json.loads(self.format(record)))


@pytest.fixture
def lines(monkeypatch):
    """The JSON lines of every `service` logger, at INFO, during the test."""
    logger = logging.getLogger("service")
    collect = JSONLines()
    # Whatever other tests did to logging in this process: this logger, at INFO, enabled.
    monkeypatch.setattr(logger, "disabled", False)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(collect)
    yield collect.entries
    logger.removeHandler(collect)
    logger.setLevel(level)


@pytest.fixture
def client():
    with app_client(FakeBackend()) as c:
        yield c


@pytest.mark.parametrize(
    "sent, kept",
    [
        pytest.param("order-42.retry_1:a+b/c=d@gw", True, id="kept"),
        pytest.param("x" * 128, True, id="128-characters-kept"),
        pytest.param("x" * 129, False, id="too-long"),
        pytest.param("two words", False, id="bad-characters"),
        pytest.param(None, False, id="missing"),
    ],
)
def test_a_request_is_answered_with_its_id_or_a_new_one(client, sent, kept):
    headers = {} if sent is None else {"X-Request-ID": sent}
    for path in ("/healthz", "/no/such/path"):  # an answer and an error
        answered = client.get(path, headers=headers).headers["x-request-id"]
        if kept:
            assert answered == sent
        else:
            assert NEW_ID.fullmatch(answered), answered
    if not kept:
        assert client.get("/healthz", headers=headers).headers["x-request-id"] != answered


def test_a_refused_request_is_answered_with_its_id(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("predictor-token-0123456789 predict\n")
    with app_client(FakeBackend(), auth_tokens_file=str(tokens)) as client:
        response = client.post(PREDICT, json=BODY, headers={"X-Request-ID": "refused-1"})
    assert response.status_code == 401
    assert response.headers["x-request-id"] == "refused-1"


def test_the_access_line_says_what_answered_the_request(client, lines):
    headers = {"X-Request-ID": "access-1", "traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}
    assert client.post(PREDICT, json=BODY, headers=headers).status_code == 200
    (access,) = [entry for entry in lines if entry["logger"] == "service.access"]
    assert set(REQUEST_FIELDS) <= set(access)
    assert access["duration_ms"] > 0
    assert access["client"].startswith("testclient:")
    del access["duration_ms"], access["client"], access["time"], access["message"]
    assert access == {
        "level": "INFO",
        "logger": "service.access",
        "request_id": "access-1",
        "trace_id": TRACE,
        "method": "POST",
        "path": PREDICT,
        "status": 200,
        "model": MODEL_NAME,
        "version": 1,
        "signature": "serving_default",
        "batch_size": 3,
    }


def test_a_request_that_reaches_no_model_has_null_model_fields(client, lines):
    client.get("/healthz", headers={"X-Request-ID": "probe-1"})
    (access,) = [entry for entry in lines if entry["logger"] == "service.access"]
    assert (access["request_id"], access["status"], access["path"]) == ("probe-1", 200, "/healthz")
    assert access["model"] is access["version"] is access["batch_size"] is None


def test_a_record_made_while_a_request_is_answered_carries_its_ids(client, lines):
    headers = {"X-Request-ID": "missing-model-1", "traceparent": f"00-{TRACE}-0af7651916cd43dd-01"}
    response = client.post("/v1/models/nobody:predict", json=BODY, headers=headers)
    assert response.status_code == 404
    # The error's own line (client errors at INFO), not only the access line.
    (error,) = [e for e in lines if e["logger"] != "service.access" and "nobody" in e["message"]]
    assert (error["request_id"], error["trace_id"]) == ("missing-model-1", TRACE)
    (access,) = [entry for entry in lines if entry["logger"] == "service.access"]
    # No version answered it: no model, version or signature.
    assert access["status"] == 404
    assert access["model"] is access["version"] is access["signature"] is None


@pytest.mark.parametrize(
    "log_format, terminal, json_logs",
    [
        pytest.param("text", False, False, id="text"),
        pytest.param("json", True, True, id="json"),
        pytest.param("auto", True, False, id="auto-at-a-terminal"),
        pytest.param("auto", False, True, id="auto-elsewhere"),
        pytest.param("JSON", True, True, id="any-case"),
    ],
)
def test_log_format(log_format, terminal, json_logs):
    assert Settings(log_format=log_format).json_logs(terminal) is json_logs


def test_the_default_log_format_is_text():
    assert Settings().log_format == "text"


# --- at start: one line, exit 2 ------------------------------------------------------------


def one_error_line(result) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_a_bad_log_format_exits_2_naming_it(tmp_path):
    line = one_error_line(run_main_in_process(MODEL_BASE_PATH=str(tmp_path), LOG_FORMAT="xml"))
    assert "LOG_FORMAT" in line and "xml" in line


def test_a_missing_log_config_exits_2_naming_it(tmp_path):
    missing = tmp_path / "absent.yaml"
    line = one_error_line(
        run_main_in_process(MODEL_BASE_PATH=str(tmp_path), LOG_CONFIG=str(missing))
    )
    assert "LOG_CONFIG" in line and "no such file" in line


def test_a_log_config_that_does_not_parse_exits_2_naming_it(tmp_path):
    config = tmp_path / "logging.json"
    config.write_text('{"version": 1,')
    line = one_error_line(
        run_main_in_process(MODEL_BASE_PATH=str(tmp_path), LOG_CONFIG=str(config))
    )
    assert line.startswith(f"error: LOG_CONFIG: {config}: not valid JSON"), line


def test_python_m_service_exits_2_on_a_log_config_dictconfig_refuses(tmp_path):
    # The entry point itself: dictConfig's refusal after the root handler is set, one line.
    config = tmp_path / "logging.yaml"
    config.write_text("version: 1\nhandlers:\n  h:\n    class: no.such.Handler\n")
    result = run_service(timeout=60, MODEL_BASE_PATH=str(tmp_path), LOG_CONFIG=str(config))
    line = one_error_line(result)
    assert line.startswith(f"error: LOG_CONFIG: {config}: logging.config.dictConfig:"), line
    assert "Traceback" not in result.stderr
