"""Rollouts against a real service: TF Serving's model config, labels, canary, shadow, and no
failed request across a version swap, a label move and a policy change."""

from __future__ import annotations

import concurrent.futures
import shutil
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
from support.entry import run_main_in_process
from support.servers import (
    MODEL_NAME,
    add_version,
    copy_repository,
    run_service,
    start_server,
    wait_for,
)
from support.tfserving_standin import TFServingStandIn

from artifact.model_config import write_config

MODEL = f"/v1/models/{MODEL_NAME}"
ZEROS = [[[0.0] * 28] * 28]
POLL = "0.2"


def config_text(policy: str, labels: dict[str, int] | None = None) -> str:
    """A ModelServerConfig for the one model; its base path relative to the file."""
    label_lines = "".join(
        f'    version_labels {{ key: "{k}" value: {v} }}\n' for k, v in (labels or {}).items()
    )
    return (
        "model_config_list {\n  config {\n"
        f'    name: "{MODEL_NAME}"\n    base_path: "{MODEL_NAME}"\n'
        f'    model_platform: "tensorflow"\n    model_version_policy {{ {policy} }}\n'
        f"{label_lines}  }}\n}}\n"
    )


@pytest.fixture
def repository(trained_model, tmp_path) -> Path:
    """A copy of the repository with versions 1 and 2 (the same model twice)."""
    base = copy_repository(trained_model, tmp_path)
    add_version(base / MODEL_NAME, "1", "2")
    return base


@pytest.fixture
def servers():
    started = []
    yield started
    for server in started:
        server.stop()


def serve_config(servers, repository: Path, text: str, **settings):
    path = repository / "models.config"
    write_config(path, text)
    server = start_server(
        repository / f"server{len(servers)}.log",
        MODEL_CONFIG_FILE=str(path),
        MODEL_CONFIG_FILE_POLL_SECONDS=POLL,
        MODEL_POLL_SECONDS=POLL,
        **settings,
    )
    servers.append(server)
    return server, path


def versions_of(client) -> dict[str, str]:
    body = client.get(MODEL).json()
    return {s["version"]: s["state"] for s in body.get("model_version_status", [])}


def answered_by(client, path=f"{MODEL}:predict") -> str:
    response = client.post(path, json={"instances": ZEROS})
    assert response.status_code == 200, response.text
    return response.json()["model_version"]


def test_no_request_fails_across_a_version_swap_a_label_move_and_a_policy_change(
    servers, repository
):
    (repository / MODEL_NAME / "2").rename(repository / "held-back-2")
    server, path = serve_config(
        servers, repository, config_text("specific { versions: 1 }", {"stable": 1})
    )
    outcomes: list[str] = []
    lock = threading.Lock()
    done = threading.Event()

    def load(worker: int) -> None:
        paths = [f"{MODEL}:predict", f"{MODEL}/labels/stable:predict", "/predict"]
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for i in range(400):
                if done.is_set() and i >= 100:
                    return
                target = paths[(worker + i) % len(paths)]
                body = (
                    {"instances": [[[0] * 28] * 28]}
                    if target == "/predict"
                    else {"instances": ZEROS}
                )
                try:
                    status = str(client.post(target, json=body).status_code)
                except httpx.TransportError as err:
                    status = f"connection error: {type(err).__name__}"
                with lock:
                    outcomes.append(status)

    with (
        httpx.Client(base_url=server.url, timeout=30) as client,
        concurrent.futures.ThreadPoolExecutor(4) as pool,
    ):
        workers = [pool.submit(load, n) for n in range(4)]
        wait_for(lambda: len(outcomes) >= 20, "the load to start", server)
        # 1. A new version on disk, added to the policy: loaded and warmed, then AVAILABLE.
        (repository / "held-back-2").rename(repository / MODEL_NAME / "2")
        write_config(path, config_text("specific { versions: 1 versions: 2 }", {"stable": 1}))
        wait_for(lambda: versions_of(client) == {"2": "AVAILABLE", "1": "AVAILABLE"} or
                 versions_of(client) == {"1": "AVAILABLE", "2": "AVAILABLE"}, "version 2", server)  # fmt: skip
        assert answered_by(client) == "1"  # stable still names 1
        # 2. The label moves: unpinned and `stable` requests go to 2.
        write_config(path, config_text("specific { versions: 1 versions: 2 }", {"stable": 2}))
        wait_for(lambda: answered_by(client) == "2", "stable to move to 2", server)
        assert answered_by(client, f"{MODEL}/labels/stable:predict") == "2"
        # 3. The policy drops version 1: it leaves once its requests are done (and stays
        # listed as END, as TF Serving lists an unloaded version).
        write_config(path, config_text("specific { versions: 2 }", {"stable": 2}))
        wait_for(lambda: versions_of(client) == {"2": "AVAILABLE", "1": "END"},
                 "version 1 to leave", server)  # fmt: skip
        done.set()
        for worker in workers:
            worker.result()
    assert len(outcomes) >= 300, len(outcomes)
    failures = [o for o in outcomes if not o.startswith("2")]
    assert failures == [], f"{len(failures)} of {len(outcomes)} requests failed: {failures[:5]}"


def test_grpc_model_spec_labels_resolve_through_the_model_config(servers, repository):
    import grpc
    from support.tfserving_requests import predict_request
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    server, path = serve_config(
        servers,
        repository,
        config_text("specific { versions: 1 versions: 2 }", {"stable": 1, "canary": 2}),
        grpc=True,
    )
    pixels = np.zeros((1, 28, 28), np.float32)

    def predict(**spec) -> predict_pb2.PredictResponse:
        return stub.Predict(predict_request(pixels, **spec), timeout=30)

    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        assert predict(version_label="canary").model_spec.version.value == 2
        assert predict(version_label="stable").model_spec.version.value == 1
        assert predict().model_spec.version.value == 1  # no version, no label: stable
        # The label moves in the config: gRPC follows it, as HTTP does.
        write_config(
            path, config_text("specific { versions: 1 versions: 2 }", {"stable": 2, "canary": 2})
        )
        wait_for(
            lambda: predict(version_label="stable").model_spec.version.value == 2,
            "stable to move to 2",
            server,
        )
        with pytest.raises(grpc.RpcError) as unknown:
            predict(version_label="nightly")
        assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Unrecognized servable version label: nightly" in unknown.value.details()


def test_a_bad_config_reload_is_refused_whole_and_the_previous_one_keeps_serving(
    servers, repository
):
    server, path = serve_config(
        servers, repository, config_text("specific { versions: 1 }", {"stable": 1})
    )
    with httpx.Client(base_url=server.url, timeout=30) as client:
        # Version 2 is on disk but not loaded: a label may not point to it (TF Serving's rule).
        write_config(path, config_text("specific { versions: 1 versions: 2 }", {"stable": 2}))
        rollout = wait_for(
            lambda: (body := client.get(f"{MODEL}/rollout").json())["config"]["error"] and body,
            "the reload to be refused",
            server,
        )
        assert (
            "Request to assign label to version 2 of model fashion_mnist"
            in rollout["config"]["error"]
        )
        assert rollout["labels"] == {"stable": 1}
        assert versions_of(client) == {"1": "AVAILABLE"}
        assert answered_by(client) == "1"
        errors = [
            line for line in server.log().splitlines() if " ERROR " in line and "refused" in line
        ]
        assert len(errors) == 1, server.log()
        # A syntax error: refused too.
        path.write_text("model_config_list { config {")
        wait_for(
            lambda: (
                "not a ModelServerConfig"
                in (client.get(f"{MODEL}/rollout").json()["config"]["error"] or "")
            ),
            "the broken file to be refused",
            server,
        )
        assert answered_by(client) == "1"
        # Fixed in two steps, as TF Serving wants: first the version, then the label.
        write_config(path, config_text("specific { versions: 1 versions: 2 }", {"stable": 1}))
        wait_for(lambda: versions_of(client).get("2") == "AVAILABLE", "version 2", server)
        write_config(path, config_text("specific { versions: 1 versions: 2 }", {"stable": 2}))
        wait_for(lambda: answered_by(client) == "2", "stable to move", server)
        assert client.get(f"{MODEL}/rollout").json()["config"]["error"] is None


@pytest.mark.parametrize(
    "text, fragment",
    [
        pytest.param("model_config_list {", "not a ModelServerConfig in text format", id="syntax"),
        pytest.param(config_text("specific { versions: 7 }"), "policy specific asks for version(s) 7", id="missing-version"),
        pytest.param(config_text("latest { }", {"stable": 9}), "label 'stable' points to version 9", id="label-to-nothing"),
        pytest.param(config_text("latest { }").replace("model_config_list {", 'model_config_list { config { name: "fashion_mnist" base_path: "x" }'),
                     "Illegal to list model fashion_mnist multiple times", id="duplicate"),
    ],
)  # fmt: skip
def test_a_bad_config_at_start_exits_2_with_one_line(repository, text, fragment):
    path = repository / "models.config"
    path.write_text(text)
    # Refused before anything loads: service.__main__.main() in this process, as in the fast tier.
    result = run_main_in_process(MODEL_CONFIG_FILE=str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: MODEL_CONFIG_FILE: ") and fragment in lines[0], lines[0]


def test_a_label_to_a_version_that_does_not_load_stops_the_start(repository):
    broken = repository / MODEL_NAME / "2"
    shutil.rmtree(broken / "variables")
    (broken / "saved_model.pb").write_bytes(b"not a SavedModel")
    path = repository / "models.config"
    path.write_text(config_text("all { }", {"stable": 1, "canary": 2}))
    result = run_service(timeout=120, MODEL_CONFIG_FILE=str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: MODEL_CONFIG_FILE: Request to assign label to version 2"), last
    assert "Traceback" not in result.stderr


def test_canary_and_shadow_on_a_real_model(servers, repository):
    server, _ = serve_config(
        servers,
        repository,
        config_text("all { }", {"stable": 1, "canary": 2, "shadow": 2}),
        CANARY_PERCENT="50",
        SHADOW_PERCENT="100",
    )
    with httpx.Client(base_url=server.url, timeout=30) as client:
        versions = {answered_by(client) for _ in range(60)}
        assert versions == {"1", "2"}  # 50%: both within 60 requests but for 1 in 10^18
        rollout = wait_for(
            lambda: (
                (body := client.get(f"{MODEL}/rollout").json())["shadow"]
                and body["shadow"]["compared_images"] > 0
                and body
            ),
            "a shadow comparison",
            server,
        )
    assert rollout["labels"] == {"stable": 1, "canary": 2, "shadow": 2}
    assert rollout["canary_percent"] == 50 and rollout["shadow_percent"] == 100
    # Version 2 is a copy of 1: the shadow agrees on every image.
    assert rollout["shadow"]["agreement"] == 1.0 and rollout["shadow"]["disagreements"] == []
    metrics = client_metrics(server)
    assert (
        'predict_requests_by_version_total{model="fashion_mnist",route="canary",version="2"}'
        in metrics
    )
    assert 'shadow_images_total{agreement="agree",model="fashion_mnist"}' in metrics


def client_metrics(server) -> str:
    return httpx.get(server.url + "/metrics", timeout=30).text


def test_the_same_config_gives_the_same_statuses_in_process_and_through_tf_serving(
    servers, repository
):
    text = config_text("specific { versions: 1 versions: 2 }", {"stable": 1, "canary": 2})
    local, path = serve_config(servers, repository, text)
    standin = TFServingStandIn(repository, MODEL_NAME, config_file=path).start()
    try:
        remote = start_server(
            repository / "remote.log",
            BACKEND="tfserving",
            TFSERVING_GRPC_ADDRESS=standin.address,
            MODEL_CONFIG_FILE=str(path),
        )
        servers.append(remote)
        paths = [
            MODEL,
            f"{MODEL}/versions/2",
            f"{MODEL}/labels/canary",
            f"{MODEL}/labels/stable/metadata",
        ]
        with (
            httpx.Client(base_url=local.url, timeout=30) as a,
            httpx.Client(base_url=remote.url, timeout=30) as b,
        ):
            for p in paths:
                left, right = a.get(p), b.get(p)
                assert left.status_code == right.status_code == 200, (p, left.text, right.text)
                left_body, right_body = left.json(), right.json()
                left_body.pop("device", None), right_body.pop("device", None)
                assert left_body == right_body, p
            for target, version in (
                (f"{MODEL}:predict", "1"),
                (f"{MODEL}/labels/canary:predict", "2"),
            ):
                assert answered_by(a, target) == answered_by(b, target) == version
            unknown = f"{MODEL}/labels/beta:predict"
            assert (
                a.post(unknown, json={"instances": ZEROS}).json()
                == b.post(unknown, json={"instances": ZEROS}).json()
            )
    finally:
        standin.stop()


def test_two_models_from_one_config_are_served_side_by_side(servers, repository):
    """TF Serving's several models in one process: each its own versions, status and metrics."""
    shutil.copytree(repository / MODEL_NAME, repository / "second")
    shutil.rmtree(repository / "second" / "2")
    text = config_text("all {}").replace(
        "}\n}\n",
        '}\n  config {\n    name: "second"\n    base_path: "second"\n'
        '    model_platform: "tensorflow"\n  }\n}\n',
    )
    server, _ = serve_config(servers, repository, text)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert versions_of(client) == {"2": "AVAILABLE", "1": "AVAILABLE"}
        second = client.get("/v1/models/second").json()["model_version_status"]
        assert [(s["version"], s["state"]) for s in second] == [("1", "AVAILABLE")]
        assert answered_by(client) == "2"
        assert answered_by(client, "/v1/models/second:predict") == "1"
        assert answered_by(client, "/v1/models/second/versions/1:predict") == "1"
        missing = client.post("/v1/models/second/versions/2:predict", json={"instances": ZEROS})
        assert missing.status_code == 404
        assert "Specific(second, 2)" in missing.json()["error"]
        assert client.get("/readyz").json()["status"] == "ready"
        metrics = client.get("/metrics").text
        for name in (MODEL_NAME, "second"):
            assert f'model="{name}"' in metrics, name
