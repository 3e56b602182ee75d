"""The trainers' pods in the rendered manifests have the least they need (docs/security.md,
"Models are code"; docs/kubernetes.md, "Retrain nightly"):

- the nightly retrain, which runs the serving version's SavedModel (a program), mounts the
  model repository read-only and writes only its staging volume and /tmp;
- the publish step, the only one of the CronJob's containers that writes the repository,
  starts after the retrain (a container after its init containers), runs `publish` on what
  the retrain staged, reads the staging read-only and shares no other writable volume with it;
- the feedback expiry runs only where feedback is on, writing the feedback volume alone;
- none of them has a network: a NetworkPolicy selects them with no rule at all.
"""

from __future__ import annotations

import pytest
from support.manifest_harness import (
    KUBE_DIR,
    argv,
    containers,
    entrypoints,
    kustomizations,
    load_plain,
    mounts,
    plain_manifests,
    pods,
    policies_for,
    render,
)

STAGING_PVC = "retrain-staging"
MODEL_PVC = "model-repository"
FEEDBACK_PVC = "feedback"
FEEDBACK_OVERLAYS = {"overlays/feedback"}
OFFLINE_COMPONENTS = {"train", "retrain", "promote", "expire-feedback"}


@pytest.fixture(scope="module")
def renders() -> dict[str, list[dict]]:
    return {str(d.relative_to(KUBE_DIR)): render(d) for d in kustomizations()}


def command(container: dict) -> list[str]:
    """The training subcommand and its arguments ([] for anything else)."""
    line = argv(container, entrypoints())
    return line[3:] if line[:3] == ["python", "-m", "training"] else []


def option(args: list[str], name: str) -> str | None:
    return next((args[i + 1] for i, a in enumerate(args[:-1]) if a == name), None)


def writable(pod, container) -> dict[str, str]:
    """{mount path: volume kind or claim} of what the container may write."""
    found = {}
    for path, (volume, read_only) in mounts(pod, container).items():
        if not read_only:
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            found[path] = claim or next(k for k in volume if k != "name")
    return found


def retrain_pods(renders):
    return [
        (where, pod)
        for where, objects in renders.items()
        for obj in objects
        if obj["kind"] == "CronJob" and obj["metadata"]["name"] == "retrain"
        for pod in pods(obj)
    ]


def test_the_retrain_reads_the_repository_and_writes_only_its_staging(renders):
    checked = set()
    for where, pod in retrain_pods(renders):
        (retrain,) = [c for c in containers(pod) if command(c)[:1] == ["retrain"]]
        assert retrain in pod.spec["initContainers"], f"{where}: the retrain must finish first"
        args = command(retrain)
        assert option(args, "--stage-to") and option(args, "--publish") is None, where
        assert writable(pod, retrain) == {"/staging": STAGING_PVC, "/tmp": "emptyDir"}, where
        for path, (volume, read_only) in mounts(pod, retrain).items():
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            if claim in (MODEL_PVC, FEEDBACK_PVC):
                assert read_only, f"{where}: {path}"
        checked.add(where)
    assert {"base", "overlays/feedback", "overlays/gpu", "overlays/tfserving"} <= checked


def test_the_publish_step_runs_after_the_retrain_on_what_it_staged(renders):
    for where, pod in retrain_pods(renders):
        init = [c["name"] for c in pod.spec["initContainers"]]
        assert init == ["seed-model-config", "retrain"], where
        (publish,) = pod.spec["containers"]
        retrain_args, publish_args = command(pod.spec["initContainers"][1]), command(publish)
        assert publish_args[0] == "publish", where
        assert option(publish_args, "--staged") == option(retrain_args, "--stage-to"), where
        for flag in ("--export-dir", "--config"):
            assert option(publish_args, flag) == option(retrain_args, flag), (where, flag)
        assert option(publish_args, "--publish") == "canary", where
        assert writable(pod, publish) == {"/models": MODEL_PVC, "/tmp": "emptyDir"}, where
        assert mounts(pod, publish)["/staging"][1] is True, f"{where}: staging read-only"
        assert "/feedback" not in mounts(pod, publish), where
        # Nothing the retrain wrote reaches the publish step but the staging it checks.
        shared = {
            m["name"] for m in pod.spec["initContainers"][1]["volumeMounts"]
            if not m.get("readOnly")
        } & {m["name"] for m in publish["volumeMounts"]}  # fmt: skip
        assert shared == {"staging"}, where


def test_feedback_expires_only_where_feedback_is_on_writing_only_the_store(renders):
    on = set()
    for where, objects in renders.items():
        apis = [
            c for obj in objects if obj["kind"] == "Deployment"
            for pod in pods(obj) for c in containers(pod) if c["name"] == "api"
        ]  # fmt: skip
        feedback_dirs = {
            e["value"] for c in apis for e in c.get("env", []) if e["name"] == "FEEDBACK_DIR"
        }
        for obj in objects:
            if obj["kind"] != "CronJob" or obj["metadata"]["name"] != "expire-feedback":
                continue
            on.add(where)
            ((pod,),) = [pods(obj)]
            (c,) = containers(pod)
            args = command(c)
            assert args[0] == "expire-feedback" and float(option(args, "--max-age-days")) > 0
            assert {option(args, "--feedback-dir")} == feedback_dirs, where
            api_model = {
                e["value"] for a in apis for e in a.get("env", []) if e["name"] == "MODEL_NAME"
            }
            assert option(args, "--model") in (api_model or {"fashion_mnist"}), where
            assert writable(pod, c) == {option(args, "--feedback-dir"): FEEDBACK_PVC,
                                        "/tmp": "emptyDir"}, where  # fmt: skip
    assert on == FEEDBACK_OVERLAYS


def test_the_trainers_have_no_network(renders):
    """Selected by a policy of both types with no rule: nothing in, nothing out. The plain Job
    templates (train, promote) are created beside the base, whose policy covers them; the
    TFJob's tasks talk to each other and are not selected."""
    checked = set()
    for where, objects in renders.items():
        for obj in objects:
            for pod in pods(obj):
                component = pod.labels.get("app.kubernetes.io/component")
                offline = [p for p in policies_for(objects, pod.labels) if is_deny_all(p)]
                assert bool(offline) == (component in OFFLINE_COMPONENTS), f"{where} {pod.owner}"
                checked.add(component)
    for path in plain_manifests():
        for obj in load_plain(path):
            for pod in pods(obj):
                assert any(is_deny_all(p) for p in policies_for(renders["base"], pod.labels))
                checked.add(pod.labels["app.kubernetes.io/component"])
    assert OFFLINE_COMPONENTS | {"train-distributed"} <= checked


def is_deny_all(policy: dict) -> bool:
    spec = policy["spec"]
    return (
        set(spec["policyTypes"]) == {"Ingress", "Egress"}
        and not spec.get("ingress")
        and not spec.get("egress")
    )
