"""benchmarks/ab.py: the CPU a process used, read from /proc, as the A/B reports it; the
constant model --constant-model serves."""

from __future__ import annotations

import os
import time

import numpy as np

from benchmarks.ab import CONSTANT_RUN, process_cpu_seconds


def test_process_cpu_counts_the_work_of_the_process():
    before = process_cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    used = process_cpu_seconds(os.getpid()) - before
    assert 0.2 <= used < 5.0, used


def test_the_constant_model_answers_the_shapes_of_the_real_one():
    namespace: dict = {}
    exec(CONSTANT_RUN, namespace)  # the source each checkout's service runs under --constant-model
    answer = namespace["run"](None, np.zeros((3, 28, 28), np.float32))
    assert answer["classes"].shape == (3,) and answer["classes"].dtype == np.int64
    assert answer["probabilities"].shape == (3, 10)
    assert answer["probabilities"].dtype == np.float32
    np.testing.assert_allclose(answer["probabilities"].sum(axis=1), 1.0, rtol=1e-6)
    by_name = namespace["run"](None, {"image": np.zeros((2, 28, 28), np.float32)})
    assert by_name["classes"].shape == (2,)
