"""The serving contract checked at load (artifact.saved_model.contract_problems), case by case,
on SignatureDefMap protos as TF Serving's GetModelMetadata carries them.

Slow tier: the protos import TensorFlow (seconds). The end-to-end cases (a version with no
`classes` output, a labels.txt with three lines, never serving) are in
tests/live/service/test_reliability.py.
"""

from __future__ import annotations

import pytest

LABELS = tuple(str(i) for i in range(10))


def signature_map(inputs=None, outputs=None, name: str = "serving_default"):
    """A SignatureDefMap with one signature: the contract's, or these inputs and outputs."""
    from tensorflow.core.framework import types_pb2
    from tensorflow.core.protobuf import meta_graph_pb2
    from tensorflow_serving.apis import get_model_metadata_pb2

    def info(dtype, dims):
        tensor = meta_graph_pb2.TensorInfo(name="t:0", dtype=getattr(types_pb2, dtype))
        if dims is None:
            tensor.tensor_shape.unknown_rank = True
        for size in dims or ():
            tensor.tensor_shape.dim.add().size = size
        return tensor

    inputs = {"image": ("DT_FLOAT", [-1, 28, 28])} if inputs is None else inputs
    outputs = (
        {"classes": ("DT_INT64", [-1]), "probabilities": ("DT_FLOAT", [-1, 10])}
        if outputs is None
        else outputs
    )
    result = get_model_metadata_pb2.SignatureDefMap()
    signature = result.signature_def[name]
    for key, (dtype, dims) in inputs.items():
        signature.inputs[key].CopyFrom(info(dtype, dims))
    for key, (dtype, dims) in outputs.items():
        signature.outputs[key].CopyFrom(info(dtype, dims))
    return result


def problems(*args, labels=LABELS, **kwargs) -> list[str]:
    from artifact.saved_model import contract_problems

    return contract_problems(signature_map(*args, **kwargs), labels)


def test_the_contract_itself_has_no_problem():
    assert problems() == []


CLASSES = ("DT_INT64", [-1])
PROBABILITIES = ("DT_FLOAT", [-1, 10])


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        pytest.param({"name": "predict"}, "no 'serving_default' signature (it has ['predict'])",
                     id="no-serving-signature"),
        pytest.param({"inputs": {"x": ("DT_FLOAT", [-1, 28, 28])}},
                     "serving_default takes ['x']; the contract is one input 'image'",
                     id="wrong-input-key"),
        pytest.param({"inputs": {"image": ("DT_FLOAT", [-1, 28, 28]),
                                 "extra": ("DT_FLOAT", [-1])}},
                     "serving_default takes ['extra', 'image']", id="two-inputs"),
        pytest.param({"inputs": {"image": ("DT_DOUBLE", [-1, 28, 28])}},
                     "input 'image' is DT_DOUBLE, not DT_FLOAT", id="input-dtype"),
        pytest.param({"inputs": {"image": ("DT_FLOAT", [-1, 784])}},
                     "input 'image' has shape [-1, 784], not [-1, 28, 28]", id="input-flat"),
        pytest.param({"inputs": {"image": ("DT_FLOAT", None)}},
                     "input 'image' has shape None", id="input-unknown-rank"),
        pytest.param({"outputs": {"probabilities": PROBABILITIES}},
                     "serving_default has no 'classes' output (it has ['probabilities'])",
                     id="no-classes"),
        pytest.param({"outputs": {"classes": ("DT_STRING", [-1]), "probabilities": PROBABILITIES}},
                     "output 'classes' is DT_STRING, not DT_INT64", id="string-classes"),
        pytest.param({"outputs": {"classes": CLASSES, "probabilities": ("DT_FLOAT", [-1])}},
                     "output 'probabilities' has shape [-1], rank 2 expected",
                     id="probabilities-rank"),
        pytest.param({"outputs": {"classes": CLASSES, "probabilities": ("DT_FLOAT", [-1, 5])}},
                     "output 'probabilities' has 5 classes, not 10", id="five-classes"),
    ],
)  # fmt: skip
def test_each_way_to_break_the_contract_is_named(kwargs, expected):
    found = problems(**kwargs)
    assert any(expected in problem for problem in found), found


def test_labels_must_name_every_class():
    found = problems(labels=("a", "b", "c"))
    assert found == ["labels.txt names 3 classes; the model has 10"]
