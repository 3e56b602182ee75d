"""MLServer's custom runtime for the exported Fashion-MNIST SavedModel (runs in MLServer's venv).

Written as MLServer's docs show a custom runtime: an MLModel subclass whose load() reads the
artifact at `parameters.uri` and whose predict() decodes the V2 request's tensors with
NumpyCodec, runs the model and encodes each output. Adaptive batching is MLServer's own
(max_batch_size and max_batch_time in model-settings.json): it merges queued requests along
the first axis before predict() sees them.

`TunedSavedModelRuntime` adds the two things this project's service does and the docs do
not: the signature is called through a concrete tf.function traced once at load (calling
`signature(image=...)` re-binds its keyword arguments on every call), and gc.freeze() after
loading, so the collector stops walking TensorFlow's objects. Nothing here imports the
project: the peer's venv has only MLServer and TensorFlow.
"""

from __future__ import annotations

import gc

import numpy as np
import tensorflow as tf
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

SIGNATURE_NAME = "serving_default"
INPUT_KEY = "image"
OUTPUT_KEYS = ("classes", "probabilities")


class SavedModelRuntime(MLModel):
    """The SavedModel's serving signature, as MLServer's custom-runtime docs write it."""

    async def load(self) -> bool:
        self._model = tf.saved_model.load(self.settings.parameters.uri)
        self._signature = self._model.signatures[SIGNATURE_NAME]
        return True

    def _run(self, images: np.ndarray) -> dict:
        return self._signature(**{INPUT_KEY: tf.constant(images, tf.float32)})

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        inputs = {request_input.name: request_input for request_input in payload.inputs}
        images = NumpyCodec.decode_input(inputs[INPUT_KEY])
        outputs = self._run(images)
        return InferenceResponse(
            id=payload.id,
            model_name=self.name,
            model_version=self.version,
            outputs=[NumpyCodec.encode_output(key, outputs[key].numpy()) for key in OUTPUT_KEYS],
        )


class TunedSavedModelRuntime(SavedModelRuntime):
    """The same, plus this project's two tricks: a concrete function and gc.freeze().

    MLServer builds the model object in its HTTP process too (with parallel workers, load()
    and predict() run in a worker process): freezing there as well, once TensorFlow is
    imported, gives the process that parses the requests the same break.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        gc.collect()
        gc.freeze()

    async def load(self) -> bool:
        await super().load()
        signature = self._signature
        spec = signature.structured_input_signature[1][INPUT_KEY]
        self._runner = tf.function(
            lambda image: signature(**{INPUT_KEY: image}),
            input_signature=[tf.TensorSpec(spec.shape, spec.dtype)],
            autograph=False,
        ).get_concrete_function()
        self._runner(tf.zeros((1, *spec.shape[1:]), spec.dtype))  # trace and warm now
        gc.collect()
        gc.freeze()
        return True

    def _run(self, images: np.ndarray) -> dict:
        return self._runner(tf.constant(images, tf.float32))
