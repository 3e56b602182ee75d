"""Fine-tuning: WarmStartSettings and a Scaffold init_fn restoring chosen scopes; bad input.

A new run's step-0 checkpoint holds the variables as the run initialised them, before any
update: restored ones must equal the source checkpoint's, the others must not.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from support.helpers import assert_one_error_line
from support.training_harness import call_main, checkpoint_step

from training.errors import UsageError
from training.finetune import plan_restore, resolve_checkpoint, scope_key

CNN_LAYERS = ("conv1", "conv2", "dense1", "logits")


def initial_values(model_dir: Path) -> dict[str, np.ndarray]:
    """The variables of a run's step-0 checkpoint (as initialised, before any update)."""
    reader = tf.train.load_checkpoint(str(model_dir / "model.ckpt-0"))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def source_values(model_dir: Path) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def new_run(tmp_path, data_dir, *extra, model="cnn", steps=1) -> tuple[int, Path]:
    model_dir = tmp_path / "tuned"
    code = call_main("train", "--model", model, "--data-dir", data_dir, "--model-dir", model_dir,
                     "--max-steps", steps, "--batch-size", 50, "--seed", 7, "--no-export",
                     "--hooks", "none", "--labels", "fashion", *extra)  # fmt: skip
    return code, model_dir


def assert_restored(
    new, source, restored_layers, fresh_layers, prefix="cnn/", source_prefix="cnn/"
):
    for layer in restored_layers:
        for part in ("kernel", "bias"):
            np.testing.assert_array_equal(
                new[f"{prefix}{layer}/{part}"], source[f"{source_prefix}{layer}/{part}"]
            )
    for layer in fresh_layers:
        # Re-initialised (biases start at zero, so compare the kernels).
        assert not np.allclose(
            new[f"{prefix}{layer}/kernel"], source[f"{source_prefix}{layer}/kernel"]
        )


# ---------------------------------------------------------------------------------------------
# The real thing, through the command line.


def test_fine_tune_scopes_restore_only_those_layers(tmp_path, trained_model, capsys):
    source = trained_model.model_dir
    code, model_dir = new_run(tmp_path, trained_model.data_dir, "--fine-tune-from", source,
                              "--fine-tune-scopes", "conv1,conv2")  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Fine-tuning: 4 variables under conv1,conv2 restored from" in out
    assert checkpoint_step(model_dir) == 1
    assert_restored(
        initial_values(model_dir), source_values(trained_model.model_dir),
        ("conv1", "conv2"), ("dense1", "logits"),
    )  # fmt: skip
    params = json.loads((model_dir / "params.json").read_text())
    assert params["fine_tune_scopes"] == ["conv1", "conv2"]
    assert params["fine_tune_from"] == tf.train.latest_checkpoint(str(trained_model.model_dir))


def test_warm_start_restores_the_matching_variables(tmp_path, trained_model, capsys):
    source = trained_model.model_dir
    code, model_dir = new_run(tmp_path, trained_model.data_dir, "--warm-start-from", source,
                              "--warm-start-vars", "cnn/(conv1|dense1)")  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 0, err
    assert_restored(
        initial_values(model_dir), source_values(trained_model.model_dir),
        ("conv1", "dense1"), ("conv2", "logits"),
    )  # fmt: skip


def test_keras_cnn_fine_tunes_from_the_custom_cnn_checkpoint(tmp_path, trained_model, capsys):
    """Scopes match by layer: the Keras CNN's keras/conv1/... takes the CNN's cnn/conv1/..."""
    code, model_dir = new_run(tmp_path, trained_model.data_dir, "--fine-tune-from",
                              trained_model.model_dir, "--fine-tune-scopes", "conv1",
                              model="keras")  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 0, err
    assert_restored(
        initial_values(model_dir), source_values(trained_model.model_dir),
        ("conv1",), ("conv2", "dense1", "logits"), prefix="keras/",
    )  # fmt: skip


def test_resuming_a_fine_tuned_run_does_not_restore_again(tmp_path, trained_model, capsys):
    code, model_dir = new_run(tmp_path, trained_model.data_dir, "--fine-tune-from",
                              trained_model.model_dir, "--fine-tune-scopes", "conv1")  # fmt: skip
    assert code == 0
    after_one_step = source_values(model_dir)
    capsys.readouterr()
    code, _ = new_run(tmp_path, trained_model.data_dir, "--fine-tune-from",
                      trained_model.model_dir, "--fine-tune-scopes", "conv1", steps=2)  # fmt: skip
    out, _ = capsys.readouterr()
    assert code == 0
    assert "already holds a checkpoint (step 1): resuming from it" in out
    # Step 2 continued from step 1's weights, not from the source checkpoint's.
    resumed = source_values(model_dir)
    assert checkpoint_step(model_dir) == 2
    source = source_values(trained_model.model_dir)
    assert not np.array_equal(resumed["cnn/conv1/kernel"], source["cnn/conv1/kernel"])
    assert not np.array_equal(resumed["cnn/conv1/kernel"], after_one_step["cnn/conv1/kernel"])
    # params.json still says where the run came from.
    assert json.loads((model_dir / "params.json").read_text())["fine_tune_scopes"] == ["conv1"]


# ---------------------------------------------------------------------------------------------
# Bad input: exit code 2, one line, the model dir never created.


def unreadable_missing(tmp, source):
    return ["--fine-tune-from", tmp / "nowhere", "--fine-tune-scopes", "conv1"], "not a readable"


def unreadable_empty_dir(tmp, source):
    (tmp / "empty").mkdir()
    return ["--warm-start-from", tmp / "empty"], "the directory holds no checkpoint"


def unreadable_garbage(tmp, source):
    (tmp / "junk.index").write_bytes(b"not a checkpoint index")
    (tmp / "junk.data-00000-of-00001").write_bytes(b"x" * 100)
    return ["--fine-tune-from", tmp / "junk", "--fine-tune-scopes", "conv1"], "not a readable"


def unreadable_truncated_data(tmp, source):
    copy = tmp / "copy"
    shutil.copytree(source, copy)
    prefix = tf.train.latest_checkpoint(str(copy))
    data = Path(prefix + ".data-00000-of-00001")
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    return ["--warm-start-from", copy], "not a readable checkpoint"


def scopes_matching_nothing(tmp, source):
    return ["--fine-tune-from", source, "--fine-tune-scopes", "conv1,conv9"], (
        "--fine-tune-scopes: 'conv9' matches no variable of this model; its variables lie "
        "under: cnn/conv1, cnn/conv2, cnn/dense1, cnn/logits"
    )


def partial_scope_name(tmp, source):
    # A scope is whole name components: "conv" is not "conv1".
    return ["--fine-tune-from", source, "--fine-tune-scopes", "conv"], "'conv' matches no variable"


def warm_start_regex_matching_nothing(tmp, source):
    return ["--warm-start-from", source, "--warm-start-vars", "conv.*"], (
        "--warm-start-vars 'conv.*' matches no variable of this model"
    )


def warm_start_bad_regex(tmp, source):
    return ["--warm-start-from", source, "--warm-start-vars", "cnn/(conv"], "not a regular"


def scopes_without_source(tmp, source):
    return ["--fine-tune-scopes", "conv1"], "--fine-tune-scopes needs --fine-tune-from"


def source_without_scopes(tmp, source):
    return ["--fine-tune-from", source], "--fine-tune-from needs --fine-tune-scopes"


def other_architecture(tmp, source):
    # A DNN's checkpoint has nothing under the CNN's scopes.
    return ["--fine-tune-from", source, "--fine-tune-scopes", "dense1"], (
        "the checkpoint has no variable for cnn/dense1/kernel"
    )


BAD = [
    pytest.param(unreadable_missing, id="unreadable_missing"),
    pytest.param(unreadable_empty_dir, id="unreadable_empty_dir"),
    pytest.param(unreadable_garbage, id="unreadable_garbage"),
    pytest.param(unreadable_truncated_data, id="unreadable_truncated_data"),
    pytest.param(scopes_matching_nothing, id="scopes_matching_nothing"),
    pytest.param(partial_scope_name, id="partial_scope_name"),
    pytest.param(warm_start_regex_matching_nothing, id="warm_start_regex_matching_nothing"),
    pytest.param(warm_start_bad_regex, id="warm_start_bad_regex"),
    pytest.param(scopes_without_source, id="scopes_without_source"),
    pytest.param(source_without_scopes, id="source_without_scopes"),
    pytest.param(other_architecture, id="other_architecture"),
]


@pytest.mark.parametrize("build", BAD)
def test_bad_fine_tuning_exits_2_writing_nothing(tmp_path, trained_model, request, capsys, build):
    source = trained_model.model_dir
    if build is other_architecture:
        # Only this case needs the (costly) run of every model kind.
        source = request.getfixturevalue("comparison").work_dir / "dnn"
    extra, message = build(tmp_path, source)
    code, model_dir = new_run(tmp_path, trained_model.data_dir, *extra)
    _, err = capsys.readouterr()
    assert code == 2
    assert_one_error_line(err, message)
    assert not model_dir.exists()


# ---------------------------------------------------------------------------------------------
# The matching rules, directly.


@pytest.mark.parametrize(
    "name, scope, key",
    [
        ("cnn/conv1/kernel", "conv1", "conv1/kernel"),
        ("cnn/conv1/kernel", "cnn/conv1", "cnn/conv1/kernel"),
        ("cnn/conv1/kernel", "cnn", "cnn/conv1/kernel"),
        ("conv1/bias", "conv1", "conv1/bias"),
        ("cnn/conv1/kernel", "conv1/kernel", "conv1/kernel"),
        ("cnn/conv10/kernel", "conv1", None),
        ("cnn/conv1/kernel", "conv", None),
        ("cnn/dense1/kernel", "conv1", None),
    ],
)
def test_scope_key(name, scope, key):
    assert scope_key(name, scope) == key


def test_plan_restore_maps_by_name_then_by_scope_and_checks_shapes():
    graph = {"conv1/kernel": [5, 5, 1, 32], "conv1/bias": [32], "dense1/kernel": [3136, 1024]}
    checkpoint = {
        "cnn/conv1/kernel": [5, 5, 1, 32],
        "cnn/conv1/kernel/Adam": [5, 5, 1, 32],
        "conv1/bias": [32],
        "cnn/dense1/kernel": [3136, 1024],
    }
    assert plan_restore(graph, checkpoint, ["conv1"]) == {
        "conv1/kernel": "cnn/conv1/kernel",
        "conv1/bias": "conv1/bias",
    }
    with pytest.raises(UsageError, match="has shape \\[32\\], the model's conv1/bias is \\[64\\]"):
        plan_restore({**graph, "conv1/bias": [64]}, checkpoint, ["conv1"])


def test_resolve_checkpoint_takes_a_dir_or_a_prefix(trained_model):
    latest = tf.train.latest_checkpoint(str(trained_model.model_dir))
    assert resolve_checkpoint(str(trained_model.model_dir), "--x") == latest
    assert resolve_checkpoint(latest, "--x") == latest
