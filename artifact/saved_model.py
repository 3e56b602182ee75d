"""Load an exported version and run its serving signature fast (numpy in, numpy out)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import get_model_metadata_pb2

from artifact.contract import (
    CLASSES_KEY,
    DIGIT_LABELS,
    IMAGE_SHAPE,
    INPUT_KEY,
    NUM_CLASSES,
    PROBABILITIES_KEY,
    SIGNATURE_NAME,
    output_problems,
)
from artifact.repository import SAVED_MODEL_FILE

# TF's internal restore signature is not servable; TF Serving leaves it out too.
INIT_OP_SIGNATURE = "__saved_model_init_op"


def signature_def_map(version_path: str | Path) -> get_model_metadata_pb2.SignatureDefMap:
    """The version's SignatureDefMap proto (what TF Serving's GetModelMetadata returns)."""
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((Path(version_path) / SAVED_MODEL_FILE).read_bytes())
    result = get_model_metadata_pb2.SignatureDefMap()
    for name, signature in saved.meta_graphs[0].signature_def.items():
        if name != INIT_OP_SIGNATURE:
            result.signature_def[name].CopyFrom(signature)
    return result


class ModelInputError(ValueError):
    """Inputs the model refused while it ran (TensorFlow's InvalidArgumentError, or a value
    that does not bind to the signature): the client's to fix, in TensorFlow's words."""


# Signature inputs of these types cannot come from a request: no signature taking one serves.
_UNSERVABLE_TYPES = frozenset(
    {types_pb2.DT_RESOURCE, types_pb2.DT_VARIANT, types_pb2.DT_INVALID, types_pb2.DT_BFLOAT16}
)


class SavedModelPredictor:
    """A loaded SavedModel's signatures behind a cheap numpy call.

    Calling a signature as `sig(image=t)` costs 7-10 ms a call at batch 1 on TF 2.15, mostly
    TF formatting the input's repr() while it retries keyword binding; an outer tf.function
    with a fixed input signature binds once at trace time and costs 2-3 ms.

    Args:
        path: the version directory.
        device: a TF device string ('/CPU:0', '/GPU:0') to load and run on; None = TF's choice.
    Raises:
        ValueError: the SavedModel has no signature at all.
    """

    def __init__(self, path: str | Path, device: str | None = None):
        self.path = Path(path)
        self.device = device
        with tf.device(device):
            self._loaded = tf.saved_model.load(str(self.path))
        self.signatures = dict(self._loaded.signatures)
        # Read now, while the version's folder is there (it may be deleted while serving).
        self.signature_defs = signature_def_map(self.path)
        # signature name -> (its concrete function, its input names in order, their specs)
        self._runners: dict[str, tuple[Any, tuple[str, ...], dict[str, tf.TensorSpec]]] = {}
        if not self.signatures:
            raise ValueError("the SavedModel has no signatures: no request could use it")

    def input_spec(self, signature_name: str = SIGNATURE_NAME) -> dict[str, tf.TensorSpec]:
        """The named inputs one signature takes."""
        return dict(self.signatures[signature_name].structured_input_signature[1])

    def _runner(self, signature_name: str) -> tuple[Any, tuple[str, ...], dict[str, tf.TensorSpec]]:
        """(a concrete function taking the signature's inputs in order, their names)."""
        runner = self._runners.get(signature_name)
        if runner is None:
            signature = self.signatures[signature_name]
            specs = self.input_spec(signature_name)
            names = tuple(sorted(specs))
            # A concrete function, traced here once: calling it skips tf.function's dispatch
            # (0.9 ms instead of 1.3 ms a call at batch 1 here) and its retracing detector,
            # which counts every version's own trace of this same lambda as a retrace.
            function = tf.function(
                lambda *tensors: signature(**dict(zip(names, tensors, strict=True))),
                input_signature=[tf.TensorSpec(specs[n].shape, specs[n].dtype) for n in names],
                autograph=False,  # nothing to convert; spares a warning about the lambda
            ).get_concrete_function()
            runner = self._runners[signature_name] = (function, names, specs)
        return runner

    def run(
        self, inputs: np.ndarray | dict[str, np.ndarray], signature_name: str = SIGNATURE_NAME
    ) -> dict[str, np.ndarray]:
        """Every output of one signature.

        Args:
            inputs: each input of the signature by name, or one array for a signature that
                takes one input (float32 images [n, 28, 28] in [0, 1], for the contract's).
        Raises:
            KeyError: the SavedModel has no such signature.
            ModelInputError: the inputs do not fit the signature, or the model refused them.
        """
        if signature_name not in self.signatures:
            raise KeyError(signature_name)
        function, names, specs = self._runner(signature_name)
        if isinstance(inputs, np.ndarray):
            if len(names) != 1:
                raise ModelInputError(
                    f"signature {signature_name!r} takes {len(names)} inputs {list(names)}; "
                    "name each"
                )
            inputs = {names[0]: inputs}
        try:
            with tf.device(self.device):
                tensors = [tf.constant(inputs[n], specs[n].dtype) for n in names]
                outputs = function(*tensors)
        except tf.errors.InvalidArgumentError as err:
            raise ModelInputError(err.message) from err
        except (TypeError, ValueError) as err:
            raise ModelInputError(
                f"the inputs do not fit signature {signature_name!r}: {err}"
            ) from err
        return {key: outputs[key].numpy() for key in sorted(outputs)}

    def zero_inputs(self, signature_name: str) -> dict[str, np.ndarray] | None:
        """One all-zero instance of every input of a signature (empty strings for strings),
        unknown dimensions of size 1; None when an input's rank is unknown."""
        inputs = {}
        for name, spec in self.input_spec(signature_name).items():
            if spec.shape.rank is None:
                return None
            shape = [1 if size is None else size for size in spec.shape.as_list()]
            if spec.dtype == tf.string:
                inputs[name] = np.full(shape, b"", dtype=object)
            else:
                inputs[name] = np.zeros(shape, spec.dtype.as_numpy_dtype)
        return inputs

    def warm_up(self, requests=()) -> int:
        """Replay warmup PredictRequests (as TF Serving does on load); how many ran.

        Without any: one all-zero image through the default signature of a model with the
        image contract, and one all-zero instance through every signature of any other
        (a signature that refuses zeros, such as one parsing tf.Examples, is traced only).
        Either way the first call's tracing is paid here, before the version reports ready,
        and the answers are checked: a model is code, and one whose "probabilities" are not
        probabilities (out of [0, 1], or rows not summing to 1) must not serve.

        Raises:
            ValueError: a request does not fit the model, or an answer breaks the contract.
        """
        if not requests:
            if not contract_problems(self.signature_defs, DIGIT_LABELS):
                outputs = self.run(np.zeros((1, *IMAGE_SHAPE), np.float32))
                self._check_outputs(outputs, "zero image")
                return 0
            for signature_name in sorted(self.signatures):
                inputs = self.zero_inputs(signature_name)
                self._runner(signature_name)
                if inputs is None:
                    continue
                try:
                    outputs = self.run(inputs, signature_name)
                except ModelInputError:
                    continue  # zeros are not this signature's input; traced all the same
                self._check_outputs(outputs, f"a zero instance through {signature_name!r}")
            return 0
        for i, request in enumerate(requests):
            signature_name = request.model_spec.signature_name or SIGNATURE_NAME
            expected = (
                set(self.input_spec(signature_name)) if signature_name in self.signatures else None
            )
            if expected is None or set(request.inputs) != expected:
                raise ValueError(
                    f"warmup request {i} wants signature {signature_name!r} with inputs "
                    f"{sorted(request.inputs)}; the model has {sorted(self.signatures)}"
                    + (f", that one taking {sorted(expected)}" if expected is not None else "")
                )
            inputs = {key: tf.make_ndarray(proto) for key, proto in request.inputs.items()}
            try:
                outputs = self.run(inputs, signature_name)
            except ModelInputError as err:
                raise ValueError(f"warmup request {i} does not fit the model: {err}") from err
            self._check_outputs(outputs, f"warmup request {i}")
        return len(requests)

    @staticmethod
    def _check_outputs(outputs: dict[str, np.ndarray], what: str) -> None:
        problems = output_problems(outputs)
        if problems:
            raise ValueError(f"its answer to {what} breaks the contract: {'; '.join(problems)}")

    def predict(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """float32 [n, 28, 28] in [0, 1] -> (int64 classes [n], float32 probabilities [n, 10])."""
        outputs = self.run(images)
        return outputs[CLASSES_KEY], outputs[PROBABILITIES_KEY]

    def predict_batched(self, images: np.ndarray, batch_size: int = 500):
        """predict() over a large array in chunks; returns the concatenated outputs."""
        classes, probabilities = [], []
        for start in range(0, len(images), batch_size):
            c, p = self.predict(images[start : start + batch_size])
            classes.append(c)
            probabilities.append(p)
        return np.concatenate(classes), np.concatenate(probabilities)


def _dims(info) -> list[int] | None:
    """A TensorInfo's shape as a list (-1 for unknown dimensions); None for unknown rank."""
    if info.tensor_shape.unknown_rank:
        return None
    return [dim.size for dim in info.tensor_shape.dim]


def contract_problems(signature_defs, labels: tuple[str, ...]) -> list[str]:
    """What keeps an exported version from serving the contract; [] when nothing does.

    The serving signature must take one float32 `image` [-1, 28, 28] and give int64
    `classes` [-1] and float32 `probabilities` [-1, NUM_CLASSES], and the labels must name
    every class. A version that breaks it would answer some requests with errors (or wrong
    labels), so it must not serve at all.

    Args:
        signature_defs: the version's SignatureDefMap.
        labels: the class labels it answers with (labels.txt, or the digits).
    """
    signature = signature_defs.signature_def.get(SIGNATURE_NAME)
    if signature is None:
        names = sorted(signature_defs.signature_def)
        return [f"no {SIGNATURE_NAME!r} signature (it has {names})"]
    problems = []
    if set(signature.inputs) != {INPUT_KEY}:
        problems.append(
            f"{SIGNATURE_NAME} takes {sorted(signature.inputs)}; the contract is one input "
            f"{INPUT_KEY!r}"
        )
    else:
        image = signature.inputs[INPUT_KEY]
        dims = _dims(image)
        if image.dtype != types_pb2.DT_FLOAT:
            problems.append(
                f"input {INPUT_KEY!r} is {types_pb2.DataType.Name(image.dtype)}, not DT_FLOAT"
            )
        if dims is None or len(dims) != 3 or tuple(dims[1:]) != IMAGE_SHAPE:
            problems.append(f"input {INPUT_KEY!r} has shape {dims}, not [-1, 28, 28]")
    expected = {
        CLASSES_KEY: (types_pb2.DT_INT64, 1),
        PROBABILITIES_KEY: (types_pb2.DT_FLOAT, 2),
    }
    for key, (dtype, rank) in expected.items():
        info = signature.outputs.get(key)
        if info is None:
            problems.append(
                f"{SIGNATURE_NAME} has no {key!r} output (it has {sorted(signature.outputs)})"
            )
            continue
        dims = _dims(info)
        if info.dtype != dtype:
            problems.append(
                f"output {key!r} is {types_pb2.DataType.Name(info.dtype)}, not "
                f"{types_pb2.DataType.Name(dtype)}"
            )
        if dims is None or len(dims) != rank:
            problems.append(f"output {key!r} has shape {dims}, rank {rank} expected")
    probabilities = signature.outputs.get(PROBABILITIES_KEY)
    if probabilities is not None and (dims := _dims(probabilities)) and len(dims) == 2:
        classes = dims[1]
        if classes != NUM_CLASSES:
            problems.append(
                f"output {PROBABILITIES_KEY!r} has {classes} classes, not {NUM_CLASSES}"
            )
        if len(labels) != classes:
            problems.append(f"labels.txt names {len(labels)} classes; the model has {classes}")
    return problems


def signature_problems(signature_defs) -> dict[str, str]:
    """Why a signature cannot serve any request, by name (missing: it can)."""
    problems = {}
    for name, signature in sorted(signature_defs.signature_def.items()):
        bad = [
            f"{key} is {types_pb2.DataType.Name(info.dtype)}"
            for key, info in sorted(signature.inputs.items())
            if info.dtype in _UNSERVABLE_TYPES
        ]
        if bad:
            problems[name] = "takes what no request can send (" + ", ".join(bad) + ")"
    return problems


def servable_problems(signature_defs, labels: tuple[str, ...] | None) -> list[str]:
    """What keeps an exported version from serving at all; [] when nothing does.

    Any signature serves: the version is refused only when no signature could answer a
    request, or when its labels.txt (`labels`, None without one) does not name every class
    of a `probabilities` output (some answers would have no label).
    """
    names = sorted(signature_defs.signature_def)
    if not names:
        return ["no signatures (it has none a request could name)"]
    unusable = signature_problems(signature_defs)
    if len(unusable) == len(names):
        return [
            "no usable signature: "
            + "; ".join(f"{name} {problem}" for name, problem in unusable.items())
        ]
    problems = []
    if labels is not None:
        for name in names:
            info = signature_defs.signature_def[name].outputs.get(PROBABILITIES_KEY)
            dims = _dims(info) if info is not None else None
            if dims and len(dims) == 2 and dims[1] > 0 and dims[1] != len(labels):
                problems.append(f"labels.txt names {len(labels)} classes; the model has {dims[1]}")
                break
    return problems
