"""The Kubernetes manifests are secure as shipped, checked by rendering every kustomization
(tests/deploy/manifest_harness.py: the pinned kubectl's kustomize; tests/deploy/
test_validation.py validates every object):

- every API container, in every overlay, reads AUTH_TOKENS_FILE from the Secret `api-tokens`
  (key `tokens`), mounted read-only; no Secret is committed;
- a NetworkPolicy selects the API's pods and admits only the ingress controller and
  Prometheus, by namespace and pod labels; TF Serving's admits only the API;
- FEEDBACK_DIR is set only where the feedback component is;
- the service, run with an API container's own environment (AUTH_TOKENS_FILE and HOST, paths
  mapped into a tmp dir; the fake backend), refuses an anonymous prediction and feedback.
"""

from __future__ import annotations

import stat
import subprocess

import pytest
from support.fakes import MODEL_NAME, FakeBackend, app_client
from support.helpers import REPO_ROOT
from support.manifest_harness import (
    KUBE_DIR,
    containers,
    env,
    kustomizations,
    mounts,
    pods,
    policies_for,
    render,
)

API_IMAGE = "estimator-serving-api"
SECRET = "api-tokens"
SECRET_KEY = "tokens"
FEEDBACK_OVERLAYS = {"overlays/feedback"}
INGRESS_PEERS = {("ingress-nginx", "ingress-nginx"), ("monitoring", "prometheus")}


def rendered() -> dict[str, list[dict]]:
    return {str(d.relative_to(KUBE_DIR)): render(d) for d in kustomizations()}


@pytest.fixture(scope="module")
def renders() -> dict[str, list[dict]]:
    return rendered()


def api_pods(objects: list[dict]):
    """(pod, API container) of every API container in the rendered objects."""
    return [
        (pod, c)
        for obj in objects
        for pod in pods(obj)
        for c in containers(pod, init=False)
        if c.get("image", "").split(":")[0] == API_IMAGE
    ]


def token_file_source(pod, container) -> tuple[str | None, str | None, bool]:
    """(Secret name, key, read-only) of the file AUTH_TOKENS_FILE names in this container."""
    path = env(container).get("AUTH_TOKENS_FILE")
    assert path, f"{pod.owner}: AUTH_TOKENS_FILE is not set"
    for mount_path, (volume, read_only) in mounts(pod, container).items():
        folder = mount_path.rstrip("/") + "/"
        if path.startswith(folder) and "secret" in volume:
            name = path.removeprefix(folder)
            items = {i["path"]: i["key"] for i in volume["secret"].get("items", [])}
            return volume["secret"]["secretName"], items.get(name, name), read_only
    return None, None, False


def test_every_overlays_api_reads_its_tokens_from_the_secret(renders):
    checked = set()
    for where, objects in renders.items():
        for pod, c in api_pods(objects):
            assert token_file_source(pod, c) == (SECRET, SECRET_KEY, True), f"{where} {pod.owner}"
            checked.add(where)
    assert checked >= {"base", "overlays/tfserving", "overlays/kserve", "overlays/feedback",
                       "overlays/gpu", "overlays/prometheus-operator", "overlays/tls"}  # fmt: skip


def test_no_secret_is_committed(renders):
    committed = [f"{where}: {o['metadata']['name']}" for where, objects in renders.items()
                 for o in objects if o["kind"] == "Secret"]  # fmt: skip
    assert committed == []
    assert not any("secretGenerator" in p.read_text() for p in KUBE_DIR.rglob("*.yaml"))


def peers(policy: dict) -> list[tuple[dict, list]]:
    """(peer, ports) of every ingress rule's peers; a rule with no `from` admits anyone."""
    found = []
    for rule in policy["spec"].get("ingress", []):
        assert rule.get("from"), f"{policy['metadata']['name']}: a rule admits every source"
        assert rule.get("ports"), f"{policy['metadata']['name']}: a rule admits every port"
        found += [(peer, rule["ports"]) for peer in rule["from"]]
    return found


def test_a_network_policy_admits_only_the_ingress_and_prometheus_to_the_api(renders):
    checked = 0
    for where, objects in renders.items():
        for pod, c in api_pods(objects):
            (policy,) = policies_for(objects, pod.labels)
            assert policy["spec"]["policyTypes"] == ["Ingress"], where
            admitted = set()
            for peer, ports in peers(policy):
                namespace = peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                admitted.add(
                    (namespace, peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"])
                )
                assert "ipBlock" not in peer
                names = {p["port"] for p in ports}
                assert names & {p["name"] for p in c["ports"]}, f"{where}: no port of the API"
            assert admitted == INGRESS_PEERS, where
            checked += 1
    assert checked >= 5


def test_prometheus_reaches_only_the_http_port():
    objects = render(KUBE_DIR / "base")
    (policy,) = [
        o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "api"
    ]
    for peer, ports in peers(policy):
        if peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == "monitoring":
            assert "grpc" not in {p["port"] for p in ports}


@pytest.mark.parametrize("directory", ["overlays/tfserving", "overlays/tfserving-gpu"])
def test_tfserving_admits_only_the_api_on_grpc(directory):
    objects = render(KUBE_DIR / directory)
    (tfserving,) = [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "tfserving"
    ]
    (policy,) = policies_for(objects, tfserving["spec"]["template"]["metadata"]["labels"])
    ((peer, ports),) = peers(policy)
    assert set(peer) == {"podSelector"}, "a peer in this namespace only"
    api_labels = {pod.labels.get("app.kubernetes.io/name") for pod, _ in api_pods(objects)}
    assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": api_labels.pop()}
    assert [p["port"] for p in ports] == ["grpc"]


def tfserving_pods(objects: list[dict]):
    """Every pod that runs TF Serving: the tensorflow/serving image, or KServe's TF Serving
    runtime (an InferenceService predictor whose model format is tensorflow)."""
    found = []
    for obj in objects:
        for pod in pods(obj):
            images = {c.get("image", "").split(":")[0] for c in containers(pod)}
            model = pod.spec.get("model", {}).get("modelFormat", {}).get("name")
            if "tensorflow/serving" in images or model == "tensorflow":
                found.append(pod)
    return found


def test_every_tf_serving_admits_only_the_apis_pods(renders):
    """TF Serving has no authentication: wherever it runs (overlays/tfserving, its GPU
    variant, KServe's runtime in overlays/kserve, this image as that runtime in
    overlays/kserve-runtime), one NetworkPolicy selects its pods and admits the API's pods
    alone, on named ports (the review found KServe's open to every pod)."""
    checked = set()
    for where, objects in renders.items():
        for pod in tfserving_pods(objects):
            # The API's pods' label, as the base's Deployment has it where none is rendered.
            labels = {p.labels["app.kubernetes.io/name"] for p, _ in api_pods(objects)}
            (api_label,) = labels or {API_IMAGE}
            policies = policies_for(objects, pod.labels)
            assert len(policies) == 1, f"{where} {pod.owner}: {len(policies)} NetworkPolicies"
            (policy,) = policies
            assert policy["spec"]["policyTypes"] == ["Ingress"], where
            found = peers(policy)
            assert found, f"{where} {pod.owner}: no rule"
            for peer, _ports in found:  # peers() checked each rule names its ports
                assert set(peer) == {"podSelector"}, f"{where}: a peer in this namespace only"
                assert peer["podSelector"] == {
                    "matchLabels": {"app.kubernetes.io/name": api_label}
                }, where
            checked.add(where)
    assert checked >= {"overlays/tfserving", "overlays/tfserving-gpu", "overlays/kserve",
                       "overlays/kserve-runtime"}  # fmt: skip


def test_feedback_is_on_only_where_the_feedback_component_is(renders):
    on = set()
    for where, objects in renders.items():
        for pod, c in api_pods(objects):
            if "FEEDBACK_DIR" in env(c):
                on.add(where)
                volume, read_only = mounts(pod, c)[env(c)["FEEDBACK_DIR"]]
                assert volume["persistentVolumeClaim"]["claimName"] == "feedback" and not read_only
            else:
                assert "/feedback" not in mounts(pod, c), f"{where}: the store is mounted"
    assert on == FEEDBACK_OVERLAYS


def manifest_environments(renders) -> dict[tuple, str]:
    """{(HOST, AUTH_TOKENS_FILE, FEEDBACK_DIR): where} over every API container."""
    found = {}
    for where, objects in renders.items():
        for _, c in api_pods(objects):
            variables = env(c)
            key = (
                variables.get("HOST"),
                variables.get("AUTH_TOKENS_FILE"),
                variables.get("FEEDBACK_DIR"),
            )
            found.setdefault(key, where)
    return found


def test_the_service_with_a_manifests_environment_refuses_anonymous_calls(
    renders, tmp_path, make_tokens
):
    environments = manifest_environments(renders)
    assert {feedback for _, _, feedback in environments} == {None, "/feedback"}
    for (host, tokens_file, feedback_dir), where in environments.items():
        local = tmp_path / where.replace("/", "-")
        tokens = local / tokens_file.lstrip("/")
        make_tokens.write_tokens(tokens)
        settings = {"host": host, "auth_tokens_file": str(tokens)}
        if feedback_dir:
            settings["feedback_dir"] = str(local / feedback_dir.lstrip("/"))
        with app_client(FakeBackend(), **settings) as client:
            body = {"instances": [[[0.0] * 28] * 28]}
            predict = client.post(f"/v1/models/{MODEL_NAME}:predict", json=body)
            feedback = client.post(
                f"/v1/models/{MODEL_NAME}/feedback", json={**body, "labels": [1]}
            )
            metrics = client.get("/metrics")
        assert (predict.status_code, feedback.status_code, metrics.status_code) == (
            401,
            401,
            401,
        ), where


# --- TLS (components/tls, overlays/tls; `make tls`) ----------------------------------------

TLS_SECRET = "api-tls"
TLS_OVERLAYS = {"overlays/tls"}


def secret_file(pod, container, path: str) -> tuple[str | None, str | None, bool]:
    """(Secret name, key, read-only) of the mounted Secret file at path in this container."""
    for mount_path, (volume, read_only) in mounts(pod, container).items():
        folder = mount_path.rstrip("/") + "/"
        if path.startswith(folder) and "secret" in volume:
            return volume["secret"]["secretName"], path.removeprefix(folder), read_only
    return None, None, False


def test_tls_is_on_only_where_the_tls_component_is_and_reads_the_secret(renders):
    on = set()
    for where, objects in renders.items():
        for pod, c in api_pods(objects):
            variables = env(c)
            if "TLS_CERT_FILE" not in variables:
                assert "TLS_KEY_FILE" not in variables, where
                continue
            on.add(where)
            assert secret_file(pod, c, variables["TLS_CERT_FILE"]) == (TLS_SECRET, "tls.crt", True)
            assert secret_file(pod, c, variables["TLS_KEY_FILE"]) == (TLS_SECRET, "tls.key", True)
            (volume,) = [
                v
                for v in pod.spec["volumes"]
                if v.get("secret", {}).get("secretName") == TLS_SECRET
            ]
            assert volume["secret"]["defaultMode"] & 0o022 == 0, "the key is writable by the group"
            # Every probe asks over HTTPS: a plain HTTP probe of a TLS port always fails.
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert c[probe]["httpGet"]["scheme"] == "HTTPS", f"{where} {probe}"
    assert on == TLS_OVERLAYS


def test_the_tls_overlay_tells_prometheus_and_the_mesh_that_the_ports_speak_tls(renders):
    objects = renders["overlays/tls"]
    ((pod, _),) = api_pods(objects)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert (
        deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scheme"] == "https"
    )
    (service,) = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "api"]
    assert {p["name"]: p["appProtocol"] for p in service["spec"]["ports"]} == {
        "http": "https",
        "grpc": "https",
    }


def make_tls(directory) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", "-C", str(REPO_ROOT), "tls", f"TLS_DIR={directory}"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip


def test_make_tls_writes_a_certificate_for_the_services_names_and_keeps_an_existing_one(tmp_path):
    from cryptography import x509

    directory = tmp_path / "secrets"
    make_tls(directory)
    key, cert = directory / "api-tls.key", directory / "api-tls.crt"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    names = (
        x509.load_pem_x509_certificate(cert.read_bytes())
        .extensions.get_extension_for_class(x509.SubjectAlternativeName)
        .value
    )
    assert {
        "api.estimator-serving.svc",
        "api.estimator-serving.svc.cluster.local",
        "localhost",
    } <= set(names.get_values_for_type(x509.DNSName))
    before = key.read_bytes()
    assert "keeping it" in make_tls(directory).stdout
    assert key.read_bytes() == before
