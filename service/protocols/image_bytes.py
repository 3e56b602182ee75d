"""Image models that decode their own images, for the friendly `/predict`.

TF Serving's convention: an input whose name ends in `_bytes` holds binary data (in JSON,
`{"b64": ...}`). Its usual image model takes one such input, `image_bytes`, a string [-1],
and decodes each file in its graph (`tf.io.decode_image`, `decode_jpeg` or `decode_png`,
then a resize): what the official ResNet export and most Estimators fed through a
`TensorServingInputReceiver` of encoded images give.

The friendly `/predict` sends such a model each image file's bytes unchanged, from a
multipart upload, a `{"b64": ...}` instance (the same forms a pixel model takes), or an
instance naming the input (`{"image_bytes": {"b64": ...}}`, TF Serving's row format). The
service decodes nothing: it reads each file's header only
(`service.codec.check_pixel_budget`), so that a file that is no image is refused naming it
before it reaches the model, and the pixels the graph will decode count against
MAX_REQUEST_PIXELS and MAX_PIXELS_IN_FLIGHT as any image's do.

Pure numpy: nothing here imports TensorFlow.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

import numpy as np

from service.errors import BadInput
from service.types import TensorSpec

BYTES_SUFFIX = "_bytes"
# TensorFlow's error text around its own words: `{{function_node ...}}` and `{{node ...}}`
# names, the `[[...]]` trace of the op that failed, the `[Op:...]` that ran it.
_TENSORFLOW_TRACE = re.compile(r"\{\{[^{}]*\}\}|\s*\[\[.*?\]\]|\s*\[Op:[^\]]*\]", re.DOTALL)


def takes_image_bytes(spec: TensorSpec) -> bool:
    """An input of encoded image files: a string [-1] named as images' bytes (`image_bytes`,
    `input_images_bytes`). Other `*_bytes` inputs (audio, say) keep TF Serving's row format:
    the service could not tell their files apart."""
    name = spec.name.lower()
    return (
        spec.dtype == np.dtype(object)
        and spec.shape == (-1,)
        and name.endswith(BYTES_SUFFIX)
        and "image" in name
    )


def _what(value: Any) -> str:
    """A JSON value, for messages."""
    if isinstance(value, dict):
        return f"an object with {sorted(value)[:5]}"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, str):
        return "a string"
    return "null" if value is None else f"the {type(value).__name__} {value!r}"


def instance_files(instances: list, input_name: str) -> list[tuple[str, bytes]]:
    """Each JSON instance's image file, (where, bytes): `{"b64": ...}`, or an object naming
    the input, `{"<input_name>": {"b64": ...}}`.

    Raises:
        BadInput: another value (pixel arrays among them: the model takes files), or one
            that is not base64; named by its instance.
    """
    files = []
    for i, item in enumerate(instances):
        where = f"instances[{i}]"
        if isinstance(item, dict) and set(item) == {input_name}:
            item, where = item[input_name], f"{where}.{input_name}"
        if not (isinstance(item, dict) and set(item) == {"b64"} and isinstance(item["b64"], str)):
            raise BadInput(
                f'{where}: expected {{"b64": "<base64 image file>"}} or {{"{input_name}": '
                f'{{"b64": ...}}}}, got {_what(item)}; the model takes image files and decodes '
                "them itself"
            )
        try:
            files.append((where, base64.b64decode(item["b64"], validate=True)))
        except (binascii.Error, ValueError) as err:
            raise BadInput(f"{where}.b64: not valid base64 ({err})") from err
    return files


def files_input(files: list[tuple[str, bytes]]) -> np.ndarray:
    """The files' bytes as the model's string input [n], unchanged."""
    array = np.empty(len(files), dtype=object)
    array[:] = [data for _, data in files]
    return array


def tensorflow_words(message: str) -> str:
    """TensorFlow's message without the names of its graph's functions and nodes."""
    words = " ".join(_TENSORFLOW_TRACE.sub("", message).split())
    return words or message


def refused(model: str, err: BadInput, files: list[tuple[str, bytes]]) -> BadInput:
    """The model's refusal of the files (its graph could not decode one, say), in words
    that say which files and that the model decodes them."""
    words = tensorflow_words(err.message)
    if len(files) == 1:
        return BadInput(f"{files[0][0]}: model {model} could not use it (the model decodes "
                        f"its images itself): {words}")  # fmt: skip
    return BadInput(
        f"model {model} could not use one of the {len(files)} images (the model decodes its "
        f"images itself): {words}"
    )
