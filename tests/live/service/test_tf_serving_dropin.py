"""The service in TF Serving's place, through TF Serving's own gRPC client
(`tensorflow-serving-api`'s model_service_pb2_grpc and prediction_service_pb2_grpc):

- ModelService.HandleReloadConfigRequest replaces the model config as TF Serving does: a model
  added serves, a policy and labels change, a model removed is unloaded; a bad config is
  answered with TF Serving's code and words and changes nothing, and the version serving keeps
  serving through every refusal (the calls go over GRPC_SOCKET_PATH's UNIX socket);
- `python -m service` started with TF Serving's flags alone: --rest_api_port=0 (gRPC only),
  --port, --model_base_path (the model's own folder) and --ssl_config_file with client_verify
  (mutual TLS: a client without a certificate the CA signed gets nothing).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import grpc
import httpx
import numpy as np
import pytest
from support.helpers import REPO_ROOT, certificate_authority
from support.servers import (
    MODEL_NAME,
    add_version,
    copy_repository,
    free_ports,
    service_env,
    start_server,
)
from support.sides import service_python
from support.tfserving_requests import predict_request
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    prediction_service_pb2_grpc,
)
from tensorflow_serving.config import model_server_config_pb2

AVAILABLE, END = 30, 50  # ModelVersionStatus.State
PIXELS = np.zeros((1, 28, 28), np.float32)


def config(*models: tuple[str, str], policy: str = "", labels: str = ""):
    """A ModelServerConfig of (name, base path) models, each with the policy and labels text."""
    text = "model_config_list {\n"
    for name, path in models:
        text += (f'  config {{ name: "{name}" base_path: "{path}" model_platform: "tensorflow" '
                 f"{policy} {labels} }}\n")  # fmt: skip
    from google.protobuf import text_format

    return text_format.Parse(text + "}\n", model_server_config_pb2.ModelServerConfig())


@pytest.fixture(scope="module")
def repository(trained_model, tmp_path_factory):
    """Two model folders, each with versions 1 and 2 of the trained model."""
    root = tmp_path_factory.mktemp("dropin")
    base = copy_repository(trained_model, root)
    add_version(base / MODEL_NAME, "1", "2")
    shutil.copytree(base / MODEL_NAME / "1", base / "second" / "1")
    broken = base / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "saved_model.pb").write_bytes(b"not a SavedModel")
    return base


@pytest.fixture(scope="module")
def server(repository, tmp_path_factory):
    """The service on a model config (MODEL_CONFIG_FILE), gRPC on a port and a UNIX socket."""
    root = tmp_path_factory.mktemp("dropin-server")
    (root / "models.config").write_text(
        f'model_config_list {{ config {{ name: "{MODEL_NAME}" base_path: '
        f'"{repository / MODEL_NAME}" model_platform: "tensorflow" }} }}\n'
    )
    socket_path = root / "grpc.sock"
    srv = start_server(root / "server.log", grpc=True, MODEL_CONFIG_FILE=str(root / "models.config"),
                       GRPC_SOCKET_PATH=str(socket_path))  # fmt: skip
    srv.socket_path = socket_path
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def stubs(server):
    # TF Serving's own stubs, over the UNIX socket (--grpc_socket_path).
    with grpc.insecure_channel(f"unix:{server.socket_path}") as channel:
        yield (model_service_pb2_grpc.ModelServiceStub(channel),
               prediction_service_pb2_grpc.PredictionServiceStub(channel))  # fmt: skip


def versions(model_service, name: str) -> dict[int, int]:
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    answer = model_service.GetModelStatus(request, timeout=30)
    return {status.version: status.state for status in answer.model_version_status}


def reload(model_service, server_config, metric_names=()):
    request = model_management_pb2.ReloadConfigRequest(config=server_config)
    request.metric_names.extend(metric_names)
    return model_service.HandleReloadConfigRequest(request, timeout=120)


def pinned(repository):
    """The model at version 1 alone, labeled stable (version 2 not loaded)."""
    return config((MODEL_NAME, repository / MODEL_NAME),
                  policy="model_version_policy { specific { versions: 1 } }",
                  labels='version_labels { key: "stable" value: 1 }')  # fmt: skip


def pin(model_service, repository) -> None:
    """Version 1 alone, labeled stable, from whatever config the server holds: every version
    first, as a label may point only to an AVAILABLE version (so each test stands alone,
    whichever ran before it in this module's server)."""
    every = config((MODEL_NAME, repository / MODEL_NAME), policy="model_version_policy { all {} }")
    assert reload(model_service, every).status.error_code == 0
    assert reload(model_service, pinned(repository)).status.error_code == 0


def predicts(prediction_service, name: str = MODEL_NAME) -> int:
    """Predict once; the version that answered."""
    answer = prediction_service.Predict(predict_request(PIXELS, name), timeout=30)
    return answer.model_spec.version.value


def test_a_reload_adds_changes_and_removes_models(stubs, repository, server):
    model_service, prediction_service = stubs
    # As the server started: the newest version of the one model.
    assert (
        reload(model_service, config((MODEL_NAME, repository / MODEL_NAME))).status.error_code == 0
    )
    assert predicts(prediction_service) == 2
    both = config((MODEL_NAME, repository / MODEL_NAME), ("second", repository / "second"))
    answer = reload(model_service, both, metric_names=["some_metric"])
    assert answer.status.error_code == 0
    assert [(m.name, m.int64_value_increase) for m in answer.metric] == [("some_metric", 0)]
    # Answered once the new model serves, as TF Serving answers.
    assert versions(model_service, "second") == {1: AVAILABLE}
    assert predicts(prediction_service, "second") == 1
    # A policy: every version. Then version 1 alone, labeled stable (a label may point only to
    # an AVAILABLE version: TF Serving's rule), and version 2 leaves.
    every = config((MODEL_NAME, repository / MODEL_NAME), ("second", repository / "second"),
                   policy="model_version_policy { all {} }")  # fmt: skip
    assert reload(model_service, every).status.error_code == 0
    assert versions(model_service, MODEL_NAME) == {1: AVAILABLE, 2: AVAILABLE}
    assert reload(model_service, pinned(repository)).status.error_code == 0
    assert versions(model_service, MODEL_NAME) == {1: AVAILABLE, 2: END}
    assert predicts(prediction_service) == 1
    # "second" is no longer listed: unloaded, and gone.
    with pytest.raises(grpc.RpcError) as gone:
        predicts(prediction_service, "second")
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    # The REST side sees the same config.
    with httpx.Client(base_url=server.url, timeout=30) as client:
        status = client.get(f"/v1/models/{MODEL_NAME}").json()["model_version_status"]
        assert {s["version"]: s["state"] for s in status} == {"1": "AVAILABLE", "2": "END"}
        rollout = client.get(f"/v1/models/{MODEL_NAME}/rollout").json()
        assert rollout["config"]["applied_from"] == "HandleReloadConfigRequest"


BAD_RELOADS = [
    pytest.param(lambda r: model_server_config_pb2.ModelServerConfig(), "INVALID_ARGUMENT",
                 "ServerModelConfig type not supported by HandleReloadConfigRequest. Only "
                 "ModelConfigList is currently supported", id="no-list"),
    pytest.param(lambda r: config(("a", "relative/path")), "INVALID_ARGUMENT",
                 "Expected model a to have an absolute path or URI; got base_path()=relative/path",
                 id="relative-path"),
    pytest.param(lambda r: config((MODEL_NAME, r / MODEL_NAME), (MODEL_NAME, r / "second")),
                 "INVALID_ARGUMENT", f"Illegal to list model {MODEL_NAME} multiple times in "
                 "config list", id="twice"),
    pytest.param(lambda r: config((MODEL_NAME, r / MODEL_NAME),
                                  labels='version_labels { key: "stable" value: 7 }'),
                 "FAILED_PRECONDITION", "label 'stable' points to version 7, not in", id="label"),
    pytest.param(lambda r: config((MODEL_NAME, r / MODEL_NAME),
                                  labels='version_labels { key: "canary" value: 2 }',
                                  policy="model_version_policy { specific { versions: 1 } }"),
                 "FAILED_PRECONDITION", f"Request to assign label to version 2 of model "
                 f"{MODEL_NAME}, which is not currently available for inference", id="unloaded"),
    pytest.param(lambda r: config((MODEL_NAME, r / "missing")), "FAILED_PRECONDITION",
                 "does not exist", id="missing-folder"),
]  # fmt: skip


@pytest.mark.parametrize("make, code, message", BAD_RELOADS)
def test_a_bad_reload_is_refused_whole_and_the_version_serving_keeps_serving(
    stubs, repository, make, code, message
):
    model_service, prediction_service = stubs
    pin(model_service, repository)
    before = versions(model_service, MODEL_NAME)
    assert predicts(prediction_service) == 1
    with pytest.raises(grpc.RpcError) as refused:
        reload(model_service, make(repository))
    assert refused.value.code() == grpc.StatusCode[code]
    assert message in refused.value.details(), refused.value.details()
    assert versions(model_service, MODEL_NAME) == before
    assert predicts(prediction_service) == 1


def test_a_new_model_that_does_not_load_is_unknown_and_the_others_serve(stubs, repository):
    model_service, prediction_service = stubs
    pin(model_service, repository)
    broken = config((MODEL_NAME, repository / MODEL_NAME), ("broken", repository / "broken"),
                    policy="model_version_policy { specific { versions: 1 } }")  # fmt: skip
    with pytest.raises(grpc.RpcError) as refused:
        reload(model_service, broken)
    # TF Serving's words: the config is taken, and its model keeps being tried.
    assert refused.value.code() == grpc.StatusCode.UNKNOWN
    assert refused.value.details().startswith("1 model(s) did not become available: {{broken")
    assert predicts(prediction_service) == 1
    assert versions(model_service, "broken") == {1: END}


# --- started with TF Serving's flags alone ---------------------------------------------------


def _ssl_config(pems: dict[str, bytes], client_verify: bool) -> str:
    def text(data: bytes) -> str:
        return data.decode().replace("\n", "\\n")

    return (f'server_key: "{text(pems["server_key"])}"\n'
            f'server_cert: "{text(pems["server_cert"])}"\n'
            f'custom_ca: "{text(pems["ca"])}"\n'
            f"client_verify: {str(client_verify).lower()}\n")  # fmt: skip


def test_tf_serving_flags_alone_serve_grpc_only_over_mutual_tls(repository, tmp_path):
    pems = certificate_authority()
    ssl_config = tmp_path / "ssl.config"
    ssl_config.write_text(_ssl_config(pems, client_verify=True))
    port, http_port = free_ports(2)
    log = tmp_path / "server.log"
    args = ["--rest_api_port=0", f"--port={port}", "--model_name=flowers",
            f"--model_base_path={repository / MODEL_NAME}", f"--ssl_config_file={ssl_config}",
            "--enable_profiler=false"]  # fmt: skip
    env = service_env(HOST="127.0.0.1", MODEL_POLL_SECONDS="0", DRAIN_SECONDS="0",
                      PORT=str(http_port))  # fmt: skip
    with open(log, "wb") as output:
        process = subprocess.Popen([service_python(), "-m", "service", *args], cwd=REPO_ROOT,
                                   env=env, stdout=output, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        trusted = grpc.ssl_channel_credentials(
            root_certificates=pems["ca"],
            private_key=pems["client_key"],
            certificate_chain=pems["client_cert"],
        )
        with grpc.secure_channel(f"127.0.0.1:{port}", trusted) as channel:
            model_service = model_service_pb2_grpc.ModelServiceStub(channel)
            deadline = time.monotonic() + 120
            while True:
                assert process.poll() is None, log.read_text()
                try:
                    if versions(model_service, "flowers") == {2: AVAILABLE}:
                        break
                except grpc.RpcError:
                    pass  # not listening or not loaded yet
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            prediction_service = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            assert predicts(prediction_service, "flowers") == 2
        # Without a client certificate the CA signed: no call gets through.
        anonymous = grpc.ssl_channel_credentials(root_certificates=pems["ca"])
        with grpc.secure_channel(f"127.0.0.1:{port}", anonymous) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                versions(model_service_pb2_grpc.ModelServiceStub(channel), "flowers")
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        # --rest_api_port=0: no HTTP, though PORT names a port (the flag wins).
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{http_port}/healthz", timeout=5)
        text = log.read_text()
        assert "warning: --enable_profiler: TF Serving's flag does not apply" in text
        assert "No HTTP server (PORT=0): gRPC only" in text
        assert "(TLS, client certificates required)" in text
    finally:
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(60) == 0, log.read_text()
