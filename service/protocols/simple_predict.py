"""The friendly `POST /predict/{model}` (and `POST /predict`, the default model's) for
people: whatever the model takes in, labels and probabilities or values out.

What each model takes and how its answer is shown follows from its signature
(service/protocols/model_form.py); the body is read by service/codecs/simple_json.py: image
models take JSON pixel arrays of their shape (integers 0-255 or floats in [0, 1]), base64
image files or a multipart upload of image files of any size, prepared as the model's
training data was (artifact/images.py); models that decode their own images (one
`*image*_bytes` string input) take the same files and base64 images, each file's bytes sent
unchanged; models on named features take one JSON object per instance; classifiers answer
each instance's class id, its label and every class's probability keyed by label
(`artifact.contract.prediction_rows`, the rows batch prediction writes), regressors the value.

Image files are decoded on a thread of their own, never on the event loop: whether a body
holds one is decided once its JSON is read, not from how its bytes look. With
`include_pixels=true` each row of an image model also holds the image as the model received
it (integers 0-255 of the model's shape, after the decoding, scaling, centring or resizing and
inversion of artifact.images): the page shows it, no client re-implements it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import re
import threading

import numpy as np

from artifact.images import INVERT_MODES, input_to_pixels
from service.budgets import UNBOUNDED_PIXELS, PixelBudget
from service.codecs import images, json_body, simple_json, tf_example, tfserving_json
from service.dataplane import DataPlane
from service.errors import BadInput, SignatureNotFound
from service.protocols import model_form
from service.protocols.http import (
    FILES_SCHEMA,
    form_request,
    image_form,
    json_response,
    multipart_form,
    request_body,
)
from service.protocols.model_form import ModelForm
from service.routes import MODEL_WRITE, Answers, Body, Call, Route, admit_always
from service.security import PREDICT

# JSON bodies up to this size are read on the event loop (a few pixel arrays cost less than a
# thread hop); what they hold decides where it is decoded: image files on the decoding thread.
INLINE_PARSE_BYTES = 64 * 1024
# TensorFlow's error text around its own words: `{{function_node ...}}` and `{{node ...}}`
# names, the `[[...]]` trace of the op that failed, the `[Op:...]` that ran it.
_TENSORFLOW_TRACE = re.compile(r"\{\{[^{}]*\}\}|\s*\[\[.*?\]\]|\s*\[Op:[^\]]*\]", re.DOTALL)

# TensorFlow's words when a tf.Example's feature has another type than the model parses.
EXAMPLE_TYPE_MISMATCH = "Data types don't match"
EXAMPLE_TYPES_HINT = (
    "the model parses tf.Examples, whose feature types its signature does not say: JSON "
    "integers become int64 features and other numbers float ones, so write 1.0 for a float "
    "feature"
)

_INSTANCES_TEXT = (
    "Image models: arrays of the model's input shape (integers 0-255 or floats in [0, 1]) "
    "or {'b64': '<base64 PNG or JPEG>'}; models decoding their own images (one `*_bytes` "
    "string input, such as `image_bytes`) the latter only, each file sent as it is. Models on "
    "named features: one object per instance naming every feature (numbers, integers, "
    "strings as the signature types them). Models parsing tf.Examples: one object of "
    "features per instance. Any other: TF Serving's row format."
)


def _predict_doc(example: dict) -> Body:
    return request_body(
        {
            "type": "object",
            "required": ["instances"],
            "properties": {"instances": {"type": "array", "description": _INSTANCES_TEXT}},
        },
        example,
        {
            "multipart/form-data": multipart_form(
                files={
                    **FILES_SCHEMA,
                    "description": "Image models: PNG or JPEG images of any size (sent "
                    "unchanged to a model that decodes them itself)",
                }
            )
        },
    )


PREDICT_ANSWER = {
    "type": "object",
    "properties": {
        "model_name": {"type": "string"},
        "model_version": {"type": "string"},
        "predictions": {
            "type": "array",
            "description": "Per instance: class_id, label and probabilities by label (a "
            "classifier), value (a regressor), or the signature's outputs",
            "items": {"type": "object"},
        },
    },
}
PREDICT_DOC = _predict_doc({"instances": [[[0] * 28] * 28]})
PREDICT_MODEL_DOC = _predict_doc({"instances": [{"x1": 1.5, "rooms": 3, "color": "red"}]})


# The query's parameters, as the OpenAPI schema documents them.
QUERY = (
    {
        "name": "invert",
        "in": "query",
        "required": False,
        "description": "Uploaded/base64 images: invert the colours; 'auto' inverts when the "
        "border is light for models prepared like Fashion-MNIST (light on dark), never for "
        "others",
        "schema": {"type": "string", "enum": list(INVERT_MODES), "default": "auto"},
    },
    {
        "name": "include_pixels",
        "in": "query",
        "required": False,
        "description": "Image models: also answer each image as the model received it, "
        "integers 0-255 of its input shape ('pixels')",
        "schema": {"type": "boolean", "default": False},
    },
)
# The words pydantic takes for a boolean, case aside: what FastAPI accepted when it parsed
# this query, so clients written then keep working.
BOOLEAN_WORDS = {
    **dict.fromkeys(("1", "on", "t", "true", "y", "yes"), True),
    **dict.fromkeys(("0", "off", "f", "false", "n", "no"), False),
}


class PeopleAPI:
    """`POST /predict/{model}` and `POST /predict` over a data plane.

    Image files are decoded on one thread of their own: a flood of large photos queues there,
    never on the event loop or in front of other clients' pixel arrays.

    Args:
        dataplane: what serves the models.
        max_body_bytes: largest request body (MAX_BODY_BYTES): the most one uploaded file
            may be.
        max_request_pixels: most pixels one request's image files may decode to.
        pixels_in_flight: the process's budget of pixels being decoded (MAX_PIXELS_IN_FLIGHT),
            shared with feedback; None: unbounded.
    """

    def __init__(
        self,
        dataplane: DataPlane,
        max_body_bytes: int,
        max_request_pixels: int = 48_000_000,
        pixels_in_flight: PixelBudget | None = None,
    ):
        self.dataplane = dataplane
        self.max_body_bytes = max_body_bytes
        self.max_request_pixels = max_request_pixels
        self.pixels_in_flight = pixels_in_flight or UNBOUNDED_PIXELS
        self.decoder = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="decode")

    def routes(self) -> list[Route]:
        """`POST /predict` and `POST /predict/{model}`."""
        admit = admit_always(self.dataplane.admit)
        answers = Answers(schema=PREDICT_ANSWER, errors=MODEL_WRITE)
        return [
            Route("POST", "/predict", self.predict,
                  "Predict with the default model: images, named features or any signature in; "
                  "labels and probabilities, or values, out",
                  PREDICT, ("predict",), PREDICT_DOC, answers, QUERY, admit,
                  protocol="simple"),
            Route("POST", "/predict/{name:name}", self.predict,
                  "Predict with a model: images, named features or any signature in; labels "
                  "and probabilities, or values, out",
                  PREDICT, ("predict",), PREDICT_MODEL_DOC, answers, QUERY, admit,
                  protocol="simple"),
        ]  # fmt: skip

    async def predict(self, call: Call, name: str | None = None):
        """The friendly prediction; its query read here (the last value of a repeated
        parameter wins)."""
        query = call.query
        include = query.get("include_pixels", "false").lower()
        if include not in BOOLEAN_WORDS:
            raise BadInput(
                "query.include_pixels: expected a boolean (true/false, 1/0, yes/no, on/off), "
                f"got {query['include_pixels']!r}"
            )
        invert = query.get("invert", "auto")
        if invert not in INVERT_MODES:
            raise BadInput(f"invert: expected one of {', '.join(INVERT_MODES)}, got {invert!r}")
        name = self.dataplane.model_name if name is None else name
        form = await model_form.model_form(self.dataplane, name)
        if form.kind == model_form.IMAGE:
            return await self._predict_images(call, name, form, invert, BOOLEAN_WORDS[include])
        if form.kind == model_form.IMAGE_BYTES:
            return await self._predict_image_bytes(call, name, form)
        return await self._predict_json(call, name, form)

    async def _decode(self, work, *args):
        """Run `work(*args, cancelled)` on the decoding thread; when the client leaves (the
        handler's task is cancelled), the images not yet decoded are not decoded."""
        cancelled = threading.Event()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.decoder, work, *args, cancelled)
        finally:
            cancelled.set()

    async def _uploads(self, call: Call) -> list[tuple[str, bytes]]:
        """A multipart body's image files: (where, bytes), where naming each for messages."""
        _, uploads = await image_form(
            form_request(call), self.dataplane.max_images, self.max_body_bytes
        )
        names = [upload.filename or f"files[{i}]" for i, upload in enumerate(uploads)]
        return [(names[i], await upload.read()) for i, upload in enumerate(uploads)]

    def _answer(self, name: str, result, rows: list, files: list[str] | None, pixels=None):
        """The answer: its rows, each with the image as the model received it (`pixels`)
        and the file it came from (`files`), when given."""
        if pixels is not None:
            rows = [{**row, "pixels": image} for row, image in zip(rows, pixels, strict=True)]
        if files is not None:
            rows = [{"file": file, **row} for file, row in zip(files, rows, strict=True)]
        return json_response(
            {"model_name": name, "model_version": str(result.version), "predictions": rows}
        )

    # --- image models -------------------------------------------------------------------

    async def _predict_images(
        self, call: Call, name: str, form: ModelForm, invert: str, include_pixels: bool
    ):
        files: list[str] | None = None
        if _is_multipart(call):
            uploads = await self._uploads(call)
            files = [file for file, _ in uploads]
            where = [(f"files[{i}] ({file})", data) for i, (file, data) in enumerate(uploads)]
            decode = functools.partial(images.decode_image_inputs, in_flight=self.pixels_in_flight)
            inputs = await self._decode(decode, where, form.image, invert, self.max_request_pixels)
        else:
            inputs = await self._json_images(call.body, form, invert)
        result = await self.dataplane.predict(name, form.inputs(inputs), None, form.signature.name)
        rows = model_form.answer_rows(form, result.outputs, result.labels)
        pixels = input_to_pixels(inputs) if include_pixels else None
        return self._answer(name, result, rows, files, pixels)

    async def _json_images(self, body: bytes, form: ModelForm, invert: str) -> np.ndarray:
        """A JSON body's images as model input. Any other type is read as JSON, as TF Serving
        does (`curl -d` says form-urlencoded)."""
        if len(body) > INLINE_PARSE_BYTES:
            return await self._decode(self._read_images, body, form, invert)
        read = simple_json.read_images(
            body, form.image_input(), form.image_contract, self.dataplane.max_images
        )
        # Image files on the decoding thread, however their JSON is spelled: the body read
        # says it holds one (a key written "\u0062\u0036\u0034" is "b64" too).
        if read.files:
            return await self._decode(self._decode_images, read, invert)
        return self._decode_images(read, invert)

    def _read_images(self, body: bytes, form: ModelForm, invert: str, cancelled=None):
        read = simple_json.read_images(
            body, form.image_input(), form.image_contract, self.dataplane.max_images
        )
        return self._decode_images(read, invert, cancelled)

    def _decode_images(self, read, invert: str, cancelled=None) -> np.ndarray:
        return read.decode(invert, self.max_request_pixels, cancelled, self.pixels_in_flight)

    # --- models that decode their own images ---------------------------------------------

    async def _predict_image_bytes(self, call: Call, name: str, form: ModelForm):
        """Each image file's bytes to the model unchanged; `invert` and `include_pixels` do
        not apply (the model prepares its images, and the service never sees their pixels)."""
        uploaded: list[str] | None = None
        if _is_multipart(call):
            uploads = await self._uploads(call)
            uploaded = [file for file, _ in uploads]
            files = [(f"files[{i}] ({file})", data) for i, (file, data) in enumerate(uploads)]
        elif len(call.body) <= INLINE_PARSE_BYTES:
            files = self._image_bytes_files(form, call.body)
        else:
            files = await self._decode(self._image_bytes_files, form, call.body)
        # Headers only: what is no image is refused, named, before it reaches the model.
        pixels = await self._decode(self._header_pixels, files)
        # The model decodes them while it runs: their pixels are held until it answers.
        with self.pixels_in_flight.hold(pixels):
            try:
                result = await self.dataplane.predict(
                    name,
                    {form.signature.inputs[0].name: images.files_input(files)},
                    None,
                    form.signature.name,
                )
            except SignatureNotFound:
                raise  # unloaded since the form was read: not the files' fault
            except BadInput as err:
                raise refused(name, err, files) from err
        rows = model_form.answer_rows(form, result.outputs, result.labels)
        return self._answer(name, result, rows, uploaded)

    def _image_bytes_files(self, form: ModelForm, body: bytes, cancelled=None) -> list:
        instances = simple_json.read_instances(body, self.dataplane.max_images)
        return simple_json.image_bytes_files(instances, form.signature.inputs[0].name)

    def _header_pixels(self, files: list, cancelled=None) -> int:
        return images.check_pixel_budget(files, self.max_request_pixels)

    # --- models on features, tf.Examples or any tensors ----------------------------------

    async def _predict_json(self, call: Call, name: str, form: ModelForm):
        if _is_multipart(call):
            raise BadInput(
                f"model {name} takes {_takes(form)}, not image files: send JSON "
                '{"instances": [...]}'
            )
        body = call.body
        if len(body) <= INLINE_PARSE_BYTES:
            inputs = self._json_inputs(form, body)
        else:
            inputs = await self._decode(self._json_inputs, form, body)
        try:
            result = await self.dataplane.predict(name, inputs, None, form.signature.name)
        except BadInput as err:
            if form.kind == model_form.EXAMPLES and EXAMPLE_TYPE_MISMATCH in err.message:
                raise BadInput(f"{err.message}; {EXAMPLE_TYPES_HINT}") from err
            raise
        rows = model_form.answer_rows(form, result.outputs, result.labels)
        return self._answer(name, result, rows, None)

    def _json_inputs(self, form: ModelForm, body: bytes, cancelled=None) -> dict:
        """A JSON body's inputs for the signature, by the model's kind."""
        max_images = self.dataplane.max_images
        if form.kind == model_form.TENSORS:
            request = json_body.loads(body)
            if not isinstance(request, dict):
                raise BadInput(
                    "the body must be a JSON object: TF Serving's row or columnar format"
                )
            return tfserving_json.read_inputs(request, form.signature, max_images)[0]
        instances = simple_json.read_instances(body, max_images)
        if form.kind == model_form.FEATURES:
            return simple_json.read_features(instances, form.features)
        return tf_example.example_inputs(
            tf_example.instance_examples(instances), form.signature.inputs[0].name
        )


def _is_multipart(call: Call) -> bool:
    return call.headers.get("content-type", "").startswith("multipart/form-data")


def _takes(form: ModelForm) -> str:
    if form.kind == model_form.FEATURES:
        return "named features"
    if form.kind == model_form.EXAMPLES:
        return "tf.Example features"
    return "tensors in TF Serving's JSON format"


def tensorflow_words(message: str) -> str:
    """TensorFlow's message without the names of its graph's functions and nodes."""
    words = " ".join(_TENSORFLOW_TRACE.sub("", message).split())
    return words or message


def refused(model: str, err: BadInput, files: list[tuple[str, bytes]]) -> BadInput:
    """A model's refusal of image files it decodes itself (its graph could not decode one,
    say), in words that say which files and that the model decodes them."""
    words = tensorflow_words(err.message)
    if len(files) == 1:
        return BadInput(f"{files[0][0]}: model {model} could not use it (the model decodes "
                        f"its images itself): {words}")  # fmt: skip
    return BadInput(
        f"model {model} could not use one of the {len(files)} images (the model decodes its "
        f"images itself): {words}"
    )
