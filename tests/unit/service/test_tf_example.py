"""Classify and Regress without TensorFlow (service/codecs/tf_example.py): tf.Example's wire
format, TF Serving's JSON `examples` and `context`, its checks of the signature and its
reading of the outputs.

Fast tier (served against tf.saved_model.load: tests/live/service/test_any_signature.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from artifact.tf_example import decode_example
from service.codecs import tf_example
from service.errors import BadInput, PayloadTooLarge
from service.types import SignatureSpec, TensorSpec

STRING, FLOAT = np.dtype(object), np.dtype(np.float32)


def test_an_example_in_protobufs_wire_format():
    # Example{features{feature{key: "a" value{int64_list{value: [1]}}}}}, values packed.
    assert tf_example.encode_example({"a": ("int64", [1])}) == bytes.fromhex(
        "0a0c" "0a0a" "0a0161" "1205" "1a03" "0a0101"
    )  # fmt: skip
    assert tf_example.encode_example({"x": ("float", [0.5])}) == bytes.fromhex(
        "0a0f" "0a0d" "0a0178" "1208" "1206" "0a04" "0000003f"
    )  # fmt: skip
    negative = tf_example.encode_example({"n": ("int64", [-1])})
    assert negative.endswith(bytes.fromhex("ffffffffffffffffff01"))


def test_json_examples_take_their_kinds_and_the_context():
    body = {"context": {"city": "a", "rooms": 2}, "examples": [{"x": 1.5}, {"x": 2, "rooms": 3}]}
    first, second = tf_example.examples_from_json(body, 10)
    assert decode_example(first) == {
        "city": ("bytes", [b"a"]),
        "rooms": ("int64", [2]),
        "x": ("float", [1.5]),
    }
    # The example's own feature wins over the context's; 2 stays an integer.
    assert decode_example(second) == {
        "city": ("bytes", [b"a"]),
        "rooms": ("int64", [3]),
        "x": ("int64", [2]),
    }
    # As TF Serving builds them: the serialized context, then the serialized example.
    context = tf_example.encode_example({"city": ("bytes", [b"a"]), "rooms": ("int64", [2])})
    assert second == context + tf_example.encode_example(
        {"rooms": ("int64", [3]), "x": ("int64", [2])}
    )
    (b64,) = tf_example.examples_from_json({"examples": [{"img": {"b64": "/w=="}}]}, 10)
    assert b64 == tf_example.encode_example({"img": ("bytes", [b"\xff"])})


@pytest.mark.parametrize("body, expected", [
    pytest.param({}, "Missing 'examples' key", id="none"),
    pytest.param({"examples": []}, "'examples' is empty", id="empty"),
    pytest.param({"examples": [[1]]}, "examples[0]: an example is an object of features", id="list"),
    pytest.param({"examples": [{"a": True}]}, "examples[0].a: a feature's values are strings",
                 id="bool"),
    pytest.param({"examples": [{"a": ["x", 1]}]}, "all strings or all numbers", id="mixed"),
    pytest.param({"examples": [{"a": []}]}, "needs at least one value", id="no-values"),
    pytest.param({"examples": [{"a": {"b64": "!"}}]}, "Unable to base64 decode", id="b64"),
])  # fmt: skip
def test_bad_examples_are_named(body, expected):
    with pytest.raises(BadInput) as caught:
        tf_example.examples_from_json(body, 10)
    assert expected in caught.value.message


def test_too_many_examples():
    with pytest.raises(PayloadTooLarge):
        tf_example.examples_from_json({"examples": [{"a": 1}] * 3}, 2)


def signature(inputs, outputs, dtype=STRING) -> SignatureSpec:
    return SignatureSpec(
        "s",
        "tensorflow/serving/classify",
        tuple(TensorSpec(name, dtype, (-1,)) for name in inputs),
        tuple(TensorSpec(name, FLOAT, (-1, 3)) for name in outputs),
    )


@pytest.mark.parametrize("spec, kind, expected", [
    pytest.param(None, "classification", "No signature was found with the name: s", id="none"),
    pytest.param(signature(["a", "b"], ["scores"]), "classification", "Expected one input Tensor.",
                 id="two-inputs"),
    pytest.param(signature(["image"], ["scores"]), "classification",
                 "No classification inputs found in SignatureDef: <sig>", id="not-inputs"),
    pytest.param(signature(["inputs"], ["logits"]), "classification",
                 'at least one of "classes" or "scores". Signature was: <sig>', id="no-scores"),
    pytest.param(signature(["inputs"], ["a", "b"]), "regression", "Expected one output Tensor.",
                 id="regress-two"),
    pytest.param(signature(["inputs"], ["values"]), "regression",
                 "No regression outputs found in SignatureDef: <sig>", id="regress-name"),
    pytest.param(signature(["inputs"], ["outputs"], FLOAT), "regression",
                 "not serialized tf.Examples: use Predict", id="not-strings"),
])  # fmt: skip
def test_the_signature_is_checked_in_tf_servings_words(spec, kind, expected):
    with pytest.raises(BadInput) as caught:
        tf_example.check_example_signature(spec, "s", kind, lambda: "<sig>")
    assert expected in caught.value.message


def test_classes_and_scores_pair_up_and_regressions_flatten():
    outputs = {
        "classes": np.array([[b"a", b"b"]], object),
        "scores": np.array([[0.25, 0.75]], np.float32),
    }
    assert tf_example.classifications(outputs, 1) == [[("a", 0.25), ("b", 0.75)]]
    assert tf_example.classifications({"scores": outputs["scores"]}, 1) == [
        [("", 0.25), ("", 0.75)]
    ]
    with pytest.raises(BadInput, match="batch_size 2"):
        tf_example.classifications(outputs, 2)
    with pytest.raises(
        BadInput, match=r"at least one of \"classes\" or \"scores\"; got \['probabilities'\]"
    ):
        tf_example.classifications({"probabilities": outputs["scores"]}, 1)
    assert tf_example.regressions({"outputs": np.array([[1.5], [2.5]], np.float32)}, 2) == [
        1.5,
        2.5,
    ]
    with pytest.raises(BadInput, match=r"\[batch_size\] or \[batch_size, 1\]"):
        tf_example.regressions({"outputs": np.zeros((2, 2), np.float32)}, 2)
