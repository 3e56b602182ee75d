"""deploy/kubernetes/overlays/kserve-runtime: KServe's own TF Serving runtime with only the
image changed, and an InferenceService on it; the runtime's command line is one the service
takes, and, with the image's environment, serves where KServe sends traffic.

KSERVE_RUNTIME is KServe's `kserve-tensorflow-serving` ClusterServingRuntime as KServe ships it
(config/runtimes/kserve-tensorflow-serving.yaml in kserve/kserve), copied here by hand: the
manifest is checked against it, not against itself. tests/live/containers runs the image with
this command and these arguments.
"""

from __future__ import annotations

import copy

import pytest
from support.manifest_harness import KUBE_DIR, dockerfile_stages, render

from service import cli
from service.settings import Settings

OVERLAY = KUBE_DIR / "overlays" / "kserve-runtime"
API_IMAGE = "estimator-serving-api"
KSERVE_RUNTIME_SPEC = {
    "annotations": {"prometheus.kserve.io/port": "8080", "prometheus.kserve.io/path": "/metrics"},
    "supportedModelFormats": [
        {"name": "tensorflow", "version": "1", "autoSelect": True, "priority": 2},
        {"name": "tensorflow", "version": "2", "autoSelect": True, "priority": 2},
    ],
    "protocolVersions": ["v1", "grpc-v1"],
    "containers": [
        {
            "name": "kserve-container",
            "image": "tensorflow-serving:replace",
            "command": ["/usr/bin/tensorflow_model_server"],
            "args": [
                "--model_name={{.Name}}",
                "--port=9000",
                "--rest_api_port=8080",
                "--model_base_path=/mnt/models",
                "--rest_api_timeout_in_ms=60000",
            ],
            "securityContext": {
                "runAsUser": 1000,
                "allowPrivilegeEscalation": False,
                "privileged": False,
                "runAsNonRoot": True,
                "capabilities": {"drop": ["ALL"]},
            },
            "resources": {
                "requests": {"cpu": "1", "memory": "2Gi"},
                "limits": {"cpu": "1", "memory": "2Gi"},
            },
        }
    ],
}


@pytest.fixture(scope="module")
def objects() -> dict[str, dict]:
    return {obj["kind"]: obj for obj in render(OVERLAY)}


def test_the_runtime_is_kserves_with_only_the_image_changed(objects):
    runtime = objects["ClusterServingRuntime"]
    (container,) = runtime["spec"]["containers"]
    assert container["image"].split(":")[0] == API_IMAGE
    expected = copy.deepcopy(KSERVE_RUNTIME_SPEC)
    expected["containers"][0]["image"] = container["image"]
    assert runtime["spec"] == expected
    # Its own name: KServe's stays as installed.
    assert runtime["metadata"]["name"] != "kserve-tensorflow-serving"
    assert "namespace" not in runtime["metadata"]  # cluster-scoped


def test_the_inference_service_runs_tensorflow_from_a_storage_uri_on_this_runtime(objects):
    service = objects["InferenceService"]
    model = service["spec"]["predictor"]["model"]
    assert model["modelFormat"] == {"name": "tensorflow"}
    assert model["runtime"] == objects["ClusterServingRuntime"]["metadata"]["name"]
    assert model["storageUri"].startswith(("pvc://", "gs://", "s3://"))
    # runtimeVersion would replace the image's tag.
    assert "runtimeVersion" not in model


def test_the_runtimes_command_line_with_the_images_environment_serves_kserves_ports(objects):
    (container,) = objects["ClusterServingRuntime"]["spec"]["containers"]
    name = objects["InferenceService"]["metadata"]["name"]
    # KServe fills {{.Name}} in with the InferenceService's name.
    args = [arg.replace("{{.Name}}", name) for arg in container["args"]]
    command = cli.parse(args)
    assert command.warnings == ()
    image_env = dockerfile_stages()["api"]["env"]
    settings = Settings(**{k.lower(): v for k, v in {**image_env, **command.environment}.items()
                           if k.lower() in Settings.model_fields})  # fmt: skip
    assert (settings.port, settings.grpc_port, settings.host) == (8080, 9000, "0.0.0.0")
    assert (settings.model_name, settings.model_path) == (name, "/mnt/models")
    assert settings.request_timeout_seconds == 60
    # KServe's readiness and Prometheus annotations ask these, on the REST port.
    annotations = objects["ClusterServingRuntime"]["spec"]["annotations"]
    assert annotations["prometheus.kserve.io/port"] == str(settings.port)
