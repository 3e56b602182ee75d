"""TF Serving's gRPC requests as its clients build them: `tensorflow-serving-api`'s protos,
inputs made by `tf.make_tensor_proto` (so this imports TensorFlow: live tier only)."""

from __future__ import annotations

import tensorflow as tf
from tensorflow_serving.apis import predict_pb2

from support.servers import MODEL_NAME


def predict_request(images=None, name=MODEL_NAME, **model_spec) -> predict_pb2.PredictRequest:
    """A PredictRequest for `name`: model_spec fields as given (version= a number), and the
    images, when given, as the input tensor `tf.make_tensor_proto` makes of them."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    for key, value in model_spec.items():
        if key == "version":
            request.model_spec.version.value = value
        else:
            setattr(request.model_spec, key, value)
    if images is not None:
        request.inputs["image"].CopyFrom(tf.make_tensor_proto(images))
    return request
