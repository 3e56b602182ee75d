"""BentoML's service for the exported Fashion-MNIST SavedModel (runs in BentoML's venv).

Written as BentoML's docs show adaptive batching: a `@bentoml.service` class that loads the
model in __init__, and a batchable `@bentoml.api` taking a numpy array whose first axis is
the batch; BentoML's dispatcher merges concurrent requests along it and splits the result.
It returns the probabilities [n, 10] (the class is their argmax).

benchmarks/peers/run.py starts it with `bentoml serve bentoml_service:FashionMNIST` and sets
the knobs through the environment, read at import: PEER_MODEL_PATH (the version directory),
PEER_WORKERS, PEER_MAX_BATCH_SIZE, PEER_MAX_LATENCY_MS and PEER_TRICKS=1 for this project's
two tricks (the signature called through a concrete tf.function traced once at load, and
gc.freeze() after loading). Nothing here imports the project.
"""

from __future__ import annotations

import gc
import os
from typing import Annotated

import bentoml
import numpy as np
from bentoml.validators import DType, Shape

MODEL_PATH = os.environ["PEER_MODEL_PATH"]
WORKERS = int(os.environ.get("PEER_WORKERS", "1"))
MAX_BATCH_SIZE = int(os.environ.get("PEER_MAX_BATCH_SIZE", "100"))
MAX_LATENCY_MS = int(os.environ.get("PEER_MAX_LATENCY_MS", "60000"))
TRICKS = os.environ.get("PEER_TRICKS") == "1"
SIGNATURE_NAME = "serving_default"
INPUT_KEY = "image"

Images = Annotated[np.ndarray, Shape((-1, 28, 28)), DType("float32")]


@bentoml.service(workers=WORKERS, logging={"access": {"enabled": False}})
class FashionMNIST:
    def __init__(self) -> None:
        import tensorflow as tf

        self._tf = tf
        self._model = tf.saved_model.load(MODEL_PATH)
        signature = self._model.signatures[SIGNATURE_NAME]
        self._signature = signature
        self._runner = None
        if TRICKS:
            spec = signature.structured_input_signature[1][INPUT_KEY]
            self._runner = tf.function(
                lambda image: signature(**{INPUT_KEY: image}),
                input_signature=[tf.TensorSpec(spec.shape, spec.dtype)],
                autograph=False,
            ).get_concrete_function()
            self._runner(tf.zeros((1, *spec.shape[1:]), spec.dtype))  # trace and warm now
            gc.collect()
            gc.freeze()

    @bentoml.api(batchable=True, max_batch_size=MAX_BATCH_SIZE, max_latency_ms=MAX_LATENCY_MS)
    def predict(self, images: Images) -> np.ndarray:
        tensor = self._tf.constant(images, self._tf.float32)
        if self._runner is not None:
            outputs = self._runner(tensor)
        else:
            outputs = self._signature(**{INPUT_KEY: tensor})
        return outputs["probabilities"].numpy()
