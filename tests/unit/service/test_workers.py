"""WORKERS > 1: the supervisor (with stand-in workers: small Python processes that act as a
worker would), the metrics every worker adds to, and TF's threads shared out among workers.

The real thing, two `python -m service` workers on one port, is in test_workers_live.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support.fakes import wait_until
from support.helpers import REPO_ROOT

from service.settings import Settings

# A stand-in worker: records its start, then does what BEHAVIOR says (per worker number),
# and on SIGTERM records that and exits 0, as a draining worker does.
STAND_IN = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    from service.workers import die_with_supervisor, worker_index

    record = Path(os.environ["RECORD"])
    index = worker_index()
    behavior = os.environ.get(f"BEHAVIOR_{index}", "serve")

    def stop(sig, frame):
        with open(record / f"stopped-{index}", "a") as f:
            f.write(signal.Signals(sig).name + "\\n")
        if behavior == "drain" and len((record / f"stopped-{index}").read_text().split()) == 1:
            return  # draining: only a second signal stops it now
        sys.exit(0)

    # Ready to be told before its start is recorded: a test that stops the supervisor once it
    # sees the start must find the signal recorded, however the scheduler interleaves them.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    die_with_supervisor()
    starts = record / f"starts-{index}"
    with open(starts, "a") as f:
        f.write(f"{os.getpid()} {os.environ['PROMETHEUS_MULTIPROC_DIR']}\\n")
    if behavior == "exit2":
        print("error: PORT: a stand-in that cannot start", file=sys.stderr)
        sys.exit(2)
    if behavior == "crash":
        sys.exit(1)
    if behavior == "crash-once" and len(starts.read_text().splitlines()) == 1:
        sys.exit(1)

    while True:
        time.sleep(0.05)
    """
)

SUPERVISE = textwrap.dedent(
    """
    import logging, sys
    from service import workers
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    workers.QUICK_DEATH_SECONDS = 5.0
    supervisor = workers.Supervisor(
        2, stop_seconds=10, command=[sys.executable, "-c", sys.argv[1]], first_pause=0.05
    )
    sys.exit(supervisor.run())
    """
)


class Supervised:
    """A supervisor process (with stand-in workers) and what its workers recorded."""

    def __init__(self, tmp_path: Path, **behavior: str):
        self.record = tmp_path / "record"
        self.record.mkdir()
        env = {
            **os.environ,
            "RECORD": str(self.record),
            "PYTHONPATH": str(REPO_ROOT),
            **{f"BEHAVIOR_{k[-1]}": v for k, v in behavior.items()},
        }
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        self.process = subprocess.Popen(
            [sys.executable, "-c", SUPERVISE, STAND_IN],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, as a terminal would give it
        )

    def starts(self, index: int) -> list[tuple[int, str]]:
        path = self.record / f"starts-{index}"
        if not path.exists():
            return []
        return [(int(p), d) for p, d in (line.split() for line in path.read_text().splitlines())]

    def stopped(self, index: int) -> list[str]:
        path = self.record / f"stopped-{index}"
        return path.read_text().split() if path.exists() else []

    def finish(self, timeout: float = 30.0) -> tuple[int, str]:
        output, _ = self.process.communicate(timeout=timeout)
        return self.process.returncode, output


@pytest.fixture
def supervised(tmp_path):
    made = []

    def make(**behavior) -> Supervised:
        made.append(Supervised(tmp_path, **behavior))
        return made[-1]

    yield make
    for s in made:
        if s.process.poll() is None:
            s.process.kill()
            s.process.wait()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (dead, not yet reaped by its parent) is not alive.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_ctrl_c_stops_the_workers_without_their_drain_and_the_supervisor_exits_0(supervised):
    s = supervised(worker1="drain", worker2="drain")
    wait_until(lambda: s.starts(1) and s.starts(2), "both workers to start")
    # A terminal's Ctrl-C: SIGINT to the supervisor's whole process group. The workers, in
    # sessions of their own, get SIGTERM from the supervisor instead, twice (no drain).
    os.killpg(s.process.pid, signal.SIGINT)
    code, output = s.finish()
    assert code == 0, output
    assert s.stopped(1) == ["SIGTERM", "SIGTERM"] and s.stopped(2) == ["SIGTERM", "SIGTERM"]


def test_sigterm_reaches_every_worker_and_the_supervisor_exits_0(supervised):
    s = supervised()
    wait_until(lambda: s.starts(1) and s.starts(2), "both workers to start")
    (_, metrics_dir), (_, other_dir) = s.starts(1)[0], s.starts(2)[0]
    assert metrics_dir == other_dir and Path(metrics_dir).is_dir()
    s.process.send_signal(signal.SIGTERM)
    code, output = s.finish()
    assert code == 0, output
    assert s.stopped(1) == ["SIGTERM"] and s.stopped(2) == ["SIGTERM"]
    assert not Path(metrics_dir).exists(), "the supervisor's metrics folder is removed"


def test_a_worker_that_dies_is_started_again(supervised):
    s = supervised()
    wait_until(lambda: s.starts(1) and s.starts(2), "both workers to start")
    ((pid, _),) = s.starts(2)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: len(s.starts(2)) == 2, "worker 2 to be started again")
    assert len(s.starts(1)) == 1, "worker 1 kept running"
    s.process.send_signal(signal.SIGTERM)
    code, output = s.finish()
    assert code == 0, output
    assert "Worker 2 was killed by SIGKILL; starting another" in output


def test_a_worker_that_cannot_start_stops_the_service_with_exit_code_2(supervised):
    s = supervised(behavior_2="exit2")
    code, output = s.finish()
    assert code == 2, output
    assert "error: PORT: a stand-in that cannot start" in output
    assert "Worker 2 exited 2: it could not start; stopping the service" in output
    assert s.stopped(1) == ["SIGTERM"], "the worker that did start was stopped"


def test_a_worker_that_keeps_dying_at_start_is_given_up_on(supervised):
    s = supervised(behavior_1="crash")
    code, output = s.finish()
    assert code == 1, output
    assert len(s.starts(1)) == 6  # the first start and five more
    assert "giving up" in output and s.stopped(2) == ["SIGTERM"]


def test_a_worker_that_crashed_once_is_back_and_serving(supervised):
    s = supervised(behavior_1="crash-once")
    wait_until(lambda: len(s.starts(1)) == 2, "worker 1's second start")
    (pid, _) = s.starts(1)[1]
    wait_until(lambda: alive(pid), "worker 1 to run")
    s.process.send_signal(signal.SIGTERM)
    code, output = s.finish()
    assert code == 0, output
    assert s.stopped(1) == ["SIGTERM"]


def test_workers_go_when_the_supervisor_is_killed(supervised):
    s = supervised()
    wait_until(lambda: s.starts(1) and s.starts(2), "both workers to start")
    pids = [s.starts(i)[0][0] for i in (1, 2)]
    s.process.kill()
    s.process.wait()
    # PR_SET_PDEATHSIG: each gets SIGTERM and stops as it would on a normal stop.
    wait_until(lambda: s.stopped(1) and s.stopped(2), "the workers to be told")
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids)


# --- metrics added up across workers ---------------------------------------------------------

WORKER_METRICS = textwrap.dedent(
    """
    import sys
    from service.metrics import Metrics
    metrics = Metrics()
    assert metrics.multiprocess
    metrics.child(metrics.requests, "/predict", "POST", "200").inc(int(sys.argv[1]))
    metrics.in_flight_gauge.inc(int(sys.argv[2]))
    metrics.model_version.labels("fashion_mnist", "/CPU:0").set(int(sys.argv[3]))
    metrics.tfserving.request_count.labels("fashion_mnist", "OK").inc(int(sys.argv[1]))
    metrics.tfserving.request_latency.labels("fashion_mnist", "predict", "REST").observe(150)
    sys.stdout.write(metrics.exposition().decode() + "END\\n")
    sys.stdout.flush()
    sys.stdin.read()  # stays alive (its live gauges count) until told to go
    """
)


def sample(text: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                return s.value
    raise AssertionError(f"no {name} in:\n{text}")


def read_until_end(worker: subprocess.Popen) -> str:
    lines = []
    for line in iter(worker.stdout.readline, ""):
        if line == "END\n":
            return "".join(lines)
        lines.append(line)
    raise AssertionError(f"the worker exited with {worker.wait()} before its metrics")


def test_metrics_add_up_across_worker_processes(tmp_path):
    from prometheus_client import multiprocess

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    workers = []
    try:
        for requests, in_flight, version in ((3, 2, 4), (5, 1, 5)):
            worker = subprocess.Popen(
                [sys.executable, "-c", WORKER_METRICS, str(requests), str(in_flight),
                 str(version)],
                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            workers.append(worker)
            # Its /metrics once it has written its values: the second's has both workers'.
            text = read_until_end(worker)
        first, _ = workers
        first.stdin.close()
        first.wait(10)
        multiprocess.mark_process_dead(first.pid, str(tmp_path))
        later = subprocess.run(
            [sys.executable, "-c", WORKER_METRICS, "0", "0", "5"],
            env=env, input="", capture_output=True, text=True, timeout=30,
        ).stdout  # fmt: skip
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
    assert sample(text, "http_requests_total") == 8
    assert sample(text, "http_requests_in_flight") == 3
    assert sample(text, "model_version") == 5  # the one set last
    # TF Serving's too, written as its exporter writes them (service/metrics_tfserving.py).
    assert ':tensorflow:serving:request_count{model_name="fashion_mnist",status="OK"} 8\n' in text
    assert text.count("# TYPE :tensorflow:serving:request_count counter\n") == 1
    latency = ':tensorflow:serving:request_latency_bucket{model_name="fashion_mnist",API="predict"'
    assert latency + ',entrypoint="REST",le="188.957"} 2\n' in text
    # The first worker is gone: its requests still count, what it held in flight no longer.
    later = later.replace("END\n", "")
    assert sample(later, "http_requests_total") == 8
    assert sample(later, "http_requests_in_flight") == 1


# --- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "workers, intra, cores, expected",
    [(1, 0, 2, 0), (2, 0, 2, 1), (2, 0, 8, 4), (4, 0, 2, 1), (2, 3, 2, 3)],
)
def test_tensorflow_threads_are_shared_out_among_workers(workers, intra, cores, expected):
    settings = Settings(workers=workers, intra_op_threads=intra)
    assert settings.tensorflow_threads(cores) == (expected, settings.inter_op_threads)
