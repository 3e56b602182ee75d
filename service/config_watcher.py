"""The model config the service serves: TF Serving's file (MODEL_CONFIG_FILE), re-read every
MODEL_CONFIG_FILE_POLL_SECONDS, or the MODEL_NAME / MODEL_BASE_PATH shortcut.

As TF Serving does, a reload applies the new config whole: models no longer listed are
unloaded, new ones loaded, policies and labels changed. A config that does not parse, breaks
a rule, or cannot be realized (a label to a version that is not available) is refused whole:
the previous one keeps serving, the log says why at ERROR, and the status says it too; the
file is tried again at the next poll.

A config can also come over gRPC (ModelService.HandleReloadConfigRequest): `apply` serves it
the same way, and it holds until the file changes (TF Serving, which re-applies the file at
every poll, would undo it within MODEL_CONFIG_FILE_POLL_SECONDS).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from pathlib import Path

from artifact.model_config import ConfigError, ModelEntry, read_config
from service.backends.base import Backend

log = logging.getLogger("service.config")


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class ConfigWatcher:
    """Re-reads the model config file and has the backend apply it when it changed.

    Args:
        path: MODEL_CONFIG_FILE.
        poll_seconds: MODEL_CONFIG_FILE_POLL_SECONDS; 0 = read at start only.
        backend: applies a new config (or refuses it with ConfigError).
    """

    def __init__(self, path: str | Path, poll_seconds: float, backend: Backend):
        self.path = Path(path)
        self.poll_seconds = poll_seconds
        self.backend = backend
        self._text = self._read()
        self._task: asyncio.Task | None = None
        self.applied_at = _now()
        self.applied_from = "file"
        self.error: str | None = None
        self.error_at: str | None = None

    def _read(self) -> str | None:
        try:
            return self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def start(self) -> None:
        if self.poll_seconds > 0:
            self._task = asyncio.create_task(self._poll(), name="model-config-poller")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_seconds)
            try:
                await self.check()
            except Exception:  # pragma: no cover - the poller must outlive any one failure
                log.exception("reloading the model config failed")

    async def check(self) -> bool:
        """Apply the file if it changed since it was applied; True when a new config serves.

        A refused file is tried again at every poll, as TF Serving does: a label waiting for
        its version to become AVAILABLE applies once it is. The ERROR is logged once per
        distinct reason.
        """
        text = self._read()
        if text == self._text and self.error is None:
            return False  # unchanged since it was applied
        self._text = text
        try:
            entries = read_config(self.path)
            changes = await self.backend.apply_config(entries)
        except ConfigError as err:
            if str(err) != self.error:
                log.error(
                    "Model config %s refused, the previous one keeps serving: %s", self.path, err
                )
                self.error_at = _now()
            self.error = str(err)
            return False
        self.error, self.error_at, self.applied_at = None, None, _now()
        self.applied_from = "file"
        log.info(
            "Model config %s applied%s", self.path, ": " + "; ".join(changes) if changes else ""
        )
        return True

    async def apply(self, entries: list[ModelEntry], source: str) -> list[str]:
        """Serve a config that came from `source` (not the file), whole, or refuse it whole;
        what changed. It holds until the file changes.

        Raises:
            ConfigError: the backend refused it; the previous config keeps serving.
        """
        changes = await self.backend.apply_config(entries)
        # The file, unchanged from now on, is not applied over it at the next poll.
        self._text = self._read()
        self.error, self.error_at, self.applied_at = None, None, _now()
        self.applied_from = source
        return changes

    def status(self) -> dict:
        return {
            "file": str(self.path),
            "poll_seconds": self.poll_seconds,
            "applied_at": self.applied_at,
            "applied_from": self.applied_from,
            "error": self.error,
            "error_at": self.error_at,
        }
