"""WORKERS > 1: one supervisor and that many server processes on the same ports.

Each worker is `python -m service` again, with SERVICE_WORKER set: it binds PORT (and
GRPC_PORT) with SO_REUSEPORT, so the kernel spreads connections across the workers, and runs
its own event loop, batcher and copy of the models. One Python process is bound by its event
loop and its interpreter lock; whether two of them serve more than one depends on the cores
and the load: the last benchmark's WORKERS=2 rows against one process are in
docs/operations.md, "Several processes: `WORKERS`" (generated from the benchmark's results).

The supervisor, in this module, imports no TensorFlow and serves nothing:
- it starts the workers with PROMETHEUS_MULTIPROC_DIR set to a fresh folder, so /metrics in
  any worker adds up every worker's values (service/metrics.py);
- it passes SIGTERM on: each worker drains (DRAIN_SECONDS) and finishes its requests, then
  the supervisor exits 0. Ctrl-C (SIGINT), or a second SIGTERM, stops them the same way
  without the drain: the workers get SIGTERM twice, as a single process does on a second
  one. The workers run in a session of their own, so a terminal's Ctrl-C reaches only the
  supervisor, which decides;
- it restarts a worker that dies, and drops the dead one's live gauges; a worker that keeps
  dying within seconds of its start is retried after longer and longer pauses, then given up
  on (exit 1). A worker that exits 2 could not start (settings, models, ports): the service
  stops with exit code 2, as a single process would;
- workers die with it (PR_SET_PDEATHSIG), so none is left holding the port.

What workers do not share: each loads the models itself (memory: docs/benchmarks.md), polls
the model repository and MODEL_CONFIG_FILE on its own (a change reaches them all within the
poll interval), and draws its own canary and shadow samples. The feedback store and the
prediction logs take several writers by design (a file per writer).
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger("service.workers")

WORKER_ENV = "SERVICE_WORKER"
SUPERVISOR_ENV = "SERVICE_SUPERVISOR"
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"
# A worker that dies sooner than this after its start counts as failing to start.
QUICK_DEATH_SECONDS = 10.0
# Given up on after this many quick deaths in a row (pauses of 1, 2, 4, 8, 16 s between).
MAX_QUICK_DEATHS = 5
POLL_SECONDS = 0.2
# Between the two SIGTERMs that stop a worker without its drain.
SECOND_SIGNAL_DELAY = 0.3
_PR_SET_PDEATHSIG = 1


def worker_index() -> int | None:
    """This process's worker number (1, 2, ...), or None when it is not a worker."""
    value = os.environ.get(WORKER_ENV)
    return int(value) if value else None


def die_with_supervisor() -> None:
    """In a worker: be sent SIGTERM (drain, then exit) when the supervisor dies, even when it
    is killed; at once when it is already gone."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    supervisor = os.environ.get(SUPERVISOR_ENV)
    if supervisor and os.getppid() != int(supervisor):
        os.kill(os.getpid(), signal.SIGTERM)


class _Worker:
    def __init__(self, index: int):
        self.index = index
        self.process: subprocess.Popen | None = None
        self.started = 0.0
        self.quick_deaths = 0
        self.restart_at: float | None = None


class Supervisor:
    """Starts `count` workers and keeps them running until told to stop.

    Args:
        count: how many workers (WORKERS).
        stop_seconds: how long stopping workers get before they are killed (their drain and
            shutdown timeouts, and a margin).
        command: how a worker is started (default: this interpreter, `-m service`).
        first_pause: the pause before a worker that died at start is started again; it
            doubles each time it dies at start again.
    """

    def __init__(
        self,
        count: int,
        stop_seconds: float,
        command: list[str] | None = None,
        first_pause: float = 1.0,
    ):
        self.count = count
        self.stop_seconds = stop_seconds
        self.command = command or [sys.executable, "-m", "service"]
        self.first_pause = first_pause
        self.workers = [_Worker(i + 1) for i in range(count)]
        self._stopping: int | None = None  # the signal being passed on
        self._stop_deadline = 0.0
        self._skip_drain_at: float | None = None  # when to send the second SIGTERM
        self._result = 0

    def run(self) -> int:
        """Supervise until the workers have stopped; the exit code."""
        owned = METRICS_ENV not in os.environ
        metrics_dir = Path(os.environ.get(METRICS_ENV) or tempfile.mkdtemp(prefix="metrics-"))
        # prometheus_client's rule: the folder starts empty (a past run's files would count).
        for stale in metrics_dir.glob("*.db"):
            stale.unlink()
        self._env = {
            **os.environ,
            METRICS_ENV: str(metrics_dir),
            SUPERVISOR_ENV: str(os.getpid()),
        }
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            for worker in self.workers:
                self._start(worker)
            while not self._all_stopped():
                time.sleep(POLL_SECONDS)
                self._check()
            for worker in self.workers:
                code = worker.process.returncode if worker.process is not None else 0
                if code:  # a worker that did not stop cleanly makes the whole stop unclean
                    self._result = max(self._result, 2 if code == 2 else 1)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for worker in self.workers:
                if worker.process is not None and worker.process.poll() is None:
                    worker.process.kill()
                    worker.process.wait()
            if owned:
                shutil.rmtree(metrics_dir, ignore_errors=True)
        return self._result

    def _start(self, worker: _Worker) -> None:
        env = {**self._env, WORKER_ENV: str(worker.index)}
        # A session of its own: a terminal's Ctrl-C goes to the supervisor, not straight to
        # each worker (which would die of it, skipping its shutdown).
        worker.process = subprocess.Popen(self.command, env=env, start_new_session=True)
        worker.started = time.monotonic()
        worker.restart_at = None
        log.info("Worker %d started (pid %d)", worker.index, worker.process.pid)

    def _on_signal(self, sig, frame) -> None:
        first = self._stopping is None
        if first:
            self._stop_deadline = time.monotonic() + self.stop_seconds
            log.info("%s: stopping %d workers", signal.Signals(sig).name, self.count)
            self._stopping = signal.SIGTERM
            self._signal_all(signal.SIGTERM)
        if sig == signal.SIGINT or not first:
            # Without the drain: a second SIGTERM, a moment later so that the two are not
            # merged into one pending signal in the worker.
            self._skip_drain_at = time.monotonic() + SECOND_SIGNAL_DELAY

    def _signal_all(self, sig: int) -> None:
        for worker in self.workers:
            if worker.process is not None and worker.process.poll() is None:
                worker.process.send_signal(sig)

    def _stop(self, result: int) -> None:
        self._result = max(self._result, result)
        if self._stopping is None:
            self._stopping = signal.SIGTERM
            self._stop_deadline = time.monotonic() + self.stop_seconds
            self._signal_all(signal.SIGTERM)

    def _all_stopped(self) -> bool:
        return self._stopping is not None and all(
            w.process is None or w.process.poll() is not None for w in self.workers
        )

    def _check(self) -> None:
        now = time.monotonic()
        if self._stopping is not None:
            if self._skip_drain_at is not None and now >= self._skip_drain_at:
                self._skip_drain_at = None
                self._signal_all(signal.SIGTERM)
            if now > self._stop_deadline:
                for worker in self.workers:
                    if worker.process is not None and worker.process.poll() is None:
                        log.warning("Worker %d did not stop in time: killing it", worker.index)
                        worker.process.kill()
            return
        for worker in self.workers:
            if worker.process is None:
                if worker.restart_at is not None and now >= worker.restart_at:
                    self._start(worker)
                continue
            code = worker.process.poll()
            if code is None:
                continue
            self._mark_dead(worker.process.pid)
            worker.process = None
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"
            if code == 2:
                # It said why on its stderr (settings, the model config, a port): no retry.
                log.error("Worker %d %s: it could not start; stopping the service",
                          worker.index, how)  # fmt: skip
                self._stop(2)
                return
            if now - worker.started < QUICK_DEATH_SECONDS:
                worker.quick_deaths += 1
            else:
                worker.quick_deaths = 1
            if worker.quick_deaths > MAX_QUICK_DEATHS:
                log.error("Worker %d %s again, %d times in a row within %gs of its start; "
                          "giving up", worker.index, how, worker.quick_deaths - 1,
                          QUICK_DEATH_SECONDS)  # fmt: skip
                self._stop(1)
                return
            pause = self.first_pause * 2.0 ** (worker.quick_deaths - 1)
            log.error("Worker %d %s; starting another in %gs", worker.index, how, pause)
            worker.restart_at = now + pause

    def _mark_dead(self, pid: int) -> None:
        """Drop a dead worker's live gauges (in flight, model version): it holds nothing now."""
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, self._env[METRICS_ENV])


def supervise(count: int, stop_seconds: float) -> int:
    """Run `count` workers of this service until SIGTERM or SIGINT; the exit code."""
    return Supervisor(count, stop_seconds).run()
