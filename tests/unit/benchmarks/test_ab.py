"""benchmarks/ab.py: the CPU a process used, read from /proc, as the A/B reports it."""

from __future__ import annotations

import os
import time

from benchmarks.ab import process_cpu_seconds


def test_process_cpu_counts_the_work_of_the_process():
    before = process_cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    used = process_cpu_seconds(os.getpid()) - before
    assert 0.2 <= used < 5.0, used
