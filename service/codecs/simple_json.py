"""The friendly `/predict`'s JSON body, `{"instances": [...]}`, each instance as the model's
signature takes it (service/protocols/model_form.py says which):

- images: a pixel array of the instance's shape (integers 0-255, or floats in [0, 1]) or an
  image file, `{"b64": "<base64 PNG or JPEG>"}` (read here, decoded by `ImageInstances.decode`,
  off the event loop when there is a file: the caller decides after reading, whatever the
  body's bytes look like). The image contract's instances keep its words, and its usual body
  of pixel arrays is read by simdjson (service/codecs/pixels.py);
- image files a model decodes itself: `{"b64": ...}` or `{"<input>": {"b64": ...}}`;
- named features: one object per instance naming every feature, each value typed from the
  signature (a whole float is an integer; a float must be finite in its dtype);
- tf.Examples: one object of features per instance (service/codecs/tf_example.py).

Every error names the instance (and the feature), what was expected and what came.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, TypeGuard

import numpy as np

from artifact.contract import IMAGE_SHAPE, PixelError, normalize_pixels, pixels_to_input
from artifact.images import MAX_PIXELS, ImageInput
from service.budgets import UNBOUNDED_PIXELS, PixelBudget
from service.codecs import images, json_body, pixels
from service.codecs.pixels import SHAPE_TEXT
from service.codecs.values import Misfit, b64_file, element, kind_of, plain_words
from service.errors import BadInput, check_image_count

_TYPE_NAMES = {"f": "number", "i": "integer", "u": "integer", "O": "string", "b": "boolean"}


# --- the instances ------------------------------------------------------------------------


def instances_of(request: Any, max_instances: int) -> list:
    """A /predict body's `instances` list (one or more), counted against MAX_IMAGES.

    Raises:
        BadInput: not an object with a non-empty `instances` list.
        PayloadTooLarge: more than max_instances.
    """
    if not isinstance(request, dict) or "instances" not in request:
        raise BadInput(
            'the body must be a JSON object with "instances": [...], one item per instance'
        )
    instances = request["instances"]
    if not isinstance(instances, list):
        raise BadInput(
            f"instances: expected a list, one item per instance, got {kind_of(instances)}"
        )
    if not instances:
        raise BadInput("instances: is empty; send at least one instance")
    check_image_count(len(instances), max_instances)
    return instances


def read_instances(body: bytes, max_instances: int) -> list:
    """A JSON body's `instances` (json_body.loads, then instances_of)."""
    return instances_of(json_body.loads(body), max_instances)


# --- named features -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Feature:
    """A named input of a model on features: its dtype and one instance's shape."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @staticmethod
    def takes(dtype: np.dtype | None) -> TypeGuard[np.dtype]:
        """Whether a person can send values of this dtype (numbers, strings, booleans)."""
        return dtype is not None and dtype.kind in _TYPE_NAMES

    @property
    def type_name(self) -> str:
        """What a person sends: number, integer, string or boolean."""
        return _TYPE_NAMES[self.dtype.kind]

    def describe(self) -> str:
        words = self.type_name if self.dtype.kind == "O" else f"{self.type_name}, {self.dtype}"
        if self.shape:
            words += f", {'x'.join(map(str, self.shape))} values"
        return f"{self.name} ({words})"


def _feature_element(value: Any, dtype: np.dtype, where: str) -> Any:
    """One value of a feature, by a person's rules (values.element, lenient), in their words."""
    try:
        return element(value, dtype, lenient=True)
    except Misfit as misfit:
        raise BadInput(plain_words(misfit, value, dtype, where)) from misfit


def _feature_values(value: Any, feature: Feature, where: str) -> list:
    """One instance's value of a feature as a flat list of elements of its shape (a single
    value also fills a shape of one)."""
    shape = feature.shape
    if not shape or (shape == (1,) and not isinstance(value, list)):
        if isinstance(value, list):
            raise BadInput(f"{where}: expected one {feature.type_name}, got {kind_of(value)}")
        return [_feature_element(value, feature.dtype, where)]
    flat: list = []
    stack: list[tuple[Any, int, str]] = [(value, 0, where)]
    while stack:
        item, depth, path = stack.pop()
        if depth == len(shape):
            flat.append(_feature_element(item, feature.dtype, path))
            continue
        if not isinstance(item, list) or len(item) != shape[depth]:
            raise BadInput(
                f"{path}: expected a list of {shape[depth]} (the feature takes "
                f"{'x'.join(map(str, shape))} values), got {kind_of(item)}"
            )
        stack.extend((item[k], depth + 1, f"{path}[{k}]") for k in range(len(item) - 1, -1, -1))
    return flat


def read_features(instances: list, features: tuple[Feature, ...]) -> dict[str, np.ndarray]:
    """One JSON object per instance naming every feature, typed from the signature.

    Raises:
        BadInput: an instance that is not an object, a missing or unknown feature, a value of
            another type than the feature's (naming the instance and the feature, what was
            expected and what came).
    """
    by_name = {feature.name: feature for feature in features}
    takes = ", ".join(feature.describe() for feature in features)
    columns: dict[str, list] = {name: [] for name in by_name}
    for i, instance in enumerate(instances):
        where = f"instances[{i}]"
        if not isinstance(instance, dict):
            raise BadInput(
                f"{where}: expected an object naming the features, got {kind_of(instance)}; "
                f"the model takes {takes}"
            )
        unknown = sorted(set(instance) - set(by_name))
        if unknown:
            raise BadInput(f"{where}: unknown feature {unknown[0]!r}; the model takes {takes}")
        for name, feature in by_name.items():
            if name not in instance:
                raise BadInput(
                    f"{where}: missing feature {feature.describe()}; the model takes {takes}"
                )
            columns[name].extend(_feature_values(instance[name], feature, f"{where}.{name}"))
    inputs = {}
    for name, feature in by_name.items():
        array = np.empty(len(columns[name]), dtype=feature.dtype)
        array[:] = columns[name]
        inputs[name] = array.reshape(len(instances), *feature.shape)
    return inputs


# --- image files a model decodes itself ---------------------------------------------------


def image_bytes_files(instances: list, input_name: str) -> images.Files:
    """Each JSON instance's image file, (where, bytes): `{"b64": ...}`, or an object naming
    the input, `{"<input_name>": {"b64": ...}}` (TF Serving's row format).

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
                f'{{"b64": ...}}}}, got {kind_of(item)}; the model takes image files and '
                "decodes them itself"
            )
        files.append((where, b64_file(item["b64"], where)))
    return files


# --- images: pixel arrays and image files -------------------------------------------------


class ImageInstances:
    """A body's image instances, read and not yet decoded (read_images).

    Attributes:
        image: the model's image input.
        contract: the image contract's (its words, its decoder).
        instances: the JSON instances; None when the usual body was read as `arrays`.
        files: the image files among them, by index: (where, the file's bytes).
        arrays: the usual body's pixel arrays, read by simdjson.
    """

    # A plain class: a frozen dataclass's __init__ cost a microsecond on the usual body.
    __slots__ = ("image", "contract", "instances", "files", "arrays")

    def __init__(
        self,
        image: ImageInput,
        contract: bool,
        instances: list | None = None,
        files: dict[int, tuple[str, bytes]] | None = None,
        arrays: list[np.ndarray] | None = None,
    ):
        self.image = image
        self.contract = contract
        self.instances = instances
        self.files = files or {}
        self.arrays = arrays

    def decode(
        self,
        invert: str,
        pixel_budget: int,
        cancelled: threading.Event | None = None,
        in_flight: PixelBudget = UNBOUNDED_PIXELS,
    ) -> np.ndarray:
        """The images as model input [n, ...]: pixel arrays by the friendly rule, files
        sized against the request's budget (MAX_REQUEST_PIXELS) and the process's, then
        decoded. A body with files is the caller's to decode off the event loop.

        Raises:
            BadInput: an instance that is neither, named; PayloadTooLarge: over the budget;
            PixelsInFlight: no room in the process's; Cancelled: `cancelled` was set.
        """
        if self.arrays is not None:
            return pixels.pixel_images(self.arrays)
        instances = self.instances
        if instances is None:
            raise TypeError("ImageInstances holds neither instances nor arrays")
        if self.contract:
            return _decode_contract(
                instances, self.files, invert, pixel_budget, cancelled, in_flight
            )
        decoded = {}
        if self.files:
            files = images.decode_image_inputs(
                list(self.files.values()), self.image, invert, pixel_budget, cancelled, in_flight
            )
            decoded = dict(zip(self.files, files, strict=True))
        return np.stack(
            [
                decoded[i]
                if i in decoded
                else pixels.pixel_array(item, self.image, f"instances[{i}]")
                for i, item in enumerate(instances)
            ]
        )


def read_images(
    body: bytes, image: ImageInput, contract: bool, max_instances: int
) -> ImageInstances:
    """An image model's JSON instances, each a pixel array or an image file (its bytes read
    from base64, nothing decoded). The image contract's usual body is read by simdjson.

    Raises:
        BadInput: not JSON, no `instances` list, or a file that is not base64 (named).
        PayloadTooLarge: more than max_instances.
    """
    if contract:
        arrays = usual_pixel_images(body, max_instances)
        if arrays is not None:
            return ImageInstances(image, contract, arrays=arrays)
        instances = pixel_instances(json_body.loads(body))
        # Counted before any file is read.
        check_image_count(len(instances), max_instances)
        files = _contract_files(instances)
    else:
        instances = read_instances(body, max_instances)
        files = {
            i: (f"instances[{i}]", image_file(item, f"instances[{i}]"))
            for i, item in enumerate(instances)
            if isinstance(item, dict)
        }
    return ImageInstances(image, contract, instances, files)


def image_file(value: dict, where: str) -> bytes:
    """{"b64": "<base64 image file>"} (TF Serving's binary convention) to the file's bytes.

    Raises:
        BadInput: another object, or not base64.
    """
    if set(value) != {"b64"} or not isinstance(value["b64"], str):
        raise BadInput(
            f'{where}: expected an array of pixels or {{"b64": "<base64 image file>"}}, got '
            f"{kind_of(value)}"
        )
    return b64_file(value["b64"], where)


# --- the image contract's instances ---------------------------------------------------------


def usual_pixel_images(body: bytes, max_images: int) -> list[np.ndarray] | None:
    """The usual body, `{"instances": [n 28x28 pixel arrays]}`, read by simdjson: each image
    as numpy would read its list (int64 when all its numbers are integers, float64
    otherwise). None for anything else (see pixels.image_rows): base64 images, booleans,
    integers past int64..."""
    view = pixels.image_rows(body, max_images)
    if view is None:
        return None
    arrays = []
    for image in view[0]:
        flat = json_body.numbers(image)
        if flat is None:
            return None
        arrays.append(flat.reshape(IMAGE_SHAPE))
    return arrays


def pixel_instances(request: Any) -> list:
    """The image contract's `instances` list (parsed JSON), before decoding.

    Raises:
        BadInput: not an object with a non-empty `instances` list.
    """
    if not isinstance(request, dict) or "instances" not in request:
        raise BadInput('Request body must be a JSON object with "instances": [...]')
    instances = request["instances"]
    if not isinstance(instances, list) or not instances:
        pixels.to_array(instances, "instances")  # raises the right message
    return instances


def _contract_files(instances: list) -> dict[int, tuple[str, bytes]]:
    files = {}
    for i, item in enumerate(instances):
        if isinstance(item, dict):
            where = f"instances[{i}]"
            if not isinstance(item.get("b64"), str) or len(item) != 1:
                raise BadInput(
                    f'{where}: expected a {SHAPE_TEXT} array or {{"b64": "<base64 image>"}}'
                )
            files[i] = (where, b64_file(item["b64"], where))
    return files


def decode_pixel_instances(
    instances: list,
    invert: str,
    pixel_budget: int = MAX_PIXELS,
    cancelled: threading.Event | None = None,
    in_flight: PixelBudget = UNBOUNDED_PIXELS,
) -> np.ndarray:
    """The image contract's instances to float32 images [n, 28, 28] in [0, 1].

    Each instance is a 28x28 array of pixels (integers 0-255 or floats in [0, 1]) or
    {"b64": "<base64 PNG or JPEG>"}; each is read on its own, so one image's integers do not
    change how another's floats are read. The image files are sized from their headers first,
    against `pixel_budget` for all of them together, and reserved from `in_flight` (the
    process's), before any is decoded.

    Raises:
        BadInput: an instance is neither; the message names it.
        PayloadTooLarge: the image files would decode to more than pixel_budget pixels.
        PixelsInFlight: `in_flight` has no room for them now.
        Cancelled: `cancelled` was set (the client left) before the last image was decoded.
    """
    files = _contract_files(instances)
    return _decode_contract(instances, files, invert, pixel_budget, cancelled, in_flight)


def _decode_contract(instances, files, invert, pixel_budget, cancelled, in_flight) -> np.ndarray:
    total = images.check_pixel_budget(list(files.values()), pixel_budget)
    with in_flight.hold(total):
        decoded = []
        for i, item in enumerate(instances):
            where = f"instances[{i}]"
            if i in files:
                if cancelled is not None and cancelled.is_set():
                    raise images.Cancelled
                decoded.append(
                    normalize_pixels(images.image_file_pixels(files[i][1], where, invert))
                )
                continue
            pixels.refuse_booleans([item], "instances", start=i)
            try:
                decoded.append(pixels_to_input(pixels.to_array([item], "instances", start=i))[0])
            except PixelError as err:
                raise BadInput(f"{where}: {err.problem}") from err
        return np.stack(decoded)
