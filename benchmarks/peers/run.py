"""Serve the model with each peer in turn and load it with wrk as benchmarks/bench.py does.

`bench_peers()` is what `python -m benchmarks.bench --peers` calls after its own rows, once
for Fashion-MNIST (spec.ROWS) and once for the tabular classifier (spec.TABULAR_ROWS): the
same exported version, the same instances (each TF Serving body of the run re-encoded in the
peer's format), the same wrk loads and duration, one server at a time. Before its loads each
peer answers one instance, and its probabilities must match the SavedModel's own (loaded with
tf.saved_model.load in this process): a peer that serves something else is not timed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import numpy as np

from benchmarks import common
from benchmarks.peers import spec, venvs

# The peers' answers against the SavedModel's own, probability by probability.
TOLERANCE = 1e-4
# wrk's warm-up before the timed loads (bench.py gives this service 2 s): a peer's ready
# endpoint can answer while another of its worker processes is still loading TensorFlow.
WARMUP_S = 5
# Variables of this project's environment that must not leak into a peer's venv.
DROPPED_ENV = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")


def prepare(variants=spec.ROWS, log=print) -> dict[str, dict[str, str]]:
    """Install every needed peer's venv (before any timing); peer -> a few versions."""
    versions = {}
    for peer in dict.fromkeys(v.peer for v in variants):
        venvs.ensure(peer, log=log)
        versions[peer] = venvs.installed_versions(peer)
    return versions


def reference_probabilities(
    version_path: Path, instances: list, model: str = spec.MODEL_NAME
) -> np.ndarray:
    """The SavedModel's own probabilities for these instances (images, or named rows), as
    tf.saved_model.load gives them (the model's signature called directly, the way its docs
    show)."""
    import tensorflow as tf

    signature = tf.saved_model.load(str(version_path)).signatures[spec.SIGNATURES[model]]
    if model == spec.MODEL_NAME:
        inputs = {spec.INPUT_KEY: tf.constant(instances, tf.float32)}
    else:
        inputs = {
            name: tf.constant([row[name] for row in instances], tensor.dtype)
            for name, tensor in signature.structured_input_signature[1].items()
        }
    return signature(**inputs)["probabilities"].numpy().astype(np.float64)


def peer_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    return {**env, **extra}


def server_command(variant: spec.Variant, version_path: Path, rundir: Path, port: int):
    """(command, environment, working directory) to start one peer."""
    if variant.peer == "mlserver":
        ports = (port, common.free_port(), common.free_port())
        repo = spec.write_mlserver_repository(variant, version_path, rundir / "repository", ports)
        cmd = [str(venvs.command("mlserver")), "start", str(repo)]
        return cmd, peer_env({}), rundir
    service_dir = rundir / "service"
    service_dir.mkdir(parents=True, exist_ok=True)
    source, service_class = spec.BENTOML_SERVICES[variant.model]
    (service_dir / source.name).write_text(source.read_text())
    cmd = [
        str(venvs.command("bentoml")),
        "serve",
        f"{source.stem}:{service_class}",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--working-dir",
        str(service_dir),
    ]
    env = peer_env(spec.bentoml_environment(variant, version_path, rundir / "bentoml-home"))
    return cmd, env, service_dir


def stop(proc: subprocess.Popen) -> None:
    """Stop the peer, then whatever of its process group is left (its workers)."""
    common.stop_server(proc)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        time.sleep(2)


def check_answer(variant: spec.Variant, port: int, body: str, expected: np.ndarray) -> float:
    """POST one body; the largest difference from the SavedModel's probabilities (`expected`,
    [n, classes]).

    Raises:
        RuntimeError: the peer answered with an error or with other probabilities.
    """
    response = httpx.post(
        f"http://127.0.0.1:{port}{spec.infer_path(variant)}",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    if response.status_code != 200:
        raise RuntimeError(f"{variant.title}: HTTP {response.status_code}: {response.text[:500]}")
    got = spec.probabilities(variant.peer, response.json(), expected.shape[1])
    if got.shape != expected.shape:
        raise RuntimeError(
            f"{variant.title}: probabilities of shape {got.shape}, not {expected.shape}"
        )
    diff = float(np.max(np.abs(got - expected)))
    if diff > TOLERANCE:
        raise RuntimeError(f"{variant.title}: probabilities differ from the model's by {diff:.2g}")
    return diff


def peer_bodies(
    peer: str, bodies: dict[int, Path], directory: Path, model: str = spec.MODEL_NAME
) -> dict[int, Path]:
    """The benchmark's TF Serving bodies (instances per request -> file) in the peer's format."""
    out = {}
    for n, path in bodies.items():
        target = directory / f"body-{peer}-{model}-{n}.json"
        target.write_text(spec.peer_body(peer, path.read_text(), model))
        out[n] = target
    return out


def bench_variant(
    variant: spec.Variant,
    version_path: Path,
    bodies: dict[int, Path],
    expected: np.ndarray,
    workdir: Path,
    seconds: int,
    loads,
    log=print,
) -> dict:
    """One peer with one group of settings: its check and its wrk rows."""
    log(f"== {variant.title}", flush=True)
    rundir = workdir / f"peer-{variant.key}"
    rundir.mkdir(parents=True, exist_ok=True)
    port = common.free_port()
    cmd, env, cwd = server_command(variant, version_path, rundir, port)
    started = time.monotonic()
    proc = common.start_server(
        cmd,
        env,
        port,
        rundir / "server.log",
        ready_path=spec.ready_path(variant),
        cwd=cwd,
        new_session=True,
    )
    try:
        startup_s = time.monotonic() - started
        diff = check_answer(variant, port, bodies[1].read_text(), expected)
        log(
            f"   up in {startup_s:.0f} s; one instance's probabilities within {diff:.1g} "
            "of the model's"
        )
        path = spec.infer_path(variant)
        common.run_wrk(port, bodies[1], 16, WARMUP_S, path)
        # The CPU of the peer's whole process tree (its workers too) per request.
        results = common.run_loads(port, bodies, loads, seconds, path, log, server_pid=proc.pid)
    finally:
        stop(proc)
    return {
        **describe_row(variant),
        "startup_s": round(startup_s, 1),
        "max_abs_diff": diff,
        "loads": results,
    }


def describe_row(variant: spec.Variant) -> dict:
    return {
        "title": variant.title,
        "peer": variant.peer,
        "model": variant.model,
        "settings": variant.settings,
        "tricks": variant.tricks,
    }


def bench_peers(
    version_path: Path,
    bodies: dict[int, Path],
    workdir: Path,
    seconds: int,
    loads=common.LOADS,
    variants=spec.ROWS,
    versions: dict | None = None,
    log=print,
) -> dict:
    """Every variant in turn: key -> its title, settings, versions, check and wrk rows.

    `version_path` is the version every variant serves (all of one model: spec.ROWS or
    spec.TABULAR_ROWS). `bodies` are benchmarks/bench.py's TF Serving bodies for it
    (instances per request -> file); each load's instances per request must have one. Call
    prepare() first (it installs the venvs and returns `versions`), so that no install runs
    between timed servers.
    """
    (model,) = {v.model for v in variants}
    if versions is None:
        versions = prepare(variants, log=log)
    instances = spec.instances_of(bodies[1].read_text(), model)
    expected = reference_probabilities(version_path, instances, model)
    by_peer = {
        peer: peer_bodies(peer, bodies, workdir, model)
        for peer in dict.fromkeys(v.peer for v in variants)
    }
    results = {}
    for variant in variants:
        try:
            row = bench_variant(
                variant, version_path, by_peer[variant.peer], expected, workdir, seconds, loads, log
            )
        except (RuntimeError, subprocess.CalledProcessError, httpx.HTTPError) as err:
            # Reported in the table as it is; the other rows still run.
            detail = getattr(err, "stderr", None) or str(err)
            log(f"   FAILED: {detail}", flush=True)
            row = {**describe_row(variant), "error": str(detail)[-2000:], "loads": {}}
        row["versions"] = versions.get(variant.peer, {})
        results[variant.key] = row
    return results
