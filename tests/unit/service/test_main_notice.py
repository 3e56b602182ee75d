"""`python -m service` says once, at start, that it runs without tokens (service/__main__.py):
an INFO line on a loopback HOST (`make serve`), a WARNING anywhere else; nothing with tokens.
In-process, with the model-serving part (`serve`) and TensorFlow's import left out."""

from __future__ import annotations

import logging

import pytest
from support.entry import run_main_in_process
from support.helpers import assert_one_error_line, logged
from support.servers import free_port

import artifact.quiet
import service.__main__ as entry

NOTICE = "No AUTH_TOKENS_FILE"


def start(monkeypatch, tmp_path, **env) -> None:
    """main() with these variables, up to the point it would serve."""
    for name, value in {"PORT": str(free_port()), "GRPC_PORT": "0",
                        "MODEL_BASE_PATH": str(tmp_path), **env}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(artifact.quiet, "quiet_tensorflow", lambda **options: None)

    def serve(settings, models, sock, announce=True):
        # The real serve() announces once its start-up checks passed (a GPU asked for, ...);
        # main() asks it to unless this process is a worker.
        sock.close()
        if announce:
            entry.announce_access(settings)
        return 0

    monkeypatch.setattr(entry, "serve", serve)
    assert entry.main([]) == 0


@pytest.mark.parametrize(
    "env, level",
    [
        pytest.param({"HOST": "127.0.0.1"}, logging.INFO, id="loopback"),
        pytest.param({"HOST": "0.0.0.0", "ALLOW_ANONYMOUS": "true"}, logging.WARNING,
                     id="every-interface-when-allowed"),
    ],
)  # fmt: skip
def test_no_tokens_is_said_once_at_start(monkeypatch, tmp_path, env, level):
    with logged("service") as records:
        start(monkeypatch, tmp_path, **env)
    (record,) = [r for r in records if NOTICE in r.getMessage()]
    assert record.levelno == level and f"HOST={env['HOST']}" in record.getMessage()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5"])
def test_off_loopback_without_tokens_the_start_is_refused(tmp_path, host):
    """The image's defaults (HOST=0.0.0.0, no tokens) served everything to anyone with a
    warning line; now they stop the start, unless ALLOW_ANONYMOUS=true says so."""
    result = run_main_in_process(MODEL_BASE_PATH=str(tmp_path), HOST=host, GRPC_PORT="0")
    assert result.returncode == 2, result.stderr
    assert assert_one_error_line(
        result.stderr, "AUTH_TOKENS_FILE", f"HOST={host}", "ALLOW_ANONYMOUS=true"
    )


def test_with_tokens_nothing_is_said(monkeypatch, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("a-token-of-enough-length predict\n")
    with logged("service") as records:
        start(monkeypatch, tmp_path, HOST="0.0.0.0", AUTH_TOKENS_FILE=str(tokens))
    assert not [r for r in records if NOTICE in r.getMessage()]
