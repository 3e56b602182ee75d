"""artifact/logs.py: the JSON lines, request ids and trace ids, LOG_CONFIG files."""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import sys

import pytest

from artifact.logs import (
    REQUEST_FIELDS,
    JSONFormatter,
    LineStream,
    LogConfigError,
    RequestLog,
    configure_logging,
    current_request,
    read_log_config,
    request_id_of,
    trace_id_of,
)

NEW_ID = re.compile(r"[0-9a-f]{32}")
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


def record(message: str = "hello %s", args=("world",), **extra) -> logging.LogRecord:
    made = logging.LogRecord("service.test", logging.WARNING, __file__, 1, message, args, None)
    made.__dict__.update(extra)
    return made


def line(made: logging.LogRecord, formatter: JSONFormatter | None = None) -> dict:
    text = (formatter or JSONFormatter()).format(made)
    assert "\n" not in text
    return json.loads(text)


# --- the JSON line --------------------------------------------------------------------------


def test_a_line_has_time_level_logger_and_message():
    made = record()
    made.created = 1_767_322_800.25  # 2026-01-02T03:00:00.250Z
    entry = line(made)
    assert entry == {
        "time": "2026-01-02T03:00:00.250Z",
        "level": "WARNING",
        "logger": "service.test",
        "message": "hello world",
    }
    # RFC 3339, in UTC: Python reads it back as the record's own time.
    parsed = dt.datetime.fromisoformat(entry["time"].replace("Z", "+00:00"))
    assert parsed.timestamp() == pytest.approx(made.created, abs=0.001)


def test_the_time_follows_the_record_across_seconds():
    formatter = JSONFormatter()
    first, second = record(), record()
    first.created, second.created = 1_767_322_800.999, 1_767_322_801.001
    assert line(first, formatter)["time"] == "2026-01-02T03:00:00.999Z"
    assert line(second, formatter)["time"] == "2026-01-02T03:00:01.001Z"


def test_a_newline_in_a_message_stays_in_one_line():
    assert line(record("two\nlines %s", ("\r\n",)))["message"] == "two\nlines \r\n"


def test_a_message_that_is_not_valid_unicode_is_still_one_line():
    # A path's undecodable byte, kept by surrogateescape: orjson refuses it, json escapes it.
    entry = line(record("GET %s", ("/a\udcff",)))
    assert entry["message"] == "GET /a\udcff"


def test_an_exception_is_written_with_its_traceback():
    try:
        raise ValueError("the cause")
    except ValueError:
        made = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    entry = line(made)
    assert entry["message"] == "failed"
    assert (
        entry["exception"].startswith("Traceback") and "ValueError: the cause" in entry["exception"]
    )


def test_a_record_made_during_a_request_carries_its_ids():
    token = current_request.set(RequestLog("abc-1", TRACE, "POST", "/predict"))
    try:
        entry = line(record())
    finally:
        current_request.reset(token)
    assert (entry["request_id"], entry["trace_id"]) == ("abc-1", TRACE)
    assert "method" not in entry  # those are the access line's
    assert "request_id" not in line(record())  # outside a request: none


def test_the_access_line_carries_every_request_field():
    request = RequestLog("abc-1", None, "POST", "/v1/models/m:predict", "127.0.0.1:5000")
    request.status, request.model, request.version = 200, "m", 3
    request.signature, request.batch_size, request.duration_ms = "serving_default", 8, 1.5
    entry = line(record(request=request))
    assert {name: entry[name] for name in REQUEST_FIELDS} == {
        "request_id": "abc-1",
        "trace_id": None,
        "method": "POST",
        "path": "/v1/models/m:predict",
        "status": 200,
        "model": "m",
        "version": 3,
        "signature": "serving_default",
        "batch_size": 8,
        "duration_ms": 1.5,
        "client": "127.0.0.1:5000",
    }


def test_another_library_s_request_extra_is_not_taken_for_the_access_line():
    assert "method" not in line(record(request="GET /elsewhere"))


def test_static_fields_are_on_every_line():
    assert line(record(), JSONFormatter({"worker": 2}))["worker"] == 2


# --- request ids and trace ids ----------------------------------------------------------------


@pytest.mark.parametrize(
    "sent",
    [
        pytest.param("a", id="one-character"),
        pytest.param("x" * 128, id="128-characters"),
        pytest.param("Req-1.2_3:4+5/6=7@host", id="every-allowed-kind"),
        pytest.param(b"f81d4fae-7dec-11d0-a765-00a0c91e6bf6", id="a-uuid-as-bytes"),
    ],
)
def test_a_good_request_id_is_kept(sent):
    kept = request_id_of(sent)
    assert kept == (sent.decode() if isinstance(sent, bytes) else sent)


@pytest.mark.parametrize(
    "sent",
    [
        pytest.param(None, id="missing"),
        pytest.param(b"", id="empty"),
        pytest.param("x" * 129, id="too-long"),
        pytest.param("two words", id="a-space"),
        pytest.param("line\nbreak", id="a-newline"),
        pytest.param('quote"d', id="a-quote"),
        pytest.param("caf\u00e9", id="not-ascii"),
        pytest.param(b"\xff\xfe", id="not-utf8"),
    ],
)
def test_a_missing_or_bad_request_id_is_replaced_by_a_new_one(sent):
    made = request_id_of(sent)
    assert NEW_ID.fullmatch(made), made
    assert request_id_of(sent) != made  # new each time


@pytest.mark.parametrize(
    "header, trace",
    [
        pytest.param(TRACEPARENT, TRACE, id="version-00"),
        pytest.param(TRACEPARENT.encode(), TRACE, id="bytes"),
        pytest.param(f"01-{TRACE}-00f067aa0ba902b7-01-later", TRACE, id="a-later-version"),
        pytest.param(None, None, id="missing"),
        pytest.param(f"00-{TRACE.upper()}-00f067aa0ba902b7-01", None, id="uppercase"),
        pytest.param(f"ff-{TRACE}-00f067aa0ba902b7-01", None, id="version-ff"),
        pytest.param(f"00-{'0' * 32}-00f067aa0ba902b7-01", None, id="zero-trace"),
        pytest.param(f"00-{TRACE}-{'0' * 16}-01", None, id="zero-parent"),
        pytest.param(f"00-{TRACE}-00f067aa0ba902b7-01-more", None, id="version-00-with-more"),
        pytest.param(f"00-{TRACE[:-1]}-00f067aa0ba902b7-01", None, id="short-trace"),
        pytest.param("garbage", None, id="garbage"),
    ],
)
def test_the_trace_id_of_a_traceparent(header, trace):
    assert trace_id_of(header) == trace


# --- LOG_CONFIG --------------------------------------------------------------------------------


@pytest.fixture
def restored_logging():
    """The root logger and the `logs.test` logger put back as they were."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    yield
    named = logging.getLogger("logs.test")
    for handler in named.handlers[:]:
        named.removeHandler(handler)
        handler.close()
    named.setLevel(logging.NOTSET)
    named.propagate = True
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    root.handlers[:], root.level = saved
    logging.captureWarnings(False)


def bare_root() -> None:
    """No handler on the root logger (pytest puts its own there for each test's call):
    configure_logging leaves a root that has one as it is."""
    logging.getLogger().handlers[:] = []
    logging.getLogger().setLevel(logging.NOTSET)


def file_handler_config(path) -> dict:
    return {
        "version": 1,
        "formatters": {"json": {"()": "artifact.logs.JSONFormatter"}},
        "handlers": {
            "file": {"class": "logging.FileHandler", "filename": str(path), "formatter": "json"}
        },
        "loggers": {"logs.test": {"handlers": ["file"], "level": "DEBUG", "propagate": False}},
    }


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_log_config_file_is_applied_over_the_format(tmp_path, restored_logging, suffix):
    written = tmp_path / "lines.log"
    config = tmp_path / f"logging{suffix}"
    # JSON is YAML too: the .yaml file holds the same text.
    config.write_text(json.dumps(file_handler_config(written)))
    bare_root()
    configure_logging("text", "warning", config)
    logging.getLogger("logs.test").debug("below the root's level, and %s", "kept")
    entry = json.loads(written.read_text().strip())
    assert (entry["logger"], entry["level"], entry["message"]) == (
        "logs.test",
        "DEBUG",
        "below the root's level, and kept",
    )
    assert logging.getLogger().level == logging.WARNING


def test_json_logs_write_json_to_stderr(restored_logging, capsys):
    bare_root()
    configure_logging("json", "info")
    logging.getLogger("logs.test").info("to %s", "stderr")
    entry = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert (entry["logger"], entry["message"]) == ("logs.test", "to stderr")


@pytest.mark.parametrize(
    "name, text, expected",
    [
        pytest.param("bad.json", "{not json", "not valid JSON", id="bad-json"),
        pytest.param("bad.yaml", "a: [unclosed", "not valid YAML", id="bad-yaml"),
        pytest.param("list.yaml", "- 1\n- 2\n", "expected a mapping", id="not-a-mapping"),
        pytest.param("v.yaml", "handlers: {}\n", "expected `version: 1`", id="no-version"),
    ],
)
def test_a_log_config_that_cannot_be_read_says_why_in_one_line(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(LogConfigError) as caught:
        read_log_config(path)
    message = str(caught.value)
    assert message.startswith(str(path)) and expected in message and "\n" not in message


def test_a_yaml_log_config_without_pyyaml_says_to_write_json(tmp_path, monkeypatch):
    path = tmp_path / "logging.yaml"
    path.write_text("version: 1\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # as in the API image: no PyYAML
    with pytest.raises(LogConfigError, match=r"needs PyYAML.*as JSON, in a \.json file"):
        read_log_config(path)
    json_path = tmp_path / "logging.json"
    json_path.write_text('{"version": 1}')
    assert read_log_config(json_path) == {"version": 1}


def test_a_missing_log_config_says_so(tmp_path):
    with pytest.raises(LogConfigError, match="cannot read it"):
        read_log_config(tmp_path / "absent.yaml")


def test_a_log_config_dictconfig_refuses_is_one_line(tmp_path, restored_logging):
    path = tmp_path / "logging.yaml"
    path.write_text("version: 1\nhandlers:\n  h:\n    class: no.such.Handler\n")
    with pytest.raises(LogConfigError, match=r"logging\.config\.dictConfig: .*h") as caught:
        configure_logging("json", "info", path)
    assert "\n" not in str(caught.value)


# --- the trainer's printed lines as records ----------------------------------------------------


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[tuple[str, str]] = []

    def emit(self, record):
        self.records.append((record.levelname, record.getMessage()))


def test_each_printed_line_is_one_record_at_the_level_its_words_say():
    logger = logging.getLogger("logs.test.lines")
    collect = Records()
    logger.addHandler(collect)
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    try:
        stream = LineStream(logger, sys.__stderr__)
        print("Exported 3", "after 1.0 min", file=stream)  # pieces of one line
        stream.write("error: no data\n\nwarning: slow\r\npython -m training: error: bad")
        assert collect.records[-1] == ("WARNING", "warning: slow")  # blank line dropped
        stream.finish()  # the last line, without its newline
    finally:
        logger.removeHandler(collect)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)
    assert collect.records == [
        ("INFO", "Exported 3 after 1.0 min"),
        ("ERROR", "error: no data"),
        ("WARNING", "warning: slow"),
        ("ERROR", "python -m training: error: bad"),
    ]
    assert not stream.isatty()


def test_a_root_logger_set_up_already_is_left_as_it_is(restored_logging):
    bare_root()
    mine = logging.NullHandler()
    logging.getLogger().addHandler(mine)
    configure_logging("json", "debug")
    assert logging.getLogger().handlers == [mine]
    assert logging.getLogger().level == logging.NOTSET
