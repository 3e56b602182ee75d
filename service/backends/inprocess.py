"""In-process TensorFlow: loads SavedModel versions from the model repository and runs them.

The newest version is loaded and warmed at start; another version on disk is loaded the first
time a request or status query names it. A poller loads a newer version when one appears and
swaps it in only once it answers, so a version that fails to load never replaces the serving
one (TF Serving's availability-preserving policy). TensorFlow runs in one worker thread, off
the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging

import numpy as np

from service.backends.base import Backend, Prediction, servable_not_found, version_status
from service.errors import BadInput, NotFound, NotReady
from training.contract import SIGNATURE_NAME
from training.saved_model import version_dirs

log = logging.getLogger("service.backends.inprocess")


class DeviceError(RuntimeError):
    """DEVICE=gpu was asked for and TensorFlow sees no GPU."""


def configure_tensorflow(device: str, intra_op_threads: int, inter_op_threads: int) -> str:
    """Set threads and GPU memory growth before TF initialises; return the device to use.

    TF takes these settings only before its runtime starts; when it already runs in this
    process (a test suite, a second app) with other values, it keeps them and says so.

    Raises:
        DeviceError: device is 'gpu' and no GPU is visible.
    """
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if device == "gpu" and not gpus:
        raise DeviceError("DEVICE=gpu but TensorFlow sees no GPU (is the CUDA build installed?)")
    use_gpu = device != "cpu" and bool(gpus)
    threading = tf.config.threading
    try:
        if threading.get_intra_op_parallelism_threads() != intra_op_threads:
            threading.set_intra_op_parallelism_threads(intra_op_threads)
        if threading.get_inter_op_parallelism_threads() != inter_op_threads:
            threading.set_inter_op_parallelism_threads(inter_op_threads)
        for gpu in gpus if use_gpu else ():
            # Grow into GPU memory as needed rather than taking the whole card at start.
            if not tf.config.experimental.get_memory_growth(gpu):
                tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError as err:
        log.warning("TensorFlow already started in this process; keeping its settings (%s)", err)
    return "/GPU:0" if use_gpu else "/CPU:0"


class InProcessBackend(Backend):
    """Runs the SavedModel inside this process on the chosen device.

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
        super().__init__(model_name, model_base_path)
        self._device_setting = device
        self._threads = (intra_op_threads, inter_op_threads)
        self._poll_seconds = poll_seconds
        self._device = "unknown"
        self._models: dict = {}  # version -> SavedModelPredictor
        self._failed: dict[int, str] = {}
        # When each failed version's files last changed: a change earns it another try.
        self._failed_stamps: dict[int, float] = {}
        self._latest: int | None = None
        self._loading: dict[int, asyncio.Future] = {}
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tf")
        self._poller: asyncio.Task | None = None
        self._reason = "the model is loading"

    @property
    def ready(self) -> bool:
        return self._latest is not None

    def not_ready_reason(self) -> str:
        return self._reason

    def device(self) -> str:
        return self._device

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._device = await loop.run_in_executor(
            self._executor, configure_tensorflow, self._device_setting, *self._threads
        )
        log.info("TensorFlow runs on %s (DEVICE=%s)", self._device, self._device_setting)
        await self.refresh()
        if self._poll_seconds > 0:
            self._poller = asyncio.create_task(self._poll())

    async def refresh(self) -> None:
        """Follow the repository: load the newest version on disk if it is newer than the one
        serving; drop versions whose folder is gone, falling back to the newest left."""
        versions = [v for v, _ in version_dirs(self.model_dir)]
        self._unload_missing(set(versions))
        candidates = [v for v in versions if not self._still_failed(v)]
        if not candidates:
            if self._latest is None:
                self._reason = f"no loadable version under {self.model_dir}"
            return
        newest = candidates[-1]
        if self._latest is not None and newest <= self._latest:
            return
        try:
            await self._load(newest)
        except Exception:  # noqa: BLE001 - logged; the serving version stays
            return
        previous, self._latest = self._latest, newest
        log.info(
            "Serving %s version %s on %s%s",
            self.model_name,
            newest,
            self._device,
            f" (was {previous})" if previous is not None else "",
        )

    def _unload_missing(self, on_disk: set[int]) -> None:
        gone = [v for v in self._models if v not in on_disk]
        for version in gone:
            del self._models[version]
            self._labels.pop(version, None)
        for version in [v for v in self._failed if v not in on_disk]:
            del self._failed[version]
            self._failed_stamps.pop(version, None)
        if not gone:
            return
        if self._latest in gone:
            self._latest = max(self._models, default=None)
        log.warning(
            "Version(s) %s of %s left %s: unloaded; serving %s",
            ", ".join(map(str, sorted(gone))),
            self.model_name,
            self.model_dir,
            self._latest if self._latest is not None else "nothing until a version appears",
        )
        if self._latest is None:
            self._reason = f"no loadable version under {self.model_dir}"
        # Frozen objects are never collected: let the dropped models' objects go.
        gc.unfreeze()
        gc.collect()
        gc.freeze()

    def _still_failed(self, version: int) -> bool:
        """True when the version failed to load and its files have not changed since."""
        if version not in self._failed:
            return False
        if self._files_changed_at(version) == self._failed_stamps.get(version):
            return True
        # Fixed, or finished copying, since it failed: it gets another try.
        del self._failed[version]
        return False

    def _files_changed_at(self, version: int) -> float:
        """The newest modification time among a version's folders and files."""
        root = self.model_dir / str(version)
        try:
            return max(p.stat().st_mtime for p in (root, *root.rglob("*")))
        except (FileNotFoundError, ValueError):
            return 0.0

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._poll_seconds)
            try:
                await self.refresh()
            except Exception:  # pragma: no cover - the poller must outlive any one failure
                log.exception("checking %s for new versions failed", self.model_dir)

    async def _load(self, version: int):
        """Load and warm one version once, however many requests ask for it at the same time."""
        if version in self._models:
            return self._models[version]
        pending = self._loading.get(version)
        if pending is None:
            pending = asyncio.get_running_loop().run_in_executor(
                self._executor, self._load_blocking, version
            )
            self._loading[version] = pending
        try:
            model = await asyncio.shield(pending)
        except Exception as err:
            self._failed[version] = f"{type(err).__name__}: {err}"
            self._failed_stamps[version] = self._files_changed_at(version)
            log.error("Loading %s version %s failed: %s", self.model_name, version, err)
            raise
        finally:
            self._loading.pop(version, None)
        self._models[version] = model
        self._failed.pop(version, None)
        # A loaded model is long-lived: keep its objects out of the collector's scans (see
        # create_app, which does the same for what exists at start).
        gc.freeze()
        return model

    def _load_blocking(self, version: int):
        from training.saved_model import SavedModelPredictor

        model = SavedModelPredictor(self.model_dir / str(version), device=self._device)
        # The first call of each signature traces it: pay that before reporting ready, with the
        # version's TF Serving warmup requests (one zero image when it has none).
        replayed = model.warm_up()
        self.labels(version)  # cached now, while the folder is there
        log.info(
            "Warmed up %s version %s with %s",
            self.model_name,
            version,
            f"{replayed} warmup request(s)" if replayed else "one zero image (no warmup file)",
        )
        return model

    async def _model(self, name: str, version: int | None):
        if name != self.model_name:
            raise NotFound(servable_not_found(name, version))
        if version is None:
            if self._latest is None:
                raise NotReady(f"model {name} is not ready: {self._reason}")
            return self._latest, self._models[self._latest]
        if version in self._models:
            return version, self._models[version]
        if self._still_failed(version):
            # Not retried per request: only once its files change.
            raise NotReady(f"version {version} of {name} failed to load: {self._failed[version]}")
        if not (self.model_dir / str(version) / "saved_model.pb").is_file():
            raise NotFound(servable_not_found(name, version))
        try:
            return version, await self._load(version)
        except Exception as err:
            raise NotReady(f"version {version} of {name} failed to load: {err}") from err

    async def model_status(self, name: str, version: int | None) -> list[dict]:
        if version is not None:
            if name == self.model_name and not (self.model_dir / str(version)).is_dir():
                # TF Serving's GetModelStatus wording for a version it does not have.
                raise NotFound(f"Could not find version {version} of model {name}")
            if name == self.model_name and version in self._failed:
                return [version_status(version, "END", "UNKNOWN", self._failed[version])]
            await self._model(name, version)
            return [version_status(version)]
        if name != self.model_name:
            raise NotFound(f"Could not find any versions of model {name}")
        # The version serving unversioned requests first: /readyz and the model_version gauge
        # report statuses[0], and a version loaded on demand (a request naming it) may be newer.
        loaded = sorted(self._models, key=lambda v: (v != self._latest, -v))
        statuses = [version_status(v) for v in loaded]
        statuses += [
            version_status(v, "END", "UNKNOWN", message) for v, message in self._failed.items()
        ]
        if not statuses:
            raise NotFound(f"Could not find any versions of model {name}")
        return statuses

    async def metadata(self, name: str, version: int | None) -> tuple[int, dict]:
        from google.protobuf.json_format import MessageToDict

        version, model = await self._model(name, version)
        return version, MessageToDict(
            model.signature_defs,
            preserving_proto_field_name=True,
            including_default_value_fields=True,
        )

    async def predict(
        self,
        name: str,
        images: np.ndarray,
        version: int | None = None,
        signature_name: str = SIGNATURE_NAME,
    ) -> Prediction:
        version, model = await self._model(name, version)
        if signature_name not in model.signatures:
            raise BadInput(
                f'Serving signature name: "{signature_name}" not found in signature def; '
                f"this model has {sorted(model.signatures)}"
            )
        outputs = await asyncio.get_running_loop().run_in_executor(
            self._executor, model.run, images, signature_name
        )
        return Prediction(version, outputs)

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._models.clear()
