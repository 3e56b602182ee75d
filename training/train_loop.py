"""Training to a step: tf.estimator.train_and_evaluate with the progress display, a NaN or Inf
turned into NumericsError naming the checkpoint that is good (IDX `train`, `retrain`)."""

from __future__ import annotations

import re

import tensorflow as tf

from training import runs
from training.errors import NumericsError
from training.hooks import ProgressHook

# check_numerics' message: "<tensor name> : Tensor had NaN values".
_NUMERICS_FAILURE = re.compile(r"(\S+) : Tensor had (NaN|Inf|Inf and NaN) values")


def numerics_failure(err) -> str | None:
    """'logits : Tensor had NaN values' from a check_numerics failure, else None."""
    found = _NUMERICS_FAILURE.search(getattr(err, "message", str(err)))
    return found.group(0) if found else None


def train_and_evaluate(
    estimator,
    train_input,
    eval_input,
    max_steps: int,
    model_dir,
    batch_size: int,
    eval_every_secs: int,
    label: str = "train",
) -> None:
    """tf.estimator.train_and_evaluate to max_steps with the progress display, evaluating on
    eval_input at most every eval_every_secs; a NaN turned into NumericsError.

    Raises:
        NumericsError: --check-numerics stopped a step, or the loss became NaN (the message
            says which checkpoint is good).
    """
    try:
        tf.estimator.train_and_evaluate(
            estimator,
            tf.estimator.TrainSpec(
                train_input,
                max_steps=max_steps,
                hooks=[ProgressHook(max_steps, batch_size, label=label)],
            ),
            tf.estimator.EvalSpec(
                eval_input,
                steps=None,
                start_delay_secs=0,
                throttle_secs=eval_every_secs,
            ),
        )
    except tf.errors.InvalidArgumentError as err:
        problem = numerics_failure(err)
        if problem is None:
            raise
        raise NumericsError(
            f"--check-numerics stopped training: {problem}; the last checkpoint "
            f"(step {runs.latest_step(model_dir)}) in {model_dir} is kept"
        ) from err
    except tf.estimator.NanLossDuringTrainingError as err:
        # The Estimator's own NanTensorHook looks at the loss only, after the update ran, and
        # after a checkpoint of that very step may have been saved.
        latest, finite = runs.latest_step(model_dir), runs.newest_finite_checkpoint(model_dir)
        state = (
            f"the last checkpoint (step {latest}) in {model_dir} is kept"
            if finite and finite[1] == latest
            else f"the latest checkpoint (step {latest}) in {model_dir} already holds NaN/Inf "
            + (f"weights; the newest finite one is {finite[0]}" if finite else "weights")
        )
        raise NumericsError(
            f"the loss became NaN and training stopped; {state}; --check-numerics names the "
            "first tensor that goes bad and stops the step before its update"
        ) from err
