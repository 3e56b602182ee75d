"""In-process TensorFlow: the model repository's versions loaded and run in this process.

The version registry (service/registry.py) decides what is loaded and what serves; this
backend gives it a loader that loads and warms a SavedModel in TensorFlow's one worker
thread, and runs predictions there, off the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import gc
import logging
from pathlib import Path

import numpy as np

from artifact.contract import SIGNATURE_NAME
from artifact.repository import version_labels
from artifact.saved_model import SavedModelPredictor
from artifact.warmup import read_warmup_requests
from service.backends.base import Backend
from service.backends.device import configure_tensorflow
from service.errors import BadInput, NotFound
from service.registry import VersionRegistry, servable_not_found
from service.tensors import signature_specs
from service.types import ModelMetadata, Prediction, VersionStatus

log = logging.getLogger("service.backends.inprocess")


@dataclasses.dataclass(frozen=True)
class LoadedVersion:
    """A version ready to serve: its SavedModel and the labels exported with it."""

    predictor: SavedModelPredictor
    labels: tuple[str, ...]


class TensorFlowLoader:
    """Loads and warms SavedModels in TensorFlow's worker thread (the registry's Loader)."""

    def __init__(self, model_name: str, executor: concurrent.futures.Executor):
        self.model_name = model_name
        self.executor = executor
        self.device: str | None = None

    async def load(self, version: int, path: Path) -> LoadedVersion:
        loop = asyncio.get_running_loop()
        loaded = await loop.run_in_executor(self.executor, self._load_blocking, version, path)
        # A loaded model is long-lived: keep its objects out of the collector's scans (the app
        # does the same for what exists at start).
        gc.freeze()
        return loaded

    def _load_blocking(self, version: int, path: Path) -> LoadedVersion:
        predictor = SavedModelPredictor(path, device=self.device)
        # The first call of each signature traces it: pay that before the version serves, with
        # its TF Serving warmup requests (one zero image when it has none).
        replayed = predictor.warm_up(read_warmup_requests(path))
        log.info(
            "Warmed up %s version %s with %s",
            self.model_name,
            version,
            f"{replayed} warmup request(s)" if replayed else "one zero image (no warmup file)",
        )
        # Read now, while the folder is there (it may be deleted while the version serves).
        return LoadedVersion(predictor, version_labels(path))

    async def unload(self, servable: LoadedVersion) -> None:
        # Frozen objects are never collected: let the dropped model's objects go.
        del servable
        gc.unfreeze()
        gc.collect()
        gc.freeze()


class InProcessBackend(Backend):
    """Runs the model repository's SavedModels inside this process on the chosen device.

    Args:
        model_name, model_base_path: where the versions are.
        device: 'auto', 'cpu' or 'gpu'.
        intra_op_threads, inter_op_threads: TensorFlow thread pools (0 = TF's default).
        poll_seconds: how often to look for a newer version; 0 = never.
    """

    def __init__(
        self,
        model_name: str,
        model_base_path: str,
        device: str = "auto",
        intra_op_threads: int = 0,
        inter_op_threads: int = 1,
        poll_seconds: float = 0.0,
    ):
        super().__init__(model_name)
        self.model_dir = Path(model_base_path) / model_name
        self._device_setting = device
        self._threads = (intra_op_threads, inter_op_threads)
        self._poll_seconds = poll_seconds
        self._device = "unknown"
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tf")
        self._loader = TensorFlowLoader(model_name, self._executor)
        self.registry = VersionRegistry(model_name, self.model_dir, self._loader)
        self._poller: asyncio.Task | None = None

    def serving_version(self) -> int | None:
        return self.registry.serving

    def not_ready_reason(self) -> str:
        return self.registry.not_ready_reason()

    def device(self) -> str:
        return self._device

    def labels(self, version: int) -> tuple[str, ...]:
        try:
            return self.registry.servable_of(version).labels
        except KeyError:
            # Unloaded since it answered (its folder was deleted): what is on disk, if anything.
            return version_labels(self.model_dir / str(version))

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._device = await loop.run_in_executor(
            self._executor, configure_tensorflow, self._device_setting, *self._threads
        )
        self._loader.device = self._device
        log.info("TensorFlow runs on %s (DEVICE=%s)", self._device, self._device_setting)
        await self.registry.refresh()
        if self._poll_seconds > 0:
            self._poller = asyncio.create_task(self._poll(), name="version-poller")

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._poll_seconds)
            try:
                await self.registry.refresh()
            except Exception:  # pragma: no cover - the poller must outlive any one failure
                log.exception("checking %s for new versions failed", self.model_dir)

    def _check_name(self, name: str, version: int | None) -> None:
        if name != self.model_name:
            raise NotFound(servable_not_found(name, version))

    async def model_status(self, name: str, version: int | None) -> list[VersionStatus]:
        if name != self.model_name:
            raise NotFound(f"Could not find any versions of model {name}")
        if version is not None:
            return [await self.registry.version_status(version)]
        statuses = self.registry.statuses()
        if not statuses:
            raise NotFound(f"Could not find any versions of model {name}")
        return statuses

    async def metadata(self, name: str, version: int | None) -> ModelMetadata:
        self._check_name(name, version)
        version, loaded = await self.registry.servable(version)
        signature_defs = loaded.predictor.signature_defs
        return ModelMetadata(name, version, signature_defs, signature_specs(signature_defs))

    async def predict(
        self,
        name: str,
        images: np.ndarray,
        version: int | None = None,
        signature_name: str = SIGNATURE_NAME,
    ) -> Prediction:
        self._check_name(name, version)
        version, loaded = await self.registry.servable(version)
        predictor = loaded.predictor
        if signature_name not in predictor.signatures:
            raise BadInput(
                f'Serving signature name: "{signature_name}" not found in signature def; '
                f"this model has {sorted(predictor.signatures)}"
            )
        outputs = await asyncio.get_running_loop().run_in_executor(
            self._executor, predictor.run, images, signature_name
        )
        return Prediction(version, outputs)

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        await self.registry.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
