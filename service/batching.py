"""Dynamic batching in front of any backend, in the spirit of TF Serving's batching.

Requests for the same (model, version or label, signature) merge into one model call of at most
`max_batch_size` images, then the outputs are split back in order. While the model is busy,
requests queue and form the next batch; when it is idle a request runs at once unless
`timeout_ms` asks to wait for company (TF Serving's CPU advice is 0). The queue is bounded:
when `max_queue` requests are waiting the next one is refused at once (503). A failed batch
fails only its own requests; a crashed batcher fails what is queued instead of leaving it hung.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging

import numpy as np

from artifact.contract import SIGNATURE_NAME
from service.backends.base import Backend, DelegatingBackend
from service.errors import Overloaded, UpstreamError
from service.types import Prediction

log = logging.getLogger("service.batching")


@dataclasses.dataclass
class _Request:
    key: tuple
    images: np.ndarray
    future: asyncio.Future


class BatchingBackend(DelegatingBackend):
    """Wraps a backend: predict() is batched; everything else is passed through.

    Args:
        inner: the backend that runs the merged batches.
        max_batch_size: most images in one model call.
        timeout_ms: how long a batch that is not full waits for more requests.
        max_queue: most requests waiting; more get Overloaded (503).
    """

    def __init__(self, inner: Backend, max_batch_size: int, timeout_ms: float, max_queue: int):
        super().__init__(inner)
        self.max_batch_size = max_batch_size
        self.timeout = timeout_ms / 1000.0
        self.max_queue = max_queue
        self._queue: collections.deque[_Request] = collections.deque()
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._running: list[_Request] = []  # the batch in the model now

    async def start(self) -> None:
        # The event and the worker belong to the loop the server runs on.
        self._wakeup = asyncio.Event()
        await self.inner.start()
        self._ensure_worker()

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        # The batch the worker was running when cancelled, then what still waits.
        self._queue.extendleft(reversed(self._running))
        self._fail_queued(UpstreamError("the service is shutting down"))
        await self.inner.close()

    # --- batching -----------------------------------------------------------------------
    def overloaded(self) -> bool:
        return len(self._queue) >= self.max_queue and self.waiting >= self.max_queue

    @property
    def waiting(self) -> int:
        """Requests queued whose clients still wait (cancelled ones are dropped when met)."""
        return sum(not r.future.done() for r in self._queue)

    async def predict(
        self,
        name: str,
        images: np.ndarray,
        version: int | None = None,
        signature_name: str = SIGNATURE_NAME,
        label: str | None = None,
    ) -> Prediction:
        if self.overloaded():
            raise Overloaded(
                f"the batching queue is full ({self.max_queue} requests waiting, "
                "BATCH_MAX_QUEUE); retry shortly"
            )
        self._ensure_worker()
        request = _Request(
            (name, version, signature_name, label),
            images,
            asyncio.get_running_loop().create_future(),
        )
        self._queue.append(request)
        self._wakeup.set()
        # A cancelled wait (client gone) cancels the future; the worker then skips it.
        return await request.future

    def _ensure_worker(self) -> None:
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._run(), name="batcher")

    def _take_batch(self) -> list[_Request]:
        """The oldest live request and the queued ones that share its key, up to the limit."""
        while self._queue and self._queue[0].future.done():
            self._queue.popleft()
        if not self._queue:
            return []
        first = self._queue.popleft()
        batch, size = [first], len(first.images)
        kept = collections.deque()
        while self._queue:
            request = self._queue.popleft()
            if request.future.done():
                continue
            if request.key == first.key and size + len(request.images) <= self.max_batch_size:
                batch.append(request)
                size += len(request.images)
            else:
                kept.append(request)
        self._queue = kept
        return batch

    def _queued_images(self) -> int:
        return sum(len(r.images) for r in self._queue if not r.future.done())

    async def _run(self) -> None:
        try:
            while True:
                while not self._queue:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                if self.timeout > 0 and self._queued_images() < self.max_batch_size:
                    await self._gather_more()
                batch = self._take_batch()
                if batch:
                    await self._run_batch(batch)
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # a bug here must not leave clients hanging
            log.exception("the batcher crashed; failing the queued requests")
            self._fail_queued(UpstreamError(f"the batcher failed: {type(err).__name__}"))
            raise

    async def _gather_more(self) -> None:
        """Wait up to the timeout for the queue to fill a batch."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while self._queued_images() < self.max_batch_size:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except TimeoutError:
                return

    async def _run_batch(self, batch: list[_Request]) -> None:
        name, version, signature_name, label = batch[0].key
        images = batch[0].images if len(batch) == 1 else np.concatenate([r.images for r in batch])
        # Kept when the worker is cancelled mid-call, so close() can fail these waiters too.
        self._running = batch
        try:
            prediction = await self.inner.predict(name, images, version, signature_name, label)
        except Exception as err:  # noqa: BLE001 - handed to this batch's waiters only
            self._running = []
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(err)
            return
        self._running = []
        start = 0
        for request in batch:
            end = start + len(request.images)
            if not request.future.done():
                outputs = {k: v[start:end] for k, v in prediction.outputs.items()}
                request.future.set_result(Prediction(prediction.version, outputs))
            start = end

    def _fail_queued(self, err: Exception) -> None:
        while self._queue:
            request = self._queue.popleft()
            if not request.future.done():
                request.future.set_exception(err)
