"""The baseline users would write: FastAPI the obvious way, one model call per request.

A pydantic model of nested lists validates every pixel, the SavedModel's signature is called
as `sig(image=...)` per request, and FastAPI encodes the response. Run by `make bench` only.
"""

from __future__ import annotations

import os

import tensorflow as tf
from fastapi import FastAPI
from pydantic import BaseModel

model = tf.saved_model.load(os.environ["NAIVE_MODEL_PATH"])
signature = model.signatures["serving_default"]
app = FastAPI()


class PredictRequest(BaseModel):
    instances: list[list[list[float]]]


@app.post("/v1/models/fashion_mnist:predict")
def predict(request: PredictRequest):
    outputs = signature(image=tf.constant(request.instances, tf.float32))
    classes = outputs["classes"].numpy().tolist()
    probabilities = outputs["probabilities"].numpy().tolist()
    return {
        "predictions": [
            {"classes": c, "probabilities": p} for c, p in zip(classes, probabilities, strict=True)
        ]
    }
