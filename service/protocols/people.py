"""The friendly `POST /predict/{model}` (and `POST /predict`, the default model's) for
people: whatever the model takes in, labels and probabilities or values out.

What each model takes and how its answer is shown follows from its signature
(service/protocols/friendly.py): image models take JSON pixel arrays of their shape
(integers 0-255 or floats in [0, 1]), base64 image files or a multipart upload of image files
of any size, prepared as the model's training data was (artifact/images.py); models that
decode their own images (one `*_bytes` string input) take the same files and base64 images,
each file's bytes sent unchanged (service/protocols/image_bytes.py); models on named
features take one JSON object per instance; classifiers answer each instance's class id, its
label and every class's probability keyed by label, regressors the value.

The Fashion-MNIST contract (`image` float32 [-1, 28, 28] in, `classes` and `probabilities`
out) keeps its own path: simdjson for the usual pixel body, each answer row
`artifact.contract.prediction_rows`' (the same batch prediction writes). With
`include_pixels=true` each row of an image model also holds the image as the model received
it (integers 0-255 of the model's shape, after the decoding, scaling, centring or resizing and
inversion of artifact.images): the page shows it, no client re-implements it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading

import numpy as np

from artifact.contract import (
    CLASSES_KEY,
    PIXEL_MAX,
    PROBABILITIES_KEY,
    normalize_pixels,
    prediction_rows,
)
from artifact.images import INVERT_MODES, ImageError, image_to_input, input_to_pixels
from service import codec, tensor_json
from service.dataplane import DataPlane
from service.errors import BadInput, SignatureNotFound
from service.protocols import friendly, image_bytes
from service.protocols.friendly import ModelForm
from service.protocols.http import (
    FILES_SCHEMA,
    form_request,
    image_form,
    json_response,
    multipart_form,
    request_body,
)
from service.routes import MODEL_WRITE, Answers, Call, Route, admit_always
from service.security import PREDICT

# JSON bodies up to this size without image files are parsed on the event loop: a few pixel
# arrays cost less than a thread hop.
INLINE_PARSE_BYTES = 64 * 1024

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


def _predict_doc(example: dict) -> dict:
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
        pixels_in_flight: codec.PixelBudget | None = None,
    ):
        self.dataplane = dataplane
        self.max_body_bytes = max_body_bytes
        self.max_request_pixels = max_request_pixels
        self.pixels_in_flight = pixels_in_flight or codec.UNBOUNDED_PIXELS
        self.decoder = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="decode")

    def routes(self) -> list[Route]:
        """`POST /predict` and `POST /predict/{model}`."""
        admit = admit_always(self.dataplane.admit)
        answers = Answers(schema=PREDICT_ANSWER, errors=MODEL_WRITE)
        return [
            Route("POST", "/predict", self.predict,
                  "Predict with the default model: images, named features or any signature in; "
                  "labels and probabilities, or values, out",
                  PREDICT, ("predict",), PREDICT_DOC, answers, QUERY, admit),
            Route("POST", "/predict/{name:name}", self.predict,
                  "Predict with a model: images, named features or any signature in; labels "
                  "and probabilities, or values, out",
                  PREDICT, ("predict",), PREDICT_MODEL_DOC, answers, QUERY, admit),
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
        form = await friendly.model_form(self.dataplane, name)
        if form.image_contract:
            return await self._predict_images(call, name, form, invert, BOOLEAN_WORDS[include])
        if form.kind == friendly.IMAGE_BYTES:
            return await self._predict_image_bytes(call, name, form)
        return await self._predict_any(call, name, form, invert, BOOLEAN_WORDS[include])

    # --- the image contract's path ------------------------------------------------------

    async def _predict_images(
        self, call: Call, name: str, form: ModelForm, invert: str, include_pixels: bool
    ):
        body = call.body
        files: list[str] | None = None
        if _is_multipart(call):
            images, files = await self._uploaded_images(call, invert)
        elif len(body) <= INLINE_PARSE_BYTES and b'"b64"' not in body:
            # Any other type is read as JSON, as TF Serving does (`curl -d` says
            # form-urlencoded). A few pixel arrays cost less than a thread hop.
            images = self._json_images(body, invert)
        else:
            # Large bodies and base64 photos on the decoding thread: never the event loop.
            images = await self._decode(self._json_images, body, invert)
        result = await self.dataplane.predict(name, images, None, form.signature.name)
        rows = list(
            prediction_rows(
                result.outputs[CLASSES_KEY], result.outputs[PROBABILITIES_KEY], result.labels
            )
        )
        if include_pixels:
            received = np.rint(images * PIXEL_MAX).astype(np.uint8)
            rows = [{**row, "pixels": pixels} for row, pixels in zip(rows, received, strict=True)]
        if files is not None:
            rows = [{"file": file, **row} for file, row in zip(files, rows, strict=True)]
        return json_response(
            {"model_name": name, "model_version": str(result.version), "predictions": rows}
        )

    async def _decode(self, work, *args):
        """Run `work(*args, cancelled)` on the decoding thread; when the client leaves (the
        handler's task is cancelled), the images not yet decoded are not decoded."""
        cancelled = threading.Event()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.decoder, work, *args, cancelled)
        finally:
            cancelled.set()

    def _json_images(self, body: bytes, invert: str, cancelled=None) -> np.ndarray:
        simple = codec.simple_pixel_images(body, self.dataplane.max_images)
        if simple is not None:
            return codec.decode_pixel_images(simple)
        instances = codec.pixel_instances(codec.loads(body))
        # Counted before any image is decoded.
        self.dataplane.check_image_count(len(instances))
        return codec.decode_pixel_instances(
            instances, invert, self.max_request_pixels, cancelled, self.pixels_in_flight
        )

    async def _uploads(self, call: Call) -> list[tuple[str, bytes]]:
        """A multipart body's image files: (where, bytes), where naming each for messages."""
        _, uploads = await image_form(
            form_request(call), self.dataplane.max_images, self.max_body_bytes
        )
        names = [upload.filename or f"files[{i}]" for i, upload in enumerate(uploads)]
        return [(names[i], await upload.read()) for i, upload in enumerate(uploads)]

    async def _uploaded_images(self, call: Call, invert: str):
        uploads = await self._uploads(call)
        files = [(f"files[{i}] ({name})", data) for i, (name, data) in enumerate(uploads)]
        decode = functools.partial(codec.decode_image_files, in_flight=self.pixels_in_flight)
        pixels = await self._decode(decode, files, invert, self.max_request_pixels)
        return normalize_pixels(pixels), [name for name, _ in uploads]

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
                    {form.signature.inputs[0].name: image_bytes.files_input(files)},
                    None,
                    form.signature.name,
                )
            except SignatureNotFound:
                raise  # unloaded since the form was read: not the files' fault
            except BadInput as err:
                raise image_bytes.refused(name, err, files) from err
        rows = friendly.answer_rows(form, result.outputs, result.labels)
        if uploaded is not None:
            rows = [{"file": file, **row} for file, row in zip(uploaded, rows, strict=True)]
        return json_response(
            {"model_name": name, "model_version": str(result.version), "predictions": rows}
        )

    def _image_bytes_files(self, form: ModelForm, body: bytes, cancelled=None) -> list:
        instances = friendly.instances_of(codec.loads(body), self.dataplane.max_images)
        return image_bytes.instance_files(instances, form.signature.inputs[0].name)

    def _header_pixels(self, files: list, cancelled=None) -> int:
        return codec.check_pixel_budget(files, self.max_request_pixels)

    # --- any other model ----------------------------------------------------------------

    async def _predict_any(
        self, call: Call, name: str, form: ModelForm, invert: str, include_pixels: bool
    ):
        files: list[str] | None = None
        if _is_multipart(call):
            if form.kind != friendly.IMAGE:
                raise BadInput(
                    f"model {name} takes {_takes(form)}, not image files: send JSON "
                    '{"instances": [...]}'
                )
            uploads = await self._uploads(call)
            files = [file for file, _ in uploads]
            where = [(f"files[{i}] ({file})", data) for i, (file, data) in enumerate(uploads)]
            work = functools.partial(self._image_inputs, form, where, invert)
            images = await self._decode(work)
            inputs = {form.signature.inputs[0].name: images}
        else:
            body = call.body
            if len(body) <= INLINE_PARSE_BYTES and b'"b64"' not in body:
                inputs = self._json_inputs(form, body, invert)
            else:
                inputs = await self._decode(self._json_inputs, form, body, invert)
        try:
            result = await self.dataplane.predict(name, inputs, None, form.signature.name)
        except BadInput as err:
            if form.kind == friendly.EXAMPLES and EXAMPLE_TYPE_MISMATCH in err.message:
                raise BadInput(f"{err.message}; {EXAMPLE_TYPES_HINT}") from err
            raise
        rows = friendly.answer_rows(form, result.outputs, result.labels)
        if include_pixels and form.kind == friendly.IMAGE:
            received = input_to_pixels(inputs[form.signature.inputs[0].name])
            rows = [{**row, "pixels": pixels} for row, pixels in zip(rows, received, strict=True)]
        if files is not None:
            rows = [{"file": file, **row} for file, row in zip(files, rows, strict=True)]
        return json_response(
            {"model_name": name, "model_version": str(result.version), "predictions": rows}
        )

    def _json_inputs(self, form: ModelForm, body: bytes, invert: str, cancelled=None) -> dict:
        """A JSON body's inputs for the signature, by the model's kind."""
        request = codec.loads(body)
        if form.kind == friendly.TENSORS:
            if not isinstance(request, dict):
                raise BadInput(
                    "the body must be a JSON object: TF Serving's row or columnar format"
                )
            inputs, _ = tensor_json.read_inputs(request, form.signature, self.dataplane.max_images)
            return inputs
        instances = friendly.instances_of(request, self.dataplane.max_images)
        if form.kind == friendly.FEATURES:
            return friendly.read_features(instances, form)
        if form.kind == friendly.EXAMPLES:
            return friendly.read_examples(instances, form)
        files = {
            i: (f"instances[{i}]", friendly.image_file(item, f"instances[{i}]"))
            for i, item in enumerate(instances)
            if isinstance(item, dict)
        }
        decoded = {}
        if files:
            images = self._image_inputs(form, list(files.values()), invert, cancelled)
            decoded = dict(zip(files, images, strict=True))
        images = [
            decoded[i]
            if i in decoded
            else friendly.pixel_array(item, form.image, f"instances[{i}]")
            for i, item in enumerate(instances)
        ]
        return {form.signature.inputs[0].name: np.stack(images)}

    def _image_inputs(self, form: ModelForm, files, invert: str, cancelled=None) -> np.ndarray:
        """Image files as the model's input [n, ...], within the request's pixel budget and
        the process's; on the decoding thread."""
        with self.pixels_in_flight.hold(codec.check_pixel_budget(files, self.max_request_pixels)):
            images = []
            for where, data in files:
                if cancelled is not None and cancelled.is_set():
                    raise codec.Cancelled
                try:
                    images.append(image_to_input(data, form.image, invert))
                except ImageError as err:
                    raise BadInput(f"{where}: {err}") from err
            return np.stack(images)


def _is_multipart(call: Call) -> bool:
    return call.headers.get("content-type", "").startswith("multipart/form-data")


def _takes(form: ModelForm) -> str:
    if form.kind == friendly.FEATURES:
        return "named features"
    if form.kind == friendly.EXAMPLES:
        return "tf.Example features"
    return "tensors in TF Serving's JSON format"
