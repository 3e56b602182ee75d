"""Distributed training on TensorFlow's own runtime: TF_CONFIG clusters and MirroredStrategy.

Several machines: every process gets the same `cluster` in its TF_CONFIG and its own `task`:

    {"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222"], "ps": ["host2:2222"]},
     "task": {"type": "worker", "index": 0}}

and runs the same `python -m training train ...` command with a `--model-dir` every task can
reach (a shared filesystem). `tf.estimator.train_and_evaluate` reads the role: the chief
initialises the variables, trains and writes checkpoints (and this tool's chief exports the
version once training is done); workers train; parameter servers (`ps`) hold the variables
and never exit on their own; an `evaluator` (not listed in `cluster`) evaluates each new
checkpoint.

One machine with several GPUs: `--num-gpus N` trains with `MirroredStrategy`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys

import tensorflow as tf

from training.errors import UsageError

TF_CONFIG = "TF_CONFIG"
TASK_TYPES = ("chief", "worker", "ps", "evaluator")
CLUSTER_JOBS = ("chief", "worker", "ps")


@dataclasses.dataclass(frozen=True)
class ClusterTask:
    """This process's place in a TF_CONFIG cluster."""

    task_type: str
    index: int
    cluster: dict[str, tuple[str, ...]]

    @property
    def name(self) -> str:
        return f"{self.task_type} {self.index}"

    @property
    def is_chief(self) -> bool:
        return self.task_type == "chief"

    @property
    def address(self) -> str | None:
        """host:port this task listens on (None for the evaluator, which serves nothing)."""
        addresses = self.cluster.get(self.task_type, ())
        return addresses[self.index] if self.index < len(addresses) else None

    @property
    def shuffle_offset(self) -> int:
        """Added to the shuffle seed so that training tasks do not read the same batches."""
        return {"chief": 0, "worker": 1 + self.index}.get(self.task_type, 0)


def _fail(problem: str) -> UsageError:
    return UsageError(f"{TF_CONFIG}: {problem}")


def _check_address(job: str, i: int, address) -> str:
    if not isinstance(address, str) or address.count(":") < 1:
        raise _fail(f"cluster.{job}[{i}]: expected 'host:port', got {address!r}")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise _fail(
            f"cluster.{job}[{i}]: expected 'host:port' with a port 1-65535, got {address!r}"
        )
    return address


def parse_tf_config(text: str) -> ClusterTask | None:
    """Validate a TF_CONFIG value; None when it describes no cluster ("" or "{}").

    Raises:
        UsageError: not JSON, or not a cluster this tool can run (the message says why).
    """
    if not text.strip():
        return None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise _fail(f"not valid JSON ({err})") from err
    if not isinstance(config, dict):
        raise _fail(f"expected a JSON object, got {type(config).__name__}")
    if not config:
        return None
    cluster, task = config.get("cluster"), config.get("task")
    if not isinstance(cluster, dict) or not cluster:
        raise _fail('needs a "cluster" object, e.g. {"chief": ["host0:2222"], ...}')
    if "master" in cluster:
        raise _fail('cluster job "master" is the legacy name: use "chief"')
    if "evaluator" in cluster:
        raise _fail('the evaluator is not listed in "cluster"; give it only as "task"')
    unknown = sorted(set(cluster) - set(CLUSTER_JOBS))
    if unknown:
        raise _fail(f"unknown cluster job(s) {unknown}; known: {', '.join(CLUSTER_JOBS)}")
    jobs: dict[str, tuple[str, ...]] = {}
    for job, addresses in cluster.items():
        if not isinstance(addresses, list) or not addresses:
            raise _fail(f"cluster.{job}: expected a non-empty list of 'host:port'")
        jobs[job] = tuple(_check_address(job, i, a) for i, a in enumerate(addresses))
    everything = [a for addresses in jobs.values() for a in addresses]
    if len(set(everything)) != len(everything):
        raise _fail("the same host:port appears twice in cluster")
    if len(jobs.get("chief", ())) != 1:
        raise _fail('cluster needs exactly one "chief" address')
    if "worker" in jobs and "ps" not in jobs:
        raise _fail('workers share variables through parameter servers: add a "ps" job')
    if not isinstance(task, dict):
        raise _fail('needs a "task" object, e.g. {"type": "worker", "index": 0}')
    task_type, index = task.get("type"), task.get("index", 0)
    if task_type not in TASK_TYPES:
        raise _fail(f"task.type {task_type!r}: expected one of {', '.join(TASK_TYPES)}")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise _fail(f"task.index {index!r}: expected an integer >= 0")
    if task_type == "evaluator":
        if index != 0:
            raise _fail("task.index: there is one evaluator, index 0")
    elif index >= len(jobs.get(task_type, ())):
        raise _fail(
            f"task {task_type} {index} is not in cluster "
            f"({len(jobs.get(task_type, ()))} {task_type} address(es))"
        )
    return ClusterTask(task_type, index, jobs)


def read_tf_config(environ=None) -> ClusterTask | None:
    """This process's task from the TF_CONFIG environment variable; None when not set."""
    environ = os.environ if environ is None else environ
    return parse_tf_config(environ.get(TF_CONFIG, ""))


@contextlib.contextmanager
def without_tf_config():
    """Hide TF_CONFIG while building a local Estimator (RunConfig reads it when created)."""
    saved = os.environ.pop(TF_CONFIG, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[TF_CONFIG] = saved


def mirrored_strategy(num_gpus: int, stream=None):
    """MirroredStrategy over num_gpus GPUs of this host; over the CPU when it has none.

    The fallback is said on `stream` (stderr) as a warning line, as is using fewer GPUs than
    asked for. The input_fn's batch is each replica's: N GPUs train on N batches a step.
    """
    stream = stream or sys.stderr
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        devices = ["/cpu:0"]
        print(
            f"warning: --num-gpus {num_gpus}: TensorFlow sees no GPU here; falling back to "
            "the CPU (MirroredStrategy with one replica on /cpu:0)",
            file=stream,
            flush=True,
        )
    else:
        if len(gpus) < num_gpus:
            print(
                f"warning: --num-gpus {num_gpus}: TensorFlow sees only {len(gpus)} GPU(s); "
                "mirroring over those",
                file=stream,
                flush=True,
            )
        devices = [f"/gpu:{i}" for i in range(min(num_gpus, len(gpus)))]
        print(f"MirroredStrategy over {', '.join(devices)}", file=stream, flush=True)
    return tf.distribute.MirroredStrategy(devices)
