"""Model backends behind one small async interface."""

from service.backends.base import Backend, DelegatingBackend

__all__ = ["Backend", "DelegatingBackend"]
