"""Every kustomization renders, and every object passes strict schema validation, offline.

Built-in kinds: kubernetes-validate in strict mode against KUBERNETES_VERSION. Custom
resources (TFJob, InferenceService, ServiceMonitor): the schemas of crd_schemas.py, equally
strict. The validator is shown to refuse broken objects, so a pass means something.
"""

from __future__ import annotations

import copy

import pytest
import yaml
from support.manifest_harness import (
    JOBS_DIR,
    KUBE_DIR,
    KUBERNETES_VERSION,
    kustomizations,
    load_plain,
    name_of,
    plain_manifests,
    render,
    run_kubectl,
    validation_errors,
)

# Every directory that must build; a new overlay is picked up by kustomizations() and must be
# added here, so that one silently failing to be found cannot pass.
EXPECTED_KUSTOMIZATIONS = {
    "model-repository",
    "access",
    "base",
    "overlays/tfserving",
    "overlays/tfserving-gpu",
    "overlays/gpu",
    "overlays/hpa-in-flight",
    "overlays/prometheus-operator",
    "overlays/distributed-training",
    "overlays/kserve",
    "overlays/kserve-runtime",
    "overlays/feedback",
    "overlays/tls",
}


def test_every_kustomization_is_known():
    found = {str(path.relative_to(KUBE_DIR)) for path in kustomizations()}
    assert found == EXPECTED_KUSTOMIZATIONS


@pytest.mark.parametrize("directory", sorted(EXPECTED_KUSTOMIZATIONS))
def test_kustomization_renders_and_every_object_validates(directory):
    objects = render(KUBE_DIR / directory)
    assert objects, f"{directory} rendered nothing"
    problems = {name_of(obj): validation_errors(obj) for obj in objects}
    assert {name: errors for name, errors in problems.items() if errors} == {}


@pytest.mark.parametrize("path", plain_manifests(), ids=lambda p: p.name)
def test_job_template_validates(path):
    objects = load_plain(path)
    assert [obj["kind"] for obj in objects] == ["Job"]
    assert validation_errors(objects[0]) == []


def test_promote_job_gets_its_version_offline():
    """README's command: `kubectl set env --local` fills VERSION without a cluster."""
    text = run_kubectl("set", "env", "--local", "-f", str(JOBS_DIR / "promote.yaml"),
                       "VERSION=7", "-o", "yaml")  # fmt: skip
    (job,) = [doc for doc in yaml.safe_load_all(text) if doc]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert {"name": "VERSION", "value": "7"} in container["env"]
    assert validation_errors(job) == []


def test_kubernetes_version_is_pinned_and_available():
    import kubernetes_validate.utils

    assert KUBERNETES_VERSION in kubernetes_validate.utils.all_versions()


# --- the validator refuses what a cluster would refuse --------------------------------------


def _object(directory: str, kind: str) -> dict:
    """The first object of a kind (for InferenceService: the one on KServe's TF Serving)."""
    objects = [o for o in render(KUBE_DIR / directory) if o["kind"] == kind]
    if kind == "InferenceService":
        objects = [o for o in objects if "model" in o["spec"]["predictor"]]
    return copy.deepcopy(objects[0])


def _misspell_container_image(obj):
    container = obj["spec"]["template"]["spec"]["containers"][0]
    container["imagee"] = container.pop("image")


def _misspell_probe_path(obj):
    obj["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pathh"] = "/"


def _string_replicas(obj):
    obj["spec"]["minReplicas"] = "two"


def _misspell_pod_failure_policy(obj):
    rule = obj["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"][0]
    rule["onExitCode"] = rule.pop("onExitCodes")


def _misspell_tfjob_replica_specs(obj):
    obj["spec"]["tfReplicaSpec"] = obj["spec"].pop("tfReplicaSpecs")


def _misspell_tfjob_pod_field(obj):
    # Deep inside the CRD: the pod template is checked with Kubernetes' own definitions.
    worker = obj["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    worker["containers"][0]["volumeMount"] = worker["containers"][0].pop("volumeMounts")


def _misspell_storage_uri(obj):
    model = obj["spec"]["predictor"]["model"]
    model["storageURI"] = model.pop("storageUri")


def _misspell_runtime_args(obj):
    obj["spec"]["containers"][0]["arg"] = obj["spec"]["containers"][0].pop("args")


def _runtime_priority_as_text(obj):
    obj["spec"]["supportedModelFormats"][0]["priority"] = "high"


def _misspell_service_monitor_endpoints(obj):
    obj["spec"]["endpoint"] = obj["spec"].pop("endpoints")


def _bad_scrape_interval(obj):
    obj["spec"]["endpoints"][0]["interval"] = "15 seconds"


def _unknown_api_version(obj):
    obj["apiVersion"] = "apps/v2"


BROKEN = [
    pytest.param("base", "Deployment", _misspell_container_image, "imagee", id="deployment-field"),
    pytest.param("base", "Deployment", _misspell_probe_path, "pathh", id="deployment-nested"),
    pytest.param("base", "HorizontalPodAutoscaler", _string_replicas, "two", id="hpa-type"),
    pytest.param("base", "CronJob", _misspell_pod_failure_policy, "onExitCode",
                 id="cronjob-policy"),
    pytest.param("overlays/distributed-training", "TFJob", _misspell_tfjob_replica_specs,
                 "tfReplicaSpec", id="tfjob-field"),
    pytest.param("overlays/distributed-training", "TFJob", _misspell_tfjob_pod_field,
                 "volumeMount", id="tfjob-pod-template"),
    pytest.param("overlays/kserve", "InferenceService", _misspell_storage_uri, "storageURI",
                 id="inferenceservice-field"),
    pytest.param("overlays/kserve-runtime", "ClusterServingRuntime", _misspell_runtime_args,
                 "arg", id="servingruntime-container"),
    pytest.param("overlays/kserve-runtime", "ClusterServingRuntime", _runtime_priority_as_text,
                 "high", id="servingruntime-type"),
    pytest.param("overlays/prometheus-operator", "ServiceMonitor",
                 _misspell_service_monitor_endpoints, "endpoint", id="servicemonitor-field"),
    pytest.param("overlays/prometheus-operator", "ServiceMonitor", _bad_scrape_interval,
                 "15 seconds", id="servicemonitor-pattern"),
    pytest.param("base", "Deployment", _unknown_api_version, "apps/v2", id="unknown-kind"),
]  # fmt: skip


@pytest.mark.parametrize(("directory", "kind", "breakage", "culprit"), BROKEN)
def test_validator_refuses_broken_objects(directory, kind, breakage, culprit):
    obj = _object(directory, kind)
    assert validation_errors(obj) == [], "the unbroken object must pass first"
    breakage(obj)
    errors = validation_errors(obj)
    assert errors, f"{kind} with {culprit!r} was accepted"
    assert culprit in " ".join(errors), errors


def test_validator_refuses_a_field_newer_than_the_pinned_kubernetes():
    """kserve's SDK knows Kubernetes 1.34+ container restart rules; 1.31 does not."""
    obj = _object("overlays/kserve", "InferenceService")
    obj["spec"]["predictor"]["model"]["restartPolicyRules"] = [{"action": "Restart"}]
    assert validation_errors(obj)
