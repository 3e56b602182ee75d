"""tf.Example, for TF Serving's Classify and Regress on models exported with a parsing
receiver: tf.Examples built from JSON (REST's `examples` and `context`, the friendly
`/predict`'s instances) or taken from the request (gRPC), fed to the signature's
serialized-examples input, and the signature's outputs read as TF Serving reads them
(servables/tensorflow/classifier.cc, regressor.cc; util/json_tensor.cc).

tf.Example is written in its wire format (artifact/tf_example.py), so this module imports neither
TensorFlow nor its protos.
"""

from __future__ import annotations

import binascii
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from artifact.tf_example import encode_example
from service.codecs.values import b64_decode, is_b64, is_number, text_of
from service.errors import BadInput, check_image_count
from service.types import SignatureSpec

# The input and outputs TF Serving looks for (tensorflow/python/saved_model/signature_constants.py).
CLASSIFY_INPUTS = "inputs"
CLASSIFY_CLASSES = "classes"
CLASSIFY_SCORES = "scores"
REGRESS_OUTPUTS = "outputs"


# --- JSON examples ------------------------------------------------------------------------


def _feature_of_json(value: Any, where: str) -> tuple[str, list]:
    """A JSON feature value (a value or a list of them) as (kind, values), as TF Serving reads
    it: strings and {"b64": ...} are bytes, integers int64, any other number float."""
    values = value if isinstance(value, list) else [value]
    if not values:
        raise BadInput(f"{where}: a feature needs at least one value, got []")
    kinds = set()
    out: list[bytes | int | float] = []
    for i, item in enumerate(values):
        at = f"{where}[{i}]" if isinstance(value, list) else where
        if isinstance(item, str):
            kinds.add("bytes")
            out.append(item.encode("utf-8"))
        elif is_b64(item) and isinstance(item["b64"], str):
            kinds.add("bytes")
            try:
                out.append(b64_decode(item["b64"]))
            except binascii.Error as err:
                raise BadInput(f"Unable to base64 decode; {at}.b64: {err}") from err
        elif not is_number(item):
            raise BadInput(
                f'{at}: a feature\'s values are strings, {{"b64": ...}} or numbers, got '
                f"{type(item).__name__}"
            )
        elif isinstance(item, int):
            if not -(2**63) <= item < 2**63:
                raise BadInput(f"{at}: {item} does not fit int64")
            kinds.add("int64")
            out.append(item)
        else:
            kinds.add("float")
            out.append(item)
    if "bytes" in kinds and len(kinds) > 1:
        raise BadInput(f"{where}: a feature's values are all strings or all numbers, not both")
    kind = "bytes" if "bytes" in kinds else "float" if "float" in kinds else "int64"
    if kind == "float":
        out = [float(v) for v in out]
    return kind, out


def _features_of_json(value: Any, where: str) -> dict[str, tuple[str, list]]:
    if not isinstance(value, dict):
        raise BadInput(f"{where}: an example is an object of features, got {type(value).__name__}")
    return {name: _feature_of_json(item, f"{where}.{name}") for name, item in value.items()}


def example_of_json(features: Any, where: str) -> bytes:
    """One JSON object of features as a serialized tf.Example, read as TF Serving reads an
    example (strings and {"b64": ...} are bytes, integers int64, other numbers float).

    Raises:
        BadInput: not an object, or a feature no tf.Example can hold (named by `where`).
    """
    return encode_example(_features_of_json(features, where))


@dataclasses.dataclass(frozen=True)
class JSONExamples:
    """A REST :classify or :regress body's examples, counted and their context encoded, not
    yet serialized (`serialize`): what building them will hold is known first
    (`serialized_bytes`), so a small body cannot make the service build gigabytes.

    Attributes:
        context: the context's features as one serialized tf.Example (b"" without one).
        examples: the examples' JSON objects.
    """

    context: bytes
    examples: list

    def serialized_bytes(self) -> int:
        """A bound on what the context adds to the examples' own bytes: its copy in each."""
        return len(self.context) * len(self.examples)

    def serialize(self) -> list[bytes]:
        """Each example as a serialized tf.Example, after the context's bytes, as TF Serving
        builds them (servables/tensorflow/util.cc: the serialized context and the
        serialized example, concatenated): parsed, the example's own features win.

        Raises:
            BadInput: a feature no tf.Example can hold (named by its place).
        """
        context = self.context
        return [
            context + example_of_json(example, f"examples[{i}]")
            for i, example in enumerate(self.examples)
        ]


def json_examples(request: dict, max_examples: int) -> JSONExamples:
    """A REST :classify or :regress body's `examples` and `context`, counted and checked
    before any example is built.

    Raises:
        BadInput: no `examples` list, or a context no tf.Example can hold.
        PayloadTooLarge: more than max_examples examples.
    """
    examples = request.get("examples")
    if not isinstance(examples, list):
        raise BadInput(
            "Missing 'examples' key; the body must have an 'examples' list of objects "
            "(features by name), and may have a 'context' object merged into each"
        )
    if not examples:
        raise BadInput("'examples' is empty; send at least one example")
    check_image_count(len(examples), max_examples)
    context = request.get("context")
    return JSONExamples(
        example_of_json(context, "context") if context is not None else b"", examples
    )


def examples_from_json(request: dict, max_examples: int) -> list[bytes]:
    """A REST :classify or :regress body's `examples` (and `context`, merged into each) as
    serialized tf.Examples (json_examples, then serialize).

    Raises:
        BadInput: no `examples` list, or a feature no tf.Example can hold.
        PayloadTooLarge: more than max_examples examples.
    """
    return json_examples(request, max_examples).serialize()


def with_context(context: bytes, examples: list[bytes]) -> list[bytes]:
    """Serialized tf.Examples, each after a serialized context (gRPC's
    example_list_with_context), as TF Serving joins them."""
    return [context + example for example in examples]


# --- the signature and its outputs --------------------------------------------------------


def check_example_signature(
    signature: SignatureSpec | None, signature_name: str, kind: str, text: Callable[[], str]
) -> None:
    """What TF Serving 2.15 checks of a Classify or Regress signature with its default flags
    (servables/tensorflow/classifier.cc, regressor.cc), in its words.

    Args:
        kind: "classification" or "regression".
        text: the signature as TF Serving prints it in messages.
    Raises:
        BadInput: no such signature, or not one input `inputs` and the outputs it needs.
    """
    if signature is None:
        raise BadInput(f"No signature was found with the name: {signature_name}")
    inputs = {spec.name for spec in signature.inputs}
    outputs = {spec.name for spec in signature.outputs}
    if len(inputs) != 1:
        raise BadInput("Expected one input Tensor.")
    if kind == "classification":
        if len(outputs) not in (1, 2):
            raise BadInput(f"Expected one or two output Tensors, found {len(outputs)}")
        if CLASSIFY_INPUTS not in inputs:
            raise BadInput("No classification inputs found in SignatureDef: " + text())
        if not outputs & {CLASSIFY_CLASSES, CLASSIFY_SCORES}:
            raise BadInput(
                "Expected classification signature outputs to contain at least one of "
                '"classes" or "scores". Signature was: ' + text()
            )
    else:
        if len(outputs) != 1:
            raise BadInput("Expected one output Tensor.")
        if CLASSIFY_INPUTS not in inputs:
            raise BadInput("No regression inputs found in SignatureDef: " + text())
        if REGRESS_OUTPUTS not in outputs:
            raise BadInput("No regression outputs found in SignatureDef: " + text())
    (spec,) = signature.inputs
    if spec.dtype != np.dtype(object):
        raise BadInput(
            f"signature {signature_name!r} takes {spec.dtype} '{CLASSIFY_INPUTS}', not "
            "serialized tf.Examples: use Predict"
        )


def example_inputs(serialized: list[bytes], name: str = CLASSIFY_INPUTS) -> dict[str, np.ndarray]:
    """Serialized tf.Examples as the signature's input (`inputs`, Classify's and Regress's)."""
    array = np.empty(len(serialized), dtype=object)
    array[:] = serialized
    return {name: array}


def instance_examples(instances: list) -> list[bytes]:
    """The friendly /predict's instances, each a JSON object of features, as serialized
    tf.Examples (read as TF Serving reads `:classify` examples).

    Raises:
        BadInput: an instance that is not an object of features, a value no tf.Example holds.
    """
    return [example_of_json(instance, f"instances[{i}]") for i, instance in enumerate(instances)]


def classifications(outputs: dict[str, np.ndarray], count: int) -> list[list[tuple[str, float]]]:
    """Each example's (label, score) pairs, as TF Serving pairs the classes and scores outputs
    (a missing one: empty labels, or zero scores).

    Raises:
        BadInput: an output of another batch size than the examples (TF Serving's words).
    """
    classes, scores = outputs.get(CLASSIFY_CLASSES), outputs.get(CLASSIFY_SCORES)
    for name, value in ((CLASSIFY_CLASSES, classes), (CLASSIFY_SCORES, scores)):
        if value is not None and (value.ndim != 2 or len(value) != count):
            raise BadInput(
                f"Expected {name} Tensor of shape [batch_size num_classes] with batch_size "
                f"{count}; got {list(value.shape)}"
            )
    listed = classes if classes is not None else scores
    if listed is None:
        raise BadInput(
            "Expected classification outputs to contain at least one of "
            f'"{CLASSIFY_CLASSES}" or "{CLASSIFY_SCORES}"; got {sorted(outputs)}'
        )
    width = listed.shape[1]
    results = []
    for i in range(count):
        row = []
        for j in range(width):
            label = text_of(classes[i, j]) if classes is not None else ""
            row.append((label, float(scores[i, j]) if scores is not None else 0.0))
        results.append(row)
    return results


def regressions(outputs: dict[str, np.ndarray], count: int) -> list[float]:
    """Each example's regressed value (the `outputs` output, [batch] or [batch, 1]).

    Raises:
        BadInput: an output of another shape (TF Serving's words).
    """
    value = outputs[REGRESS_OUTPUTS]
    if value.ndim == 2 and value.shape[1] == 1:
        value = value[:, 0]
    if value.ndim != 1 or len(value) != count:
        raise BadInput(
            f"Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but "
            f"got {list(outputs[REGRESS_OUTPUTS].shape)}"
        )
    return [float(v) for v in value]
