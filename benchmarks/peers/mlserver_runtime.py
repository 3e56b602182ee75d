"""MLServer's custom runtimes for the exported SavedModels (run in MLServer's venv): the
Fashion-MNIST image classifier and the tabular classifier (a pre-made Estimator on feature
columns: named inputs x1, x2, rooms, color).

Written as MLServer's docs show a custom runtime: an MLModel subclass whose load() reads the
artifact at `parameters.uri` and whose predict() decodes the V2 request with MLServer's codecs
(the image tensor with NumpyCodec; the tabular request, one input per column, with
PandasCodec into a DataFrame), runs the model and encodes each output with NumpyCodec.
Adaptive batching is MLServer's own (max_batch_size and max_batch_time in
model-settings.json): it merges queued requests along the first axis before predict() sees
them.

The Tuned* runtimes add the two things this project's service does and the docs do not: the
signature is called through a concrete tf.function traced once at load (calling
`signature(image=...)` re-binds its keyword arguments on every call), and gc.freeze() after
loading, so the collector stops walking TensorFlow's objects. Nothing here imports the
project: the peer's venv has only MLServer and TensorFlow.
"""

from __future__ import annotations

import gc

import numpy as np
import tensorflow as tf
from mlserver import MLModel
from mlserver.codecs import NumpyCodec, PandasCodec
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


def freeze() -> None:
    """Move every object alive now out of the collector's sight."""
    gc.collect()
    gc.freeze()


class TunedSavedModelRuntime(SavedModelRuntime):
    """The same, plus this project's two tricks: a concrete function and gc.freeze().

    MLServer builds the model object in its HTTP process too (with parallel workers, load()
    and predict() run in a worker process): freezing there as well, once TensorFlow is
    imported, gives the process that parses the requests the same break.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        freeze()

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
        freeze()
        return True

    def _run(self, images: np.ndarray) -> dict:
        return self._runner(tf.constant(images, tf.float32))


class TabularSavedModelRuntime(MLModel):
    """A SavedModel of named inputs, one per column: the request decoded with PandasCodec
    into a DataFrame (MLServer's codec for tabular data), each column passed as the input of
    its name at the signature's dtype; every output of the signature in the answer, as TF
    Serving's :predict gives them. The signature's name is `parameters.extra.signature`."""

    async def load(self) -> bool:
        parameters = self.settings.parameters
        self._model = tf.saved_model.load(parameters.uri)
        self._signature = self._model.signatures[parameters.extra["signature"]]
        self._specs = self._signature.structured_input_signature[1]
        return True

    def _run(self, inputs: dict) -> dict:
        return self._signature(**inputs)

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        frame = self.decode_request(payload, default_codec=PandasCodec)
        inputs = {
            name: tf.constant(frame[name].to_numpy(), spec.dtype)
            for name, spec in self._specs.items()
        }
        outputs = self._run(inputs)
        return InferenceResponse(
            id=payload.id,
            model_name=self.name,
            model_version=self.version,
            outputs=[NumpyCodec.encode_output(key, out.numpy()) for key, out in outputs.items()],
        )


class TunedTabularSavedModelRuntime(TabularSavedModelRuntime):
    """The same with the two tricks: the signature through one concrete function taking the
    inputs as a dict, traced once at load, and gc.freeze() (in the HTTP process too)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        freeze()

    async def load(self) -> bool:
        await super().load()
        signature = self._signature
        specs = {name: tf.TensorSpec(spec.shape, spec.dtype) for name, spec in self._specs.items()}
        self._runner = tf.function(
            lambda inputs: signature(**inputs), input_signature=[specs], autograph=False
        ).get_concrete_function()
        # Trace and warm now, on one row of zeros (empty strings for string columns).
        self._runner(
            {name: tf.zeros((1, *spec.shape[1:]), spec.dtype) for name, spec in specs.items()}
        )
        freeze()
        return True

    def _run(self, inputs: dict) -> dict:
        return self._runner(inputs)
