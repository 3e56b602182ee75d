"""Model backends behind one small async interface."""

from service.backends.base import Backend, Prediction

__all__ = ["Backend", "Prediction"]
