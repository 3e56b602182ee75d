"""In-process TensorFlow: the model repository's versions loaded and run in this process.

The version registry (service/backends/registry.py) decides, model by model, what is loaded and what
serves; this backend gives it a loader that loads and warms a SavedModel in TensorFlow's one
worker thread, and runs predictions there, off the event loop. Shadow copies run on a second
thread, so a slow shadow version never delays a served answer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import gc
import logging
from pathlib import Path

from artifact.contract import PROBABILITIES_KEY, SIGNATURE_NAME
from artifact.file_ops import file_system_problems
from artifact.model_config import ModelEntry
from artifact.repository import read_labels, version_labels
from artifact.saved_model import ModelInputError, SavedModelPredictor, servable_problems
from artifact.warmup import read_warmup_requests
from service.backends.base import Backend, Reservation
from service.backends.device import configure_tensorflow
from service.backends.registry import ModelRegistry, VersionRegistry, servable_not_found
from service.backends.sources import Sources
from service.codecs.signatures import signature_specs
from service.errors import BadInput, NotFound, SignatureNotFound
from service.types import (
    Inputs,
    ModelMetadata,
    Prediction,
    SignatureSpec,
    VersionStatus,
    batchable,
)

log = logging.getLogger("service.backends.inprocess")


@dataclasses.dataclass(frozen=True)
class LoadedVersion:
    """A version ready to serve: its SavedModel, the labels exported with it, and its
    signatures as typed values (the contract requests are checked against; the registry
    compares a new version's with the serving one's)."""

    predictor: SavedModelPredictor
    labels: tuple[str, ...]
    contract: dict[str, SignatureSpec] = dataclasses.field(default_factory=dict)


def answer_labels(path: Path, contract: dict[str, SignatureSpec]) -> tuple[str, ...]:
    """The labels a version answers with: its labels.txt; without one, the digits for a model
    with the image contract, and class ids for a `probabilities` output of another width."""
    labels = read_labels(path)
    if labels is not None:
        return labels
    for signature in contract.values():
        for output in signature.outputs:
            shape = output.shape
            if output.name == PROBABILITIES_KEY and shape and len(shape) == 2 and shape[1] > 0:
                return tuple(str(i) for i in range(shape[1]))
    return version_labels(path)


class TensorFlowLoader:
    """Loads and warms SavedModels in TensorFlow's worker thread (the registry's Loader).

    Args:
        executor: TensorFlow's worker thread.
        allow_file_system_ops: ALLOW_FILE_SYSTEM_OPS: load versions whose graphs reach the
            file system (refused otherwise, before anything of them runs).
        replay_warmup: ENABLE_MODEL_WARMUP: replay a version's TF Serving warmup requests;
            false: zeros instead, as for a version that has none.
    """

    def __init__(
        self,
        executor: concurrent.futures.Executor,
        allow_file_system_ops: bool = False,
        replay_warmup: bool = True,
    ):
        self.executor = executor
        self.allow_file_system_ops = allow_file_system_ops
        self.replay_warmup = replay_warmup
        self.device: str | None = None

    async def load(self, version: int, path: Path) -> LoadedVersion:
        loop = asyncio.get_running_loop()
        loaded = await loop.run_in_executor(self.executor, self._load_blocking, version, path)
        # A loaded model is long-lived: keep its objects out of the collector's scans (the app
        # does the same for what exists at start).
        gc.freeze()
        return loaded

    def _load_blocking(self, version: int, path: Path) -> LoadedVersion:
        if not self.allow_file_system_ops:
            # From saved_model.pb alone, before loading runs its init op and warmup its
            # signatures: a model is code, and these ops reach what the server can reach.
            problems = file_system_problems(path)
            if problems:
                raise ValueError(
                    "its graph reads or writes files: "
                    + "; ".join(problems)
                    + "; set ALLOW_FILE_SYSTEM_OPS=true to serve it"
                )
        predictor = SavedModelPredictor(path, device=self.device)
        # Only a version no request could use never serves (no usable signature, or labels
        # that do not name every class).
        problems = servable_problems(predictor.signature_defs, read_labels(path))
        if problems:
            raise ValueError("cannot serve: " + "; ".join(problems))
        contract = signature_specs(predictor.signature_defs)
        # The first call of each signature traces it: pay that before the version serves, with
        # its TF Serving warmup requests (zero inputs when it has none, or they are off).
        replayed = predictor.warm_up(read_warmup_requests(path) if self.replay_warmup else ())
        log.info(
            "Warmed up %s with %s",
            path,
            f"{replayed} warmup request(s)" if replayed else "zero inputs (no warmup file)",
        )
        # Read now, while the folder is there (it may be deleted while the version serves).
        return LoadedVersion(predictor, answer_labels(path, contract), contract)

    async def reload_assets(self, servable: LoadedVersion, path: Path) -> LoadedVersion:
        """The same model with its assets.extra/ read again (they changed: labels that landed
        after the model files, or a fix).

        Raises:
            ValueError: the new labels do not name every class (the version keeps the old ones).
        """
        problems = servable_problems(servable.predictor.signature_defs, read_labels(path))
        if problems:
            raise ValueError("; ".join(problems))
        return dataclasses.replace(servable, labels=answer_labels(path, servable.contract))

    async def unload(self, servable: LoadedVersion) -> None:
        # Frozen objects are never collected: let the dropped model's objects go.
        del servable
        gc.unfreeze()
        gc.collect()
        gc.freeze()


class InProcessBackend(Backend):
    """Runs the model repository's SavedModels inside this process on the chosen device.

    Args:
        models: the model config's entries (artifact.model_config; the MODEL_NAME shortcut
            is one entry); the first is the default model unless `default_model` names one.
        device: 'auto', 'cpu' or 'gpu'.
        intra_op_threads, inter_op_threads: TensorFlow thread pools (0 = TF's default).
        poll_seconds: how often to look for new and deleted versions; 0 = never.
        allow_unavailable_labels: a new label may point to a version not AVAILABLE yet.
        default_model: the model /predict serves.
        allow_signature_changes: a new version whose signatures differ from the serving
            version's may serve (ALLOW_SIGNATURE_CHANGES).
        allow_file_system_ops: a version whose graph reads or writes files may serve
            (ALLOW_FILE_SYSTEM_OPS; artifact/file_ops.py).
        model_cache_dir: where versions on object storage are copied before they load
            (MODEL_CACHE_DIR; None = the default under the user's cache folder).
        replay_warmup: replay each version's warmup requests (ENABLE_MODEL_WARMUP).
    """

    def __init__(
        self,
        models: list[ModelEntry],
        device: str = "auto",
        intra_op_threads: int = 0,
        inter_op_threads: int = 1,
        poll_seconds: float = 0.0,
        allow_unavailable_labels: bool = False,
        default_model: str | None = None,
        allow_signature_changes: bool = False,
        allow_file_system_ops: bool = False,
        model_cache_dir: str | Path | None = None,
        replay_warmup: bool = True,
    ):
        super().__init__(default_model or models[0].name)
        self._entries = list(models)
        self._device_setting = device
        self._threads = (intra_op_threads, inter_op_threads)
        self._poll_seconds = poll_seconds
        self._device = "unknown"
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tf")
        # Shadow copies run on their own thread: a slow shadow never holds up a served answer.
        self._shadow_executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="tf-shadow"
        )
        self._loader = TensorFlowLoader(self._executor, allow_file_system_ops, replay_warmup)
        self.registry = ModelRegistry(
            self._loader, allow_unavailable_labels, allow_signature_changes,
            Sources(model_cache_dir),
        )  # fmt: skip
        self._poller: asyncio.Task | None = None

    def _model(self, name: str, version: int | None = None) -> VersionRegistry:
        registry = self.registry.get(name)
        if registry is None:
            raise NotFound(servable_not_found(name, version))
        return registry

    def model_names(self) -> list[str]:
        return list(self.registry.models) or [entry.name for entry in self._entries]

    def serving_version(self, name: str) -> int | None:
        registry = self.registry.get(name)
        return registry.serving if registry is not None else None

    def not_ready_reason(self, name: str) -> str:
        registry = self.registry.get(name)
        if registry is None:
            return (
                f"model {name} is not in the model config"
                if self.registry.models
                else ("the model is loading")
            )
        return registry.not_ready_reason()

    def version_labels(self, name: str) -> dict[str, int]:
        registry = self.registry.get(name)
        return registry.labels if registry is not None else {}

    def device(self) -> str:
        return self._device

    def observe(self, observer) -> None:
        self.registry.observer = observer

    def model_dir(self, name: str) -> Path:
        registry = self.registry.get(name)
        if registry is None:
            raise NotFound(f"Could not find any versions of model {name}")
        return registry.model_dir

    def class_labels(self, name: str, version: int) -> tuple[str, ...]:
        registry = self._model(name, version)
        try:
            return registry.servable_of(version).labels
        except KeyError:
            # Unloaded since it answered (its folder was deleted): what is on disk, if anything.
            return version_labels(registry.model_dir / str(version))

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._device = await loop.run_in_executor(
            self._executor, configure_tensorflow, self._device_setting, *self._threads
        )
        self._loader.device = self._device
        log.info("TensorFlow runs on %s (DEVICE=%s)", self._device, self._device_setting)
        await self.registry.apply(self._entries)
        if self._poll_seconds > 0:
            self._poller = asyncio.create_task(self._poll(), name="version-poller")

    async def apply_config(self, entries: list[ModelEntry]) -> list[str]:
        changes = await self.registry.apply(entries)
        self._entries = list(entries)
        return changes

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._poll_seconds)
            try:
                await self.registry.refresh()
            except Exception:  # pragma: no cover - the poller must outlive any one failure
                log.exception("checking the model repository for new versions failed")

    async def model_status(
        self, name: str, version: int | None, label: str | None = None
    ) -> list[VersionStatus]:
        registry = self.registry.get(name)
        if registry is None:
            raise NotFound(f"Could not find any versions of model {name}")
        if label is not None:
            lease = registry.acquire(None, label)
            version = lease.version
            lease.release()
        if version is not None:
            return [registry.version_status(version)]
        statuses = registry.statuses()
        if not statuses:
            raise NotFound(f"Could not find any versions of model {name}")
        return statuses

    async def metadata(
        self, name: str, version: int | None, label: str | None = None
    ) -> ModelMetadata:
        lease = self._model(name, version).acquire(version, label)
        try:
            servable = lease.servable
            signature_defs = servable.predictor.signature_defs
            return ModelMetadata(name, lease.version, signature_defs, dict(servable.contract))
        finally:
            lease.release()

    async def signature(
        self,
        name: str,
        version: int | None = None,
        label: str | None = None,
        signature_name: str = SIGNATURE_NAME,
    ) -> SignatureSpec:
        lease = self._model(name, version).acquire(version, label)
        try:
            return _signature_of(lease.servable, signature_name)
        finally:
            lease.release()

    async def predict(
        self,
        name: str,
        images: Inputs,
        version: int | None = None,
        signature_name: str = SIGNATURE_NAME,
        label: str | None = None,
    ) -> Prediction:
        return await self._run(self._executor, name, images, version, signature_name, label)

    async def reserve(
        self,
        name: str,
        version: int | None = None,
        signature_name: str = SIGNATURE_NAME,
        label: str | None = None,
    ) -> Reservation:
        """The version leased now, on the loop; the batcher's thread runs the SavedModel
        directly (TensorFlow releases the GIL while it computes)."""
        lease = self._model(name, version).acquire(version, label)
        servable = lease.servable
        try:
            signature = _signature_of(servable, signature_name)
        except BadInput:
            lease.release()
            raise
        predictor = servable.predictor

        def run(inputs: Inputs) -> Prediction:
            return Prediction(lease.version, _run_signature(predictor, inputs, signature_name))

        # The predictor's identity too: a version number reloaded is another model.
        key = (name, lease.version, signature_name, id(predictor))
        return Reservation(
            key,
            run,
            lease.release,
            batchable=batchable(signature),
            served=(name, lease.version, signature_name),
        )

    async def predict_shadow(
        self, name: str, images: Inputs, label: str, signature_name: str = SIGNATURE_NAME
    ) -> Prediction:
        return await self._run(self._shadow_executor, name, images, None, signature_name, label)

    async def _run(self, executor, name, images, version, signature_name, label) -> Prediction:
        lease = self._model(name, version).acquire(version, label)
        try:
            _signature_of(lease.servable, signature_name)
            predictor = lease.servable.predictor
            outputs = await asyncio.get_running_loop().run_in_executor(
                executor, _run_signature, predictor, images, signature_name
            )
        finally:
            # A version leaving the policy is unloaded once its last request is done.
            lease.release()
        return Prediction(lease.version, outputs)

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        await self.registry.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._shadow_executor.shutdown(wait=False, cancel_futures=True)


def _signature_of(servable: LoadedVersion, signature_name: str) -> SignatureSpec:
    """A loaded version's signature; BadInput in TF Serving's words when it has no such one."""
    signature = servable.contract.get(signature_name)
    if signature is None or signature_name not in servable.predictor.signatures:
        raise SignatureNotFound(signature_name, servable.contract)
    return signature


def _run_signature(predictor: SavedModelPredictor, inputs: Inputs, signature_name: str):
    """The predictor's outputs; what the model refuses is the client's error (TF Serving
    answers TensorFlow's InvalidArgument as such)."""
    try:
        return predictor.run(inputs, signature_name)
    except ModelInputError as err:
        raise BadInput(str(err)) from err
