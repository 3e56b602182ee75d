"""What a model is to a person: what the friendly `/predict` takes for it and how its answer
is shown, read from its signature alone.

Which signature: `serving_default`, else the model's only predict-method one (pre-made
Estimators exported through the raw receiver have only `predict`).

What it takes (`ModelForm.kind`):
- `image`: one float input [-1, H, W] or [-1, H, W, C] with C 1 or 3. Image files are
  prepared as the model's training data was (artifact.images); JSON pixel arrays of the
  instance's shape are integers 0-255 or floats in [0, 1].
- `image_bytes`: one string input [-1] named `*image*_bytes`, image files the model decodes
  itself: each file's bytes go to it unchanged (`takes_image_bytes`).
- `features`: named inputs of numbers, integers, strings or booleans, each with a batch
  dimension first: one JSON object per instance, each feature typed from the signature.
- `examples`: serialized tf.Examples (a parsing receiver's one string input, `inputs` or
  `examples`): one JSON object of features per instance, written as a tf.Example the way TF
  Serving writes its `:classify` examples (strings are bytes, integers int64, other numbers
  float), since the signature does not say the features' types.
- `tensors`: anything else, in TF Serving's own JSON format (service/codecs/tfserving_json.py).

How each kind's JSON is read is service/codecs/simple_json.py's.

How it answers (`ModelForm.task`):
- `classification`: a float [-1, K] `probabilities` output (or `scores`, a classify
  signature's), or a signature's single float [-1, K] output, K at least 2, shown as
  probabilities only while its rows are ones (a Keras softmax through model_to_estimator's
  are; a pre-made regressor's `predictions` with label_dimension K are not, and are shown as
  `regression`'s values). Per instance the class id, its label and every class's
  probability keyed by label. Labels come from a string classes output (`all_classes`, or a
  classify signature's `classes`: a `label_vocabulary`), else the version's labels.txt, else
  the class ids.
- `regression`: a `predictions` output, a regress signature's `outputs`, or a single float
  output of one value per instance: the value (a list, or nested lists, when an instance has
  several values: a regressor with label_dimension 2, say).
- `outputs`: anything else: the signature's outputs as TF Serving renders them.

Pure numpy: nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from artifact.contract import (
    CLASSES_KEY,
    PROBABILITIES_KEY,
    SIGNATURE_NAME,
    output_problems,
    prediction_rows,
)
from artifact.images import ImageInput
from service.codecs.signatures import is_image_signature
from service.codecs.simple_json import Feature
from service.codecs.tf_example import CLASSIFY_SCORES, REGRESS_OUTPUTS
from service.codecs.tfserving_json import render_outputs
from service.codecs.values import text_of
from service.dataplane import DataPlane
from service.errors import BadInput, SignatureNotFound
from service.types import Inputs, SignatureSpec, TensorSpec

PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"

IMAGE, IMAGE_BYTES, FEATURES = "image", "image_bytes", "features"
EXAMPLES, TENSORS = "examples", "tensors"
CLASSIFICATION, REGRESSION, OUTPUTS = "classification", "regression", "outputs"

# Outputs pre-made heads write (tensorflow_estimator's head/base_head.py, prediction_keys.py).
ALL_CLASSES_KEY = "all_classes"
CLASS_IDS_KEY = "class_ids"
PREDICTIONS_KEY = "predictions"
# The one string input a parsing receiver's signatures take (signature_constants.py).
EXAMPLE_INPUTS = ("inputs", "examples")
# TF Serving's convention: an input whose name ends in `_bytes` holds binary data.
BYTES_SUFFIX = "_bytes"


def takes_image_bytes(spec: TensorSpec) -> bool:
    """An input of encoded image files: a string [-1] named as images' bytes (`image_bytes`,
    `input_images_bytes`), what the official ResNet export and most Estimators fed through a
    `TensorServingInputReceiver` of encoded images take. Other `*_bytes` inputs (audio, say)
    keep TF Serving's row format: the service could not tell their files apart."""
    name = spec.name.lower()
    return (
        spec.dtype == np.dtype(object)
        and spec.shape == (-1,)
        and name.endswith(BYTES_SUFFIX)
        and "image" in name
    )


@dataclasses.dataclass(frozen=True)
class ModelForm:
    """What the friendly /predict takes for a signature and how it shows the answer.

    Attributes:
        signature: the signature /predict feeds.
        kind: IMAGE, IMAGE_BYTES, FEATURES, EXAMPLES or TENSORS (the module's docstring).
        task: CLASSIFICATION, REGRESSION or OUTPUTS.
        image: an image model's input; None for the other kinds.
        features: a features model's inputs, by name.
        probabilities: the output holding a classifier's probabilities.
        class_names: the output naming the classes (strings [-1, K]), if any.
        class_ids: the output holding each instance's class id, if any.
        value: the output holding a regressor's value.
        softmax_guess: the classifier is a single unnamed float output: shown as one only
            while its rows are probabilities.
        image_contract: the Fashion-MNIST contract (`image` float32 [-1, 28, 28] in, int
            `classes` and float `probabilities` out): served by the paths built for it.
    """

    signature: SignatureSpec
    kind: str
    task: str
    image: ImageInput | None = None
    features: tuple[Feature, ...] = ()
    probabilities: str | None = None
    class_names: str | None = None
    class_ids: str | None = None
    value: str | None = None
    softmax_guess: bool = False
    image_contract: bool = False

    def image_input(self) -> ImageInput:
        """The image input of an IMAGE or IMAGE_BYTES form.

        Raises:
            TypeError: the form takes no images.
        """
        if self.image is None:
            raise TypeError(f"a {self.kind} form takes no image")
        return self.image

    def to_json(self) -> dict:
        """What the page needs to build its input and read the answer."""
        image = None
        if self.image is not None:
            image = {
                "height": self.image.height,
                "width": self.image.width,
                "channels": self.image.channels,
                "shape": list(self.image.shape),
                "preparation": self.image.preparation,
            }
        return {
            "signature_name": self.signature.name,
            "method_name": self.signature.method_name,
            "kind": self.kind,
            "task": self.task,
            # A single float [-1, K] output: probabilities only while its rows are ones.
            "probabilities_guessed": self.softmax_guess,
            "image": image,
            "inputs": [
                {"name": spec.name, "dtype": str(spec.dtype), "shape": spec.shape}
                for spec in self.signature.inputs
            ],
            "features": [
                {"name": f.name, "type": f.type_name, "dtype": str(f.dtype), "shape": list(f.shape)}
                for f in self.features
            ],
        }

    def inputs(self, array: np.ndarray) -> Inputs:
        """An image model's one input as the data plane takes it: the image contract's array
        as it is, another model's by its input's name."""
        return array if self.image_contract else {self.signature.inputs[0].name: array}


# --- which signature, and what it is ----------------------------------------------------


def choose_signature(signatures: dict[str, SignatureSpec], model: str) -> SignatureSpec:
    """`serving_default`, else the model's only predict-method signature.

    Raises:
        BadInput: neither (the message names the signatures and where to ask for one).
    """
    if SIGNATURE_NAME in signatures:
        return signatures[SIGNATURE_NAME]
    predict = [spec for spec in signatures.values() if spec.method_name == PREDICT_METHOD]
    if len(predict) == 1:
        return predict[0]
    raise BadInput(
        f'model {model} has no "{SIGNATURE_NAME}" signature and {len(predict)} predict '
        f"signatures among {sorted(signatures)}: /predict cannot choose; name one with "
        f"signature_name at /v1/models/{model}:predict"
    )


async def model_form(dataplane: DataPlane, name: str) -> ModelForm:
    """What /predict takes for a model and how it answers, from its serving version's
    signature.

    Raises:
        NotFound: no such model; NotReady: no version serves it; BadInput: no signature
            /predict can choose.
    """
    try:
        signature = await dataplane.signature(name, signature_name=SIGNATURE_NAME)
    except SignatureNotFound:
        metadata = await dataplane.metadata(name, None)
        signature = choose_signature(metadata.signatures, name)
    return describe(signature)


# Forms by the signature object they describe: a version's signatures are the same objects
# for as long as it serves, so a request finds its form without hashing the signature.
_FORMS: dict[int, tuple[SignatureSpec, ModelForm]] = {}
_FORMS_KEPT = 256


def describe(signature: SignatureSpec) -> ModelForm:
    """What /predict takes for a signature and how it answers (the module's docstring)."""
    known = _FORMS.get(id(signature))
    if known is not None and known[0] is signature:
        return known[1]
    kind, image, features = _input_kind(signature)
    task, fields = _task(signature)
    form = ModelForm(
        signature, kind, task, image, features, image_contract=_image_contract(signature), **fields
    )
    if len(_FORMS) >= _FORMS_KEPT:
        _FORMS.clear()
    _FORMS[id(signature)] = (signature, form)
    return form


def _image_contract(signature: SignatureSpec) -> bool:
    outputs = {spec.name: spec for spec in signature.outputs}
    classes, probabilities = outputs.get(CLASSES_KEY), outputs.get(PROBABILITIES_KEY)
    return (
        is_image_signature(signature)
        and classes is not None
        and classes.dtype is not None
        and classes.dtype.kind in "iu"
        and probabilities is not None
        and probabilities.dtype is not None
        and probabilities.dtype.kind == "f"
    )


def _input_kind(signature: SignatureSpec) -> tuple[str, ImageInput | None, tuple[Feature, ...]]:
    inputs = signature.inputs
    if len(inputs) == 1:
        (spec,) = inputs
        if spec.dtype is not None and spec.dtype.kind == "f":
            image = ImageInput.of_shape(spec.shape)
            if image is not None:
                return IMAGE, image, ()
        if (
            spec.name in EXAMPLE_INPUTS
            and spec.dtype == np.dtype(object)
            and spec.shape == (-1,)
            and signature.method_name in (CLASSIFY_METHOD, REGRESS_METHOD, PREDICT_METHOD)
        ):
            return EXAMPLES, None, ()
        if takes_image_bytes(spec):
            return IMAGE_BYTES, None, ()
    features = []
    for spec in inputs:
        shape = spec.shape
        if (
            not Feature.takes(spec.dtype)
            or not shape
            or shape[0] != -1
            or any(size < 1 for size in shape[1:])
        ):
            return TENSORS, None, ()
        features.append(Feature(spec.name, spec.dtype, tuple(shape[1:])))
    if not features:
        return TENSORS, None, ()
    return FEATURES, None, tuple(features)


def _is_float(spec: TensorSpec | None) -> bool:
    return spec is not None and spec.dtype is not None and spec.dtype.kind == "f"


def _is_integer(spec: TensorSpec | None) -> bool:
    return spec is not None and spec.dtype is not None and spec.dtype.kind in "iu"


def _is_strings(spec: TensorSpec | None) -> bool:
    return spec is not None and spec.dtype == np.dtype(object)


def _rows_of(spec: TensorSpec | None) -> int | None:
    """K of a [-1, K] output (K known and at least 1); None for any other shape."""
    if spec is None or spec.shape is None or len(spec.shape) != 2 or spec.shape[0] != -1:
        return None
    return spec.shape[1] if spec.shape[1] >= 1 else None


def _one_value(spec: TensorSpec | None) -> bool:
    """An output of one value per instance: [-1] or [-1, 1]."""
    return spec is not None and spec.shape in ((-1,), (-1, 1))


def _task(signature: SignatureSpec) -> tuple[str, dict]:
    outputs = {spec.name: spec for spec in signature.outputs}
    probabilities = None
    softmax_guess = False
    for key in (PROBABILITIES_KEY, CLASSIFY_SCORES):
        if _is_float(outputs.get(key)) and _rows_of(outputs[key]):
            probabilities = key
            break
    if probabilities is None and len(outputs) == 1:
        (only,) = outputs.values()
        if _is_float(only) and (_rows_of(only) or 0) >= 2:
            probabilities, softmax_guess = only.name, True
    if probabilities is not None:
        width = _rows_of(outputs[probabilities])
        class_names = next(
            (
                key
                for key in (ALL_CLASSES_KEY, CLASSES_KEY)
                if _is_strings(outputs.get(key)) and _rows_of(outputs[key]) == width
            ),
            None,
        )
        class_ids = next(
            (
                key
                for key in (CLASS_IDS_KEY, CLASSES_KEY)
                if _is_integer(outputs.get(key)) and _one_value(outputs[key])
            ),
            None,
        )
        return CLASSIFICATION, {
            "probabilities": probabilities,
            "class_names": class_names,
            "class_ids": class_ids,
            "softmax_guess": softmax_guess,
        }
    value = None
    if _is_float(outputs.get(PREDICTIONS_KEY)):
        value = PREDICTIONS_KEY
    elif signature.method_name == REGRESS_METHOD and _is_float(outputs.get(REGRESS_OUTPUTS)):
        value = REGRESS_OUTPUTS
    elif len(outputs) == 1:
        (only,) = outputs.values()
        if _is_float(only) and _one_value(only):
            value = only.name
    if value is not None:
        return REGRESSION, {"value": value}
    return OUTPUTS, {}


# --- showing the answer ------------------------------------------------------------------


def answer_rows(
    form: ModelForm, outputs: dict[str, np.ndarray], labels: tuple[str, ...]
) -> list | Any:
    """The answer's `predictions`: per instance, a classifier's class id, label and
    probabilities by label, or a regressor's value; otherwise the outputs as TF Serving
    renders them (row format).

    Args:
        labels: the version's class labels (its labels.txt, or what the backend falls back
            to); used when they name every class.
    Raises:
        BadInput: outputs TF Serving could not render in the row format (its words).
    """
    if form.image_contract:
        # Batch prediction's rows (artifact.contract), the version's labels as they are.
        return list(prediction_rows(outputs[CLASSES_KEY], outputs[PROBABILITIES_KEY], labels))
    if form.task == CLASSIFICATION and form.probabilities is not None:
        probabilities = outputs[form.probabilities]
        guessed_wrong = form.softmax_guess and output_problems({PROBABILITIES_KEY: probabilities})
        if not guessed_wrong and probabilities.ndim == 2:
            return _classification_rows(form, outputs, probabilities, labels)
        if guessed_wrong:
            # Not probabilities: values (a pre-made regressor's with label_dimension > 1).
            return value_rows(probabilities)
    if form.task == REGRESSION and form.value is not None and outputs[form.value].ndim >= 1:
        return value_rows(outputs[form.value])
    return render_outputs(outputs, columnar=False)[1]


def value_rows(value: np.ndarray) -> list[dict]:
    """A regressor's rows: per instance `value`, a number for one value ([-1] or [-1, 1]),
    else the instance's values as a list (nested lists for more dimensions)."""
    if value.ndim == 2 and value.shape[1] == 1:
        value = value[:, 0]
    return [{"value": item} for item in value]


def _classification_rows(form, outputs, probabilities, labels) -> list:
    width = probabilities.shape[1]
    ids = tuple(str(k) for k in range(width))
    class_ids = probabilities.argmax(axis=1)
    if form.class_ids is not None:
        given = outputs[form.class_ids].reshape(-1)
        # The model's own choice (a binary head's threshold), when it names one of the rows.
        if len(given) == len(probabilities) and (
            given.size == 0 or 0 <= given.min() <= given.max() < width
        ):
            class_ids = given
    fallback = tuple(labels) if len(labels) == width else ids
    if form.class_names is None:
        return list(prediction_rows(class_ids, probabilities, fallback))
    names = outputs[form.class_names]
    rows: list[dict] = []
    for i, row in enumerate(probabilities):
        row_names = tuple(text_of(item) for item in names[i])
        # A head without label_vocabulary names its classes by their ids: labels.txt says more.
        if row_names == ids:
            row_names = fallback
        rows.extend(prediction_rows(class_ids[i : i + 1], row[np.newaxis], row_names))
    return rows
