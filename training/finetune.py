"""Fine-tuning from a pretrained checkpoint, the two ways tf.estimator offers.

- Warm start (`--warm-start-from CKPT_OR_DIR [--warm-start-vars REGEX]`):
  `tf.estimator.WarmStartSettings`; the Estimator initialises the trainable variables whose
  names match REGEX (from the start of the name, TensorFlow's rule) from the checkpoint's
  variables of the same names.
- Scoped restore (`--fine-tune-from CKPT --fine-tune-scopes conv1,conv2`): a
  `tf.compat.v1.train.Scaffold(init_fn=...)` whose init_fn restores only the variables under
  those scopes. A scope is one or more whole name components anywhere in a variable's name,
  so `conv1` is `cnn/conv1/...` in the CNN and `keras/conv1/...` in the Keras CNN; a variable is
  restored from the checkpoint variable of the same name or, failing that, of the same name
  from the scope on, so either CNN can fine-tune from the other's checkpoint.
  (`init_from_checkpoint` with a scope mapping silently restores nothing for Keras layers'
  variables in TF 2.15; a Saver over the variable objects does not.)

Both act only when a run starts: a model dir that already holds a checkpoint resumes from it
(the Scaffold's init_fn and the warm start are skipped by design).
"""

from __future__ import annotations

import re
from pathlib import Path

import tensorflow as tf

from training.errors import UsageError


def resolve_checkpoint(path: str, option: str) -> str:
    """The checkpoint prefix `path` names: itself, or a directory's latest checkpoint.

    Every tensor is read once, so a truncated or corrupt checkpoint fails here, before
    anything is written.

    Raises:
        UsageError: no checkpoint there, or it cannot be read.
    """
    directory = Path(path)
    prefix = str(path)
    if directory.is_dir():
        prefix = tf.train.latest_checkpoint(str(directory))
        if prefix is None:
            raise UsageError(f"{option} {path}: the directory holds no checkpoint")
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    # A truncated data file surfaces as IndexError ("Read less bytes than requested").
    except (tf.errors.OpError, ValueError, IndexError, OSError) as err:
        detail = (getattr(err, "message", None) or str(err)).strip().splitlines()[0]
        raise UsageError(f"{option} {path}: not a readable checkpoint ({detail})") from err
    return prefix


def checkpoint_shapes(checkpoint: str) -> dict[str, list[int]]:
    """Variable name -> shape of every variable in a checkpoint."""
    return {name: list(shape) for name, shape in tf.train.list_variables(checkpoint)}


def _scopes_of(names) -> str:
    return ", ".join(sorted({name.rsplit("/", 1)[0] for name in names if "/" in name}))


def warm_start_settings(
    checkpoint: str, regex: str, graph_shapes: dict[str, list[int]]
) -> tf.estimator.WarmStartSettings:
    """WarmStartSettings for the model's trainable variables matching regex.

    Args:
        checkpoint: a resolved checkpoint prefix.
        regex: matched from the start of each trainable variable's name (TF's rule).
        graph_shapes: the model's trainable variables, name -> shape.
    Raises:
        UsageError: a bad regex, one matching no variable, or a matched variable the
            checkpoint lacks or holds with another shape.
    """
    try:
        pattern = re.compile(regex)
    except re.error as err:
        raise UsageError(f"--warm-start-vars {regex!r}: not a regular expression ({err})") from err
    # TF filters the trainable-variables collection with re.match on names like "a/b:0".
    matched = [name for name in graph_shapes if pattern.match(name + ":0")]
    if not matched:
        raise UsageError(
            f"--warm-start-vars {regex!r} matches no variable of this model; its variables "
            f"lie under: {_scopes_of(graph_shapes)}"
        )
    available = checkpoint_shapes(checkpoint)
    for name in matched:
        if name not in available:
            raise UsageError(
                f"--warm-start-from {checkpoint}: has no variable {name} (it has variables "
                f"under {_scopes_of(available)}); narrow --warm-start-vars"
            )
        if available[name] != graph_shapes[name]:
            raise UsageError(
                f"--warm-start-from {checkpoint}: {name} has shape {available[name]}, "
                f"the model's is {graph_shapes[name]}"
            )
    return tf.estimator.WarmStartSettings(checkpoint, vars_to_warm_start=regex)


def scope_key(name: str, scope: str) -> str | None:
    """The part of a variable name from the scope on, or None when it is not under it.

    'cnn/conv1/kernel' under 'conv1' -> 'conv1/kernel'; under 'cnn' -> 'cnn/conv1/kernel'.
    """
    parts = name.split("/")
    scope_parts = scope.strip("/").split("/")
    width = len(scope_parts)
    for start in range(len(parts) - width + 1):
        if parts[start : start + width] == scope_parts:
            return "/".join(parts[start:])
    return None


def plan_restore(
    graph_shapes: dict[str, list[int]],
    checkpoint_shapes: dict[str, list[int]],
    scopes: list[str],
) -> dict[str, str]:
    """Which checkpoint variable each model variable under the scopes is restored from.

    Returns:
        model variable name -> checkpoint variable name.
    Raises:
        UsageError: a scope matches no model variable, or a matched variable has no
            counterpart of the same shape in the checkpoint.
    """
    plan = {}
    for scope in scopes:
        matched = [name for name in graph_shapes if scope_key(name, scope)]
        if not matched:
            raise UsageError(
                f"--fine-tune-scopes: {scope!r} matches no variable of this model; its "
                f"variables lie under: {_scopes_of(graph_shapes)}"
            )
        for name in matched:
            key = scope_key(name, scope)
            if name in checkpoint_shapes:
                source = name
            else:
                sources = [c for c in checkpoint_shapes if scope_key(c, scope) == key]
                if len(sources) != 1:
                    raise UsageError(
                        f"--fine-tune-scopes {scope}: the checkpoint has no variable for "
                        f"{name} (looked for {name} and .../{key}); it has variables under "
                        f"{_scopes_of(checkpoint_shapes)}"
                    )
                source = sources[0]
            if checkpoint_shapes[source] != graph_shapes[name]:
                raise UsageError(
                    f"--fine-tune-scopes {scope}: {source} in the checkpoint has shape "
                    f"{checkpoint_shapes[source]}, the model's {name} is {graph_shapes[name]}"
                )
            plan[name] = source
    return plan


def fine_tune_scaffold(checkpoint: str, scopes: list[str], base=None):
    """A Scaffold whose init_fn restores only the scoped variables (call inside a model_fn).

    The other variables keep their initializers. The Estimator calls init_fn only when it
    initialises a new model (no checkpoint in model_dir yet); on the chief alone when
    distributed.

    Args:
        checkpoint: a resolved checkpoint prefix.
        scopes: scope names (see scope_key).
        base: the model_fn's own Scaffold, whose other fields are kept.
    """
    variables = {v.op.name: v for v in tf.compat.v1.trainable_variables()}
    plan = plan_restore(
        {name: v.shape.as_list() for name, v in variables.items()},
        checkpoint_shapes(checkpoint),
        scopes,
    )
    saver = tf.compat.v1.train.Saver(
        {source: variables[name] for name, source in plan.items()}, name="fine_tune_saver"
    )

    def init_fn(scaffold, session):
        saver.restore(session, checkpoint)

    return tf.compat.v1.train.Scaffold(init_fn=init_fn, copy_from_scaffold=base)
