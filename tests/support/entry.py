"""`service.__main__.main()` in the test process, for the start-up refusals.

Service side only: it imports the service (the training side's tests start it as a process,
support/servers.py).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess

import pytest

from support.servers import free_port, settings_vars


def run_main_in_process(
    args: list[str] | None = None, **overrides: str
) -> subprocess.CompletedProcess:
    """`service.__main__.main(args)` in this process (no arguments unless given), with the
    environment `run_service` gives `python -m service`: for the start-up refusals (exit code
    2, one line on stderr), which come before anything loads, and `--help`. A subprocess costs a second of CPU in imports each; the real
    `python -m service` entry point keeps tests of its own (tests/unit/service/test_main.py).

    Going on to serve (or to supervise workers) fails the test instead: a refusal that
    regressed neither loads TensorFlow nor listens here.
    """
    from service import __main__ as entry

    def refused_to_serve(*args, **kwargs):
        raise AssertionError(f"main() went on to serve with {overrides}; expected a refusal")

    stdout, stderr = io.StringIO(), io.StringIO()
    # main() puts the settings its flags give into the environment (for the workers it starts):
    # the test process's environment is put back whole afterwards.
    saved = dict(os.environ)
    try:
        with pytest.MonkeyPatch.context() as patch:
            for name in settings_vars():
                patch.delenv(name, raising=False)
            env = {"GRPC_PORT": "0", "PORT": str(free_port()), **overrides}
            for name, value in env.items():
                patch.setenv(name, value)
            patch.setattr(entry, "serve", refused_to_serve)
            patch.setattr(entry, "supervise", refused_to_serve)
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                code = entry.main(list(args or []))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(
        ["service.__main__.main()", *(args or [])], code, stdout.getvalue(), stderr.getvalue()
    )
