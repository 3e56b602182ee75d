"""Dynamic batching in front of any backend, in the spirit of TF Serving's batching.

Requests for the same (model, version, signature) merge into one model call of at most
`max_batch_size` instances, then the outputs are split back in order. Requests join only
when their inputs agree in every dimension but the batch one; a signature with an input or
output that has no batch dimension is never batched (each request is its own call). While
the model is busy, requests queue and form the next batch; when it is idle a request runs
at once unless `timeout_ms` asks to wait for company (TF Serving's CPU advice is 0). The
queue is bounded: when `max_queue` requests are waiting the next one is refused at once
(503). A failed batch fails only its own requests; a crashed batcher fails what is queued
instead of leaving it hung. With `allowed_batch_sizes` (TF Serving's BatchingParameters), a
batch is padded up to the next allowed size with copies of its first instance, as TF Serving's
batching session pads, and those rows' outputs are dropped.

Batches are formed and run on a thread of their own, as TF Serving's batch threads do: the
event loop only queues requests and hands answers back. When a batch ends, the next one
starts at once; it does not wait for the loop to notice, which under load (the loop busy
with other clients' requests) cost a quarter of the model's time (docs/benchmarks.md).
Each request holds its version from the moment it is queued (Backend.reserve) until it is
answered or dropped. Each batch is told to the observer (the metrics, from the batch thread):
its size before and after padding, and how long each of its requests waited in the queue,
which each request's Prediction also carries (`queued`).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import dataclasses
import logging
import threading
import time

import numpy as np

from artifact.contract import SIGNATURE_NAME, output_problems
from service import tracing
from service.backends.base import Backend, DelegatingBackend, Observer, Reservation
from service.errors import OVERLOADED, Overloaded, UpstreamError
from service.types import Inputs, Prediction, inner_shapes, join_inputs, rows_of

log = logging.getLogger("service.backends.batching")


@dataclasses.dataclass
class _Request:
    reservation: Reservation
    images: Inputs
    future: asyncio.Future
    rows: int = 0
    # Requests join only when their inputs' other dimensions and dtypes match.
    shapes: tuple = ()
    enqueued: float = 0.0
    waited: float = 0.0  # seconds from enqueued to its batch being taken
    # Its span's context and the time it was queued, when it is traced (tracing.queued).
    trace: tuple | None = None

    def __post_init__(self):
        self.rows = rows_of(self.images)
        self.shapes = inner_shapes(self.images)
        self.enqueued = time.perf_counter()

    @property
    def dropped(self) -> bool:
        # Read from the batch thread too: a stale answer only means one wasted image.
        return self.future.done()


class BatchingBackend(DelegatingBackend):
    """Wraps a backend: predict() is batched; everything else is passed through.

    Args:
        inner: the backend that runs the merged batches.
        max_batch_size: most images in one model call.
        timeout_ms: how long a batch that is not full waits for more requests.
        max_queue: most requests waiting; more get Overloaded (503).
        allowed_batch_sizes: the sizes a batch is padded up to, increasing, the last one
            `max_batch_size` (empty: batches run at the size they are).
    """

    def __init__(
        self,
        inner: Backend,
        max_batch_size: int,
        timeout_ms: float,
        max_queue: int,
        allowed_batch_sizes: tuple[int, ...] = (),
    ):
        super().__init__(inner)
        self.max_batch_size = max_batch_size
        self.allowed_batch_sizes = tuple(allowed_batch_sizes)
        self.timeout = timeout_ms / 1000.0
        self.max_queue = max_queue
        # Shared with the batch thread: every change under _changed's lock.
        self._queue: collections.deque[_Request] = collections.deque()
        self._changed = threading.Condition()
        self._running: list[_Request] = []  # the batch in the model now
        self._closing = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._observer: Observer | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._closing = False
        await self.inner.start()
        self._ensure_thread()

    async def close(self) -> None:
        with self._changed:
            self._closing = True
            self._changed.notify_all()
            pending = [*self._running, *self._queue]
            self._queue.clear()
        for request in self._running:
            request.reservation.cancel()
        error = UpstreamError("the service is shutting down")
        for request in pending:
            if not request.future.done():
                request.future.set_exception(error)
        await self.inner.close()

    def observe(self, observer: Observer) -> None:
        self._observer = observer
        self.inner.observe(observer)

    def queue_depth(self) -> int:
        return self.waiting

    # --- the event loop's side ----------------------------------------------------------
    def overloaded(self) -> bool:
        return len(self._queue) >= self.max_queue and self.waiting >= self.max_queue

    @property
    def waiting(self) -> int:
        """Requests queued whose clients still wait (cancelled ones are dropped when met)."""
        with self._changed:
            return sum(not r.dropped for r in self._queue)

    async def predict(
        self,
        name: str,
        images: Inputs,
        version: int | None = None,
        signature_name: str = SIGNATURE_NAME,
        label: str | None = None,
    ) -> Prediction:
        if self.overloaded():
            raise Overloaded(OVERLOADED)
        reservation = await self.inner.reserve(name, version, signature_name, label)
        self._loop = loop = asyncio.get_running_loop()
        future = loop.create_future()
        # Answered, failed or dropped (its client left): the version is let go of then.
        future.add_done_callback(lambda _: reservation.release())
        with self._changed:
            if self._closing:
                future.cancel()
                raise UpstreamError("the service is shutting down")
            queued = _Request(reservation, images, future)
            if tracing.tracer is not None:
                queued.trace = tracing.queued()
            self._queue.append(queued)
            self._changed.notify()
        self._ensure_thread()
        # A cancelled wait (client gone) cancels the future; the batch thread then skips it.
        return await future

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, name="batcher", daemon=True)
            self._thread.start()

    def _answer(self, batch: list[_Request], outcome: Prediction | BaseException) -> None:
        """On the loop: each request's share of the batch's outputs, or the batch's error."""
        start = 0
        size = sum(request.rows for request in batch)
        for request in batch:
            end = start + request.rows
            if not request.future.done():
                if isinstance(outcome, BaseException):
                    request.future.set_exception(outcome)
                elif not request.reservation.batchable:
                    # Ran alone, and its outputs may have no batch dimension to slice.
                    request.future.set_result(dataclasses.replace(outcome, queued=request.waited))
                else:
                    outputs = {k: v[start:end] for k, v in outcome.outputs.items()}
                    request.future.set_result(
                        Prediction(outcome.version, outputs, outcome.checked, request.waited, size)
                    )
            start = end

    def _answer_on_loop(self, batch: list[_Request], outcome: Prediction | BaseException) -> None:
        """From the batch thread: _answer on the loop the requests came from (unless it is
        closed: nobody waits then)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._answer, batch, outcome)

    # --- the batch thread ---------------------------------------------------------------
    def _work(self) -> None:
        try:
            while True:
                batch = self._next_batch()
                if batch is None:
                    return
                self._run_batch(batch)
        except BaseException as err:  # a bug here must not leave clients hanging
            log.exception("the batcher crashed; failing the queued requests")
            with self._changed:
                failed = [*self._running, *self._queue]
                self._queue.clear()
                self._running = []
            self._answer_on_loop(failed, UpstreamError(f"the batcher failed: {type(err).__name__}"))

    def _next_batch(self) -> list[_Request] | None:
        """Wait for requests (and, with a timeout, for company); take a batch; None when the
        service is closing."""
        with self._changed:
            while True:
                while not self._queue and not self._closing:
                    self._changed.wait()
                if self._closing:
                    return None
                if self.timeout > 0:
                    deadline = time.monotonic() + self.timeout
                    while self._queued_images() < self.max_batch_size and not self._closing:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self._changed.wait(remaining)
                batch = self._take_batch()
                if batch:
                    taken = time.perf_counter()
                    for request in batch:
                        request.waited = taken - request.enqueued
                    self._running = batch
                    return batch

    def _take_batch(self) -> list[_Request]:
        """The oldest live request and the queued ones that share its key, up to the limit.
        Called with the lock held."""
        while self._queue and self._queue[0].dropped:
            self._queue.popleft()
        if not self._queue:
            return []
        first = self._queue.popleft()
        batch, size = [first], first.rows
        kept: collections.deque[_Request] = collections.deque()
        if not first.reservation.batchable:
            return batch
        while self._queue:
            request = self._queue.popleft()
            if request.dropped:
                continue
            same = (
                request.reservation.key == first.reservation.key
                and request.reservation.batchable
                and request.shapes == first.shapes
            )
            if same and size + request.rows <= self.max_batch_size:
                batch.append(request)
                size += request.rows
            else:
                kept.append(request)
        self._queue = kept
        return batch

    def _queued_images(self) -> int:
        return sum(r.rows for r in self._queue if not r.dropped)

    def _run_batch(self, batch: list[_Request]) -> None:
        outcome: Prediction | BaseException
        span = None
        if tracing.tracer is not None:
            model, version, signature = batch[0].reservation.served
            span = tracing.batch_span(
                [r.trace for r in batch],
                {"batch.size": sum(r.rows for r in batch), "batch.requests": len(batch),
                 "model": model, "model.version": version, "model.signature": signature},
            )  # fmt: skip
        try:
            # Inside the try: inputs that cannot be joined fail their own batch, not the batcher.
            images = batch[0].images if len(batch) == 1 else join_inputs([r.images for r in batch])
            if self.allowed_batch_sizes and batch[0].reservation.batchable:
                images = pad_to_allowed(images, self.allowed_batch_sizes)
            padded = rows_of(images)
            prediction = batch[0].reservation.run(images)
            if not prediction.checked and not output_problems(
                prediction.outputs, finite_rows_only=True
            ):
                # Once for the batch, here, not per request on the loop: a batch within the
                # contract has every request's rows within it.
                prediction = dataclasses.replace(prediction, checked=True)
            outcome = prediction
        except Exception as err:  # noqa: BLE001 - handed to this batch's waiters only
            outcome = err
        except BaseException:  # a cancelled run at shutdown: close() has answered them
            outcome = UpstreamError("the service is shutting down")
        with self._changed:
            self._running = []
        if span is not None:
            if isinstance(outcome, Prediction):
                tracing.end_batch(
                    span, attributes={"batch.padded_size": padded, "model.version": outcome.version}
                )
            else:
                tracing.end_batch(span, outcome)
        if isinstance(outcome, Prediction):
            self._observe(batch, padded, outcome.version)
        self._answer_on_loop(batch, outcome)

    def _observe(self, batch: list[_Request], padded: int, version: int) -> None:
        observer = self._observer
        if observer is None:
            return
        try:
            model, _, signature = batch[0].reservation.served
            observer.batch_ran(
                (model, version, signature),
                sum(r.rows for r in batch),
                padded,
                [(r.rows, r.waited) for r in batch],
                len(self._queue),
            )
        except Exception:  # noqa: BLE001 - the metrics must not fail a batch
            log.exception("recording a batch's metrics failed")


def pad_to_allowed(images: Inputs, allowed: tuple[int, ...]) -> Inputs:
    """A batch padded up to the smallest allowed size that holds it, with copies of its first
    instance (TF Serving's batching_session.cc pads so); as it is when it is of an allowed
    size, or larger than all of them (a request of more than max_batch_size runs alone)."""
    rows = rows_of(images)
    at = bisect.bisect_left(allowed, rows)
    if at == len(allowed) or allowed[at] == rows:
        return images
    extra = allowed[at] - rows

    def pad(array: np.ndarray) -> np.ndarray:
        return np.concatenate([array, np.repeat(array[:1], extra, axis=0)])

    if isinstance(images, np.ndarray):
        return pad(images)
    return {key: pad(value) for key, value in images.items()}
