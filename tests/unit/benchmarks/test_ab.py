"""benchmarks/ab.py: the CPU a process used, read from /proc, as the A/B reports it; the
constant model --constant-model serves; the sides it compares."""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import pytest

from benchmarks.ab import (
    CONSTANT_SERVICE,
    Side,
    p50_ms,
    parse_arguments,
    process_cpu_seconds,
)
from benchmarks.generic import Served


def test_process_cpu_counts_the_work_of_the_process():
    before = process_cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    used = process_cpu_seconds(os.getpid()) - before
    assert 0.2 <= used < 5.0, used


def test_the_constant_model_answers_the_shapes_of_the_real_one():
    namespace: dict = {}
    # The function each checkout's service runs under --constant-model, from its source there.
    exec(CONSTANT_SERVICE.split("import artifact.saved_model\n")[1].split("artifact.")[0],
         namespace)  # fmt: skip
    answer = namespace["constant_run"](None, np.zeros((3, 28, 28), np.float32))
    assert answer["classes"].shape == (3,) and answer["classes"].dtype == np.int64
    assert answer["probabilities"].shape == (3, 10)
    assert answer["probabilities"].dtype == np.float32
    np.testing.assert_allclose(answer["probabilities"].sum(axis=1), 1.0, rtol=1e-6)
    by_name = namespace["constant_run"](None, {"image": np.zeros((2, 28, 28), np.float32)})
    assert by_name["classes"].shape == (2,)


def test_a_side_is_a_checkout_or_a_checkout_on_a_server(tmp_path):
    assert Side.parse(str(tmp_path)) == Side(tmp_path, None)
    assert Side.parse(f"{tmp_path}@granian") == Side(tmp_path, "granian")
    assert Side.parse(f"{tmp_path}@granian").command(False)[1] == "granian"
    assert Side.parse(str(tmp_path)).command(False) == ["-m", "service"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown server 'nginx'"):
        Side.parse(f"{tmp_path}@nginx")
    args = parse_arguments([str(tmp_path), f"{tmp_path}@uvicorn-h11", "--concurrency", "1,64"])
    assert args.concurrency == [1, 64] and len(args.sides) == 2


def test_a_side_may_carry_settings_of_its_own(tmp_path):
    side = Side.parse(f"{tmp_path},LOG_FORMAT=json,LOG_LEVEL=info")
    assert side == Side(tmp_path, None, (("LOG_FORMAT", "json"), ("LOG_LEVEL", "info")))
    assert str(side) == f"{tmp_path},LOG_FORMAT=json,LOG_LEVEL=info"
    assert Side.parse(f"{tmp_path}@granian,WORKERS=2").server == "granian"
    assert Side.parse(str(tmp_path)) != side  # two sides of one checkout
    with pytest.raises(argparse.ArgumentTypeError, match="expected NAME=VALUE"):
        Side.parse(f"{tmp_path},json")


@pytest.mark.parametrize("line, ms", [("     50%  125.00us", 0.125), ("     50%    2.36ms", 2.36),
                                      ("     50%    1.20s", 1200.0)])  # fmt: skip
def test_the_p50_of_wrk_in_milliseconds(line, ms):
    assert p50_ms(f"Latency Distribution\n{line}\n     75%  3.00ms\n") == pytest.approx(ms)


def test_the_model_is_fashion_mnist_unless_the_tabular_classifier_is_asked_for(tmp_path, capsys):
    assert parse_arguments([str(tmp_path), str(tmp_path)]).model == "fashion_mnist"
    args = parse_arguments([str(tmp_path), str(tmp_path), "--model", "tabular"])
    assert args.model == "tabular"
    # The constant model answers Fashion-MNIST's shapes only.
    with pytest.raises(SystemExit):
        parse_arguments([str(tmp_path), str(tmp_path), "--model", "tabular", "--constant-model"])
    assert "only with that model" in capsys.readouterr().err
    served = Served(tmp_path / "models" / "tabular_classifier" / "3", tmp_path / "b.json", "/p")
    assert served.environment == {"MODEL_NAME": "tabular_classifier",
                                  "MODEL_BASE_PATH": str(tmp_path / "models")}  # fmt: skip
