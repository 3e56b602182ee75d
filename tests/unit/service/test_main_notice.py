"""`python -m service` says once, at start, that it runs without tokens (service/__main__.py):
an INFO line on a loopback HOST (`make serve`), a WARNING anywhere else; nothing with tokens.
In-process, with the model-serving part (`serve`) and TensorFlow's import left out."""

from __future__ import annotations

import logging

import pytest
from support.helpers import logged
from support.servers import free_port

import artifact.quiet
import service.__main__ as entry

NOTICE = "No AUTH_TOKENS_FILE"


def start(monkeypatch, tmp_path, **env) -> None:
    """main() with these variables, up to the point it would serve."""
    for name, value in {"PORT": str(free_port()), "GRPC_PORT": "0",
                        "MODEL_BASE_PATH": str(tmp_path), **env}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(artifact.quiet, "quiet_tensorflow", lambda: None)

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
    "host, level",
    [
        pytest.param("127.0.0.1", logging.INFO, id="loopback"),
        pytest.param("0.0.0.0", logging.WARNING, id="every-interface"),
    ],
)
def test_no_tokens_is_said_once_at_start(monkeypatch, tmp_path, host, level):
    with logged("service") as records:
        start(monkeypatch, tmp_path, HOST=host)
    (record,) = [r for r in records if NOTICE in r.getMessage()]
    assert record.levelno == level and f"HOST={host}" in record.getMessage()


def test_with_tokens_nothing_is_said(monkeypatch, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("a-token-of-enough-length predict\n")
    with logged("service") as records:
        start(monkeypatch, tmp_path, HOST="0.0.0.0", AUTH_TOKENS_FILE=str(tokens))
    assert not [r for r in records if NOTICE in r.getMessage()]
