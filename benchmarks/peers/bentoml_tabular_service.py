"""BentoML's service for the exported tabular classifier (runs in BentoML's venv).

The model is a pre-made Estimator on feature columns with named inputs (x1, x2: floats, rooms:
an integer, color: a string), exported with the `predict` signature. Written as BentoML's docs
show a service with an input spec and adaptive batching: a pydantic model of the named fields,
and a batchable `@bentoml.api` taking a list of them (BentoML's dispatcher concatenates the
lists of concurrent requests and splits the result). Each field becomes the input of its name,
and the API returns the probabilities [n, classes] (the class is their argmax), as
benchmarks/peers/bentoml_service.py does for the images.

benchmarks/peers/run.py starts it with `bentoml serve bentoml_tabular_service:TabularClassifier`
and sets the knobs through the environment, read at import: PEER_MODEL_PATH (the version
directory), PEER_SIGNATURE, PEER_WORKERS, PEER_MAX_BATCH_SIZE, PEER_MAX_LATENCY_MS and
PEER_TRICKS=1 for this project's two tricks (the signature called through a concrete
tf.function traced once at load, and gc.freeze() after loading). Nothing here imports the
project.
"""

from __future__ import annotations

import gc
import os

import bentoml
import numpy as np
from pydantic import BaseModel

MODEL_PATH = os.environ["PEER_MODEL_PATH"]
SIGNATURE_NAME = os.environ["PEER_SIGNATURE"]
WORKERS = int(os.environ.get("PEER_WORKERS", "1"))
MAX_BATCH_SIZE = int(os.environ.get("PEER_MAX_BATCH_SIZE", "100"))
MAX_LATENCY_MS = int(os.environ.get("PEER_MAX_LATENCY_MS", "60000"))
TRICKS = os.environ.get("PEER_TRICKS") == "1"


class Row(BaseModel):
    """One example: the model's named features."""

    x1: float
    x2: float
    rooms: int
    color: str


@bentoml.service(workers=WORKERS, logging={"access": {"enabled": False}})
class TabularClassifier:
    def __init__(self) -> None:
        import tensorflow as tf

        self._tf = tf
        self._model = tf.saved_model.load(MODEL_PATH)
        signature = self._model.signatures[SIGNATURE_NAME]
        self._run = lambda inputs: signature(**inputs)
        if TRICKS:
            specs = {
                name: tf.TensorSpec(spec.shape, spec.dtype)
                for name, spec in signature.structured_input_signature[1].items()
            }
            self._run = tf.function(
                lambda inputs: signature(**inputs), input_signature=[specs], autograph=False
            ).get_concrete_function()
            # Trace and warm now, on one row of zeros (empty strings for string columns).
            self._run(
                {name: tf.zeros((1, *spec.shape[1:]), spec.dtype) for name, spec in specs.items()}
            )
            gc.collect()
            gc.freeze()

    @bentoml.api(batchable=True, max_batch_size=MAX_BATCH_SIZE, max_latency_ms=MAX_LATENCY_MS)
    def predict(self, rows: list[Row]) -> np.ndarray:
        tf = self._tf
        inputs = {
            "x1": tf.constant([row.x1 for row in rows], tf.float32),
            "x2": tf.constant([row.x2 for row in rows], tf.float32),
            "rooms": tf.constant([row.rooms for row in rows], tf.int64),
            "color": tf.constant([row.color for row in rows], tf.string),
        }
        return self._run(inputs)["probabilities"].numpy()
