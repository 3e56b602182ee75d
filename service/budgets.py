"""Budgets the process shares across requests: memory held for request bodies
(`BodyBudget`), and pixels being decoded from image files (`PixelBudget`)."""

from __future__ import annotations

import contextlib
import threading

from service.errors import BodiesInFlight, ClientClosedRequest, PayloadTooLarge, PixelsInFlight


class BodyBudget:
    """Request-body bytes held at once, process-wide (MAX_BODY_BYTES_IN_FLIGHT): each body's
    bytes count from when they are reserved (its declared length, before any is read; a
    chunked body's chunks as they come) until its request is answered.

    Args:
        limit: the most bytes held at once.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0
        # Handlers reserve from worker threads too (a body decompressed off the loop).
        self._lock = threading.Lock()

    def hold(self) -> Held:
        """A request's share, as a context manager: `reserve(n)` on the holder it yields; all
        of it is given back when the block ends (answered, failed or cancelled)."""
        return Held(self)

    def _give_back(self, holder: Held) -> None:
        with self._lock:
            self.held -= holder.bytes
            holder.bytes = 0
            holder.over = True

    def _reserve(self, holder: Held, count: int) -> None:
        with self._lock:
            if holder.over:
                # Its request was answered or abandoned while a worker thread still read its
                # body (a decompression, say): that work stops here, nothing more is held.
                raise ClientClosedRequest("the request ended before its body was read")
            if holder.bytes + count > self.limit:
                # More than the whole budget for one request: it never fits, so waiting for
                # others to finish is no use.
                raise PayloadTooLarge(
                    f"the request needs {holder.bytes + count} bytes held at once; the limit "
                    f"is {self.limit} bytes (MAX_BODY_BYTES_IN_FLIGHT)"
                )
            if self.held + count > self.limit:
                raise BodiesInFlight(
                    f"the service holds {self.held} bytes of request bodies already; another "
                    f"{count} would pass MAX_BODY_BYTES_IN_FLIGHT={self.limit}; retry shortly"
                )
            self.held += count
            holder.bytes += count


class Held:
    """One request's share of a BodyBudget (BodyBudget.hold): `reserve(n)` adds n bytes,
    raising BodiesInFlight (503) while the budget is full and PayloadTooLarge (413) past the
    whole budget; leaving the block gives all of it back."""

    # A plain class, not @contextlib.contextmanager: its generator cost a few microseconds per
    # request on the loop.
    __slots__ = ("budget", "bytes", "over")

    def __init__(self, budget: BodyBudget):
        self.budget = budget
        self.bytes = 0
        self.over = False

    def __enter__(self) -> Held:
        return self

    def __exit__(self, *exc_info) -> None:
        self.budget._give_back(self)

    def reserve(self, count: int) -> None:
        self.budget._reserve(self, count)


class PixelBudget:
    """Pixels being decoded from image files at once, process-wide (MAX_PIXELS_IN_FLIGHT):
    a request's files reserve their pixel count, read from their headers, before the first
    is decoded, and give it back when the last is done. Decoders run on worker threads:
    reserving is thread-safe.

    Args:
        limit: the most pixels being decoded at once.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0
        self.peak = 0  # the most ever held (tests and benchmarks read it)
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def hold(self, pixels: int):
        """Reserve `pixels` for the block's length.

        Raises:
            PixelsInFlight: no room for them now (503 with Retry-After).
        """
        with self._lock:
            if self.held + pixels > self.limit:
                raise PixelsInFlight(
                    f"other requests' images are being decoded to {self.held / 1e6:.1f} "
                    f"megapixels already; this request's {pixels / 1e6:.1f} would pass "
                    f"MAX_PIXELS_IN_FLIGHT={self.limit}; retry shortly"
                )
            self.held += pixels
            self.peak = max(self.peak, self.held)
        try:
            yield
        finally:
            with self._lock:
                self.held -= pixels


# For callers outside the service's own budget (tests, tools): never full.
UNBOUNDED_PIXELS = PixelBudget(1 << 62)
