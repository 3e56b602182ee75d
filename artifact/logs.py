"""Log lines for both programs, the service and the trainer: text for a person at a terminal, or
one JSON object per line for a log pipeline (LOG_FORMAT, `python -m training --log-format`), or
whatever a `logging.config.dictConfig` file says (LOG_CONFIG).

A JSON line holds `time` (RFC 3339, UTC, milliseconds), `level`, `logger` and `message`, and
`exception` (the traceback) when the record has one. A record made while a request is being
answered carries the request's `request_id` and `trace_id` (`current_request`, a context
variable the service sets for each request); the access line, one per HTTP request and gRPC
call, carries every field of `REQUEST_FIELDS` (null where it does not apply: no model for
/healthz).

Request ids (`request_id`): the client's `X-Request-ID` when it is 1 to MAX_REQUEST_ID
characters of a safe set, else a new random one (32 hex digits); a trace id from a W3C
`traceparent` header when it is a valid one (`trace_id_of`).
"""

from __future__ import annotations

import atexit
import io
import json
import logging
import logging.config
import os
import re
import sys
import time
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import orjson

FORMATS = ("text", "json")
# Every field of an access line, in the order it is written.
REQUEST_FIELDS = (
    "request_id",
    "trace_id",
    "method",
    "path",
    "status",
    "model",
    "version",
    "signature",
    "batch_size",
    "duration_ms",
    "client",
)
# A request id a client sends is kept when it is 1 to this many of these characters (letters,
# digits and . _ : + / = @ -: nothing a log line or a header could be broken with).
MAX_REQUEST_ID = 128
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:+/=@-]{1,%d}" % MAX_REQUEST_ID)
# W3C Trace Context: version-trace_id-parent_id-flags, lowercase hex; a later version may add
# fields after a dash.
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_ZERO_TRACE = b"0" * 32
_ZERO_PARENT = b"0" * 16


class LogConfigError(Exception):
    """LOG_CONFIG cannot be used: one line saying why."""


class RequestLog:
    """What the log knows of one request, filled in as it is answered: its ids at once, the
    model, version, signature and batch size once a model answered it, its status and
    duration at the end."""

    __slots__ = REQUEST_FIELDS

    def __init__(
        self,
        request_id: str,
        trace_id: str | None = None,
        method: str | None = None,
        path: str | None = None,
        client: str | None = None,
    ):
        self.request_id = request_id
        self.trace_id = trace_id
        self.method = method
        self.path = path
        self.client = client
        self.status: int | None = None
        self.model: str | None = None
        self.version: int | None = None
        self.signature: str | None = None
        self.batch_size: int | None = None
        self.duration_ms: float | None = None

    def fields(self) -> dict:
        """Every field, None where it is not known."""
        return {name: getattr(self, name) for name in REQUEST_FIELDS}


# The request being answered in this task (the service sets it for each HTTP request and gRPC
# call); None outside one.
current_request: ContextVar[RequestLog | None] = ContextVar("current_request", default=None)


def new_request_id() -> str:
    """A fresh request id: 128 random bits as 32 hex digits."""
    return os.urandom(16).hex()


def request_id_of(sent: bytes | str | None) -> str:
    """The id a request is known by: the one its client sent (X-Request-ID) when it is 1 to
    MAX_REQUEST_ID characters of the safe set (_REQUEST_ID), else a new one."""
    if isinstance(sent, str):
        sent = sent.encode("utf-8", "replace")
    if sent and _REQUEST_ID.fullmatch(sent):
        return sent.decode("ascii")
    return new_request_id()


def trace_id_of(traceparent: bytes | str | None) -> str | None:
    """The trace id of a W3C `traceparent` header (32 hex digits), or None when there is none
    or it is not a valid one (version ff, an all-zero trace or parent id, a wrong length)."""
    if not traceparent:
        return None
    if isinstance(traceparent, str):
        traceparent = traceparent.encode("utf-8", "replace")
    found = _TRACEPARENT.fullmatch(traceparent.strip())
    if found is None:
        return None
    version, trace, parent, _, rest = found.groups()
    if version == b"ff" or trace == _ZERO_TRACE or parent == _ZERO_PARENT:
        return None
    if version == b"00" and rest:
        return None  # version 00 has exactly four fields
    return trace.decode("ascii")


def _dumps(entry: dict) -> str:
    try:
        return orjson.dumps(entry, default=str).decode()
    except TypeError:  # a lone surrogate (a path's undecodable byte): json escapes it
        return json.dumps(entry, default=str, separators=(",", ":"))


class JSONFormatter(logging.Formatter):
    """One JSON object per record, on one line (a newline in a message is escaped).

    Args:
        static: fields every line carries (the service's `worker`).
    """

    def __init__(self, static: dict | None = None):
        super().__init__()
        self.static = dict(static or {})
        # (second, its text): one tuple, replaced whole, as handlers on other threads (each
        # with its own lock) may share this formatter.
        self._second: tuple[int, str] = (-1, "")

    def _time(self, created: float) -> str:
        # strftime once a second: the access line is written per request. Microseconds
        # rounded first: a float near 2e9 holds x.001 as x.000999927.
        seconds, micros = divmod(round(created * 1_000_000), 1_000_000)
        cached = self._second
        if cached[0] != seconds:
            cached = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))
            self._second = cached
        return f"{cached[1]}.{micros // 1000:03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self._time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request = record.__dict__.get("request")
        if isinstance(request, RequestLog):  # the access line: every field
            entry.update(request.fields())
        else:
            request = current_request.get()
            if request is not None:
                entry["request_id"] = request.request_id
                entry["trace_id"] = request.trace_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        if self.static:
            entry.update(self.static)
        return _dumps(entry)


def text_formatter(who: str = "") -> logging.Formatter:
    """The text lines: time, level, logger (and `who`, a worker's tag), message."""
    return logging.Formatter(f"%(asctime)s %(levelname)s %(name)s{who}: %(message)s")


def read_log_config(path: str | Path) -> dict:
    """A `logging.config.dictConfig` dictionary from a JSON or YAML file (by its suffix:
    .json is JSON, anything else YAML, which JSON is a part of; YAML needs PyYAML, which the
    development venvs have and the images do not).

    Raises:
        LogConfigError: the file cannot be read or parsed, or is not a mapping with `version`.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or err
        raise LogConfigError(f"{path}: cannot read it: {reason}") from err
    if path.suffix.lower() == ".json":
        load = json.loads
    else:
        try:
            # PyYAML ships no types, and its stubs are not in the dev lock: only safe_load is used.
            import yaml  # type: ignore[import-untyped]
        except ImportError:
            raise LogConfigError(
                f"{path}: a YAML file needs PyYAML, which is not installed here (the API image "
                "has none); write the same dictionary as JSON, in a .json file"
            ) from None
        load = yaml.safe_load
    try:
        config = load(text)
    except Exception as err:  # noqa: BLE001 - json's and yaml's errors, said in one line
        problem = " ".join(str(err).split())
        raise LogConfigError(f"{path}: not valid {_kind(path)}: {problem}") from err
    if not isinstance(config, dict):
        raise LogConfigError(
            f"{path}: expected a mapping (logging.config.dictConfig's), got {type(config).__name__}"
        )
    if config.get("version") != 1:
        raise LogConfigError(
            f"{path}: expected `version: 1` (logging.config.dictConfig's schema), got "
            f"{config.get('version')!r}"
        )
    return config


def _kind(path: Path) -> str:
    return "JSON" if path.suffix.lower() == ".json" else "YAML"


def configure_logging(
    log_format: str,
    level: str | int = logging.INFO,
    config_file: str | Path | None = None,
    who: str = "",
    static: dict | None = None,
) -> None:
    """Set up the root logger, unless it has handlers already: one handler on stderr in
    `log_format` (text or json) at `level`; then, with `config_file`, that file's dictConfig on
    top (its loggers, handlers and formatters; a formatter may name `()`:
    artifact.logs.JSONFormatter).

    Raises:
        LogConfigError: `config_file` cannot be read, parsed or applied.
    """
    config = read_log_config(config_file) if config_file else None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter(static) if log_format == "json" else text_formatter(who))
    root = logging.getLogger()
    # As logging.basicConfig: a root logger set up already (a test's) is left as it is.
    if not root.handlers:
        root.addHandler(handler)
        root.setLevel(level.upper() if isinstance(level, str) else level)
    if log_format == "json":
        # Python's warnings are log records too, not lines of their own.
        logging.captureWarnings(True)
    if config is not None:
        config.setdefault("disable_existing_loggers", False)
        try:
            logging.config.dictConfig(config)
        except Exception as err:  # noqa: BLE001 - dictConfig raises ValueError and others
            problem = " ".join(str(err).split())
            raise LogConfigError(f"{config_file}: logging.config.dictConfig: {problem}") from err


def formatter_for(log_format: str) -> logging.Formatter | None:
    """The root handler's formatter when it is `log_format`'s JSON one (for loggers that keep
    handlers of their own, as TensorFlow's does), else None."""
    if log_format != "json":
        return None
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, JSONFormatter):
            return handler.formatter
    return JSONFormatter()


# `error: ...`, and argparse's `prog: error: ...`; `warning: ...`, `interrupted: ...`.
_ERROR_LINE = re.compile(r"\s*(?:[\w .-]+: )?error:", re.IGNORECASE)
_WARNING_LINE = re.compile(r"\s*(?:warning|interrupted):", re.IGNORECASE)


class LineStream(io.TextIOBase):
    """A text stream each of whose lines is written as one log record of `logger` (a
    program's stdout or stderr, for JSON logs): at ERROR when it starts with `error:` (or
    argparse's `prog: error:`), at WARNING with `warning:` or `interrupted:`, else at INFO.
    A line is written when its newline comes (or at exit); blank lines are dropped."""

    def __init__(self, logger: logging.Logger, original):
        super().__init__()
        self.logger = logger
        self.original = original
        self._partial = ""

    encoding = "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False  # progress bars write whole lines, not a line redrawn

    def fileno(self) -> int:
        return self.original.fileno()

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._emit(line)
        return len(text)

    def finish(self) -> None:
        """Write the last line even without its newline."""
        partial, self._partial = self._partial, ""
        self._emit(partial)

    def _emit(self, line: str) -> None:
        line = line.rstrip("\r")
        if not line.strip():
            return
        level = logging.INFO
        if _ERROR_LINE.match(line):
            level = logging.ERROR
        elif _WARNING_LINE.match(line):
            level = logging.WARNING
        self.logger.log(level, "%s", line)


def print_as_json_lines(program: str) -> None:
    """From now on every line the program prints (sys.stdout, sys.stderr) is one JSON object
    on the same stream, logger `<program>.stdout` or `<program>.stderr`, and an exception that
    ends the program is one record with its traceback. Once per process."""
    if isinstance(sys.stderr, LineStream):
        return
    formatter = JSONFormatter()
    streams = []
    for name in ("stdout", "stderr"):
        original = getattr(sys, name)
        handler = logging.StreamHandler(original)
        handler.setFormatter(formatter)
        logger = logging.getLogger(f"{program}.{name}")
        logger.handlers = [handler]
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
        stream = LineStream(logger, original)
        setattr(sys, name, stream)
        streams.append(stream)

    def uncaught(kind, value, traceback) -> None:
        logging.getLogger(program).critical(
            "%s: %s", kind.__name__, value, exc_info=(kind, value, traceback)
        )

    def finish() -> None:
        for stream in streams:
            stream.finish()

    sys.excepthook = uncaught
    atexit.register(finish)
