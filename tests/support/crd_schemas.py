"""JSON Schemas of the custom resources in deploy/kubernetes, built from registry packages.

No CRD's YAML is published in a registry this project can install from, so each schema comes
from a pinned package generated from the project's own API definition:

- TFJob (kubeflow.org/v1): the Kubeflow Training Operator's Python SDK, `kubeflow-training`,
  whose models OpenAPI Generator made from the operator's OpenAPI document.
- InferenceService (serving.kserve.io/v1beta1) and ClusterServingRuntime
  (serving.kserve.io/v1alpha1): KServe's Python SDK, `kserve`, likewise.
- ServiceMonitor and PrometheusRule (monitoring.coreos.com/v1): `cloudcoil-models-prometheus-operator`, pydantic
  models generated from the Prometheus Operator's CRDs (patterns and required fields included).

The two SDK wheels are downloaded (hash-checked against deploy/kubernetes/crd-sdks.txt) into
`<venv>/crd-sdks` by `make setup` and read here as zip files; the cloudcoil models are installed
from requirements-dev.lock. Kubernetes types inside them (pod templates, containers, resource
quantities...) point to kubernetes-validate's strict definitions for the pinned Kubernetes
version, so a pod template in a TFJob is checked exactly like one in a Deployment.

Strict, as `kubectl apply` is by default (server-side field validation "Strict"): an object
field the schema does not name is an error.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import re
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import importlib_resources
import jsonschema
import kubernetes_validate
import referencing
import referencing.jsonschema

from support.helpers import REPO_ROOT

CRD_SDKS_FILE = REPO_ROOT / "deploy" / "kubernetes" / "crd-sdks.txt"
CRD_SDKS_DIR = Path(sys.prefix) / "crd-sdks"
K8S_DEFINITIONS_ID = "https://kubernetes.io/api/_definitions.json"
JSON_SCHEMA = "https://json-schema.org/draft/2020-12/schema"

# Types the SDKs name only inside status objects (Knative's, KEDA's, net/url's), which these
# manifests never set: accepted as anything. Any other unknown name is an error.
STATUS_ONLY_TYPES = re.compile(r"^(Knative\w+|NetUrlUserinfo|GithubComKedacore\w+)$")
# Types the SDKs name without generating a model for them, and what they are.
ALIASES = {"V1beta1MetricQuantity": "ResourceQuantity"}  # kserve: a metric target's quantity
# Types the SDKs name without generating a model for them, and with nothing to stand for them
# exactly: a value of one is refused (no manifest here sets one). kserve 0.21: a
# ServingRuntimeSpec's workerSpec (multi-node serving).
UNMODELED = {"V1alpha1WorkerSpec"}
PRIMITIVES = {
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "bool": {"type": "boolean"},
    "datetime": {"type": "string"},
    "date": {"type": "string"},
    "V1Time": {"type": "string"},
    "object": {},
}


class SchemaSourceMissing(RuntimeError):
    """A pinned schema package is not where `make setup` puts it."""


@dataclass(frozen=True)
class Crd:
    """One custom resource kind and the SDK model that describes it."""

    api_version: str
    kind: str
    package: str  # the pinned package, as in crd-sdks.txt
    models_dir: str  # inside the wheel
    root_model: str  # OpenAPI Generator's class name


SDK_CRDS = (
    Crd("kubeflow.org/v1", "TFJob", "kubeflow-training", "kubeflow/training/models/",
        "KubeflowOrgV1TFJob"),
    Crd("serving.kserve.io/v1beta1", "InferenceService", "kserve", "kserve/models/",
        "V1beta1InferenceService"),
    Crd("serving.kserve.io/v1alpha1", "ClusterServingRuntime", "kserve", "kserve/models/",
        "V1alpha1ClusterServingRuntime"),
)  # fmt: skip


@dataclass
class _Model:
    types: dict[str, str]  # python attribute -> OpenAPI Generator type
    json_keys: dict[str, str]  # python attribute -> JSON key
    required: set[str] = field(default_factory=set)


def pinned_sdks() -> dict[str, tuple[str, str]]:
    """{package: (version, sha256)} from deploy/kubernetes/crd-sdks.txt."""
    text = CRD_SDKS_FILE.read_text().replace("\\\n", " ")
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([\w.-]+)==(\S+)\s+--hash=sha256:([0-9a-f]{64})", line)
        if not match:
            raise ValueError(f"{CRD_SDKS_FILE}: cannot read {line!r}")
        pins[match[1]] = (match[2], match[3])
    return pins


def sdk_wheel(package: str) -> Path:
    """The downloaded wheel of a pinned package, after checking its hash."""
    version, sha256 = pinned_sdks()[package]
    pattern = f"{package.replace('-', '_')}-{version}-*.whl"
    wheels = sorted(CRD_SDKS_DIR.glob(pattern))
    if not wheels:
        raise SchemaSourceMissing(
            f"{CRD_SDKS_DIR}/{pattern} is missing: run `make setup` (it downloads the "
            f"packages pinned in {CRD_SDKS_FILE.relative_to(REPO_ROOT)})"
        )
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    if digest != sha256:
        raise SchemaSourceMissing(f"{wheels[0]}: sha256 {digest}, pinned {sha256}")
    return wheels[0]


@functools.cache
def kubernetes_definitions(kubernetes_version: str) -> dict:
    """kubernetes-validate's strict definitions (`_definitions.json`) for a version."""
    files = importlib_resources.files("kubernetes_validate") / "kubernetes-json-schema"
    path = files / f"v{kubernetes_version}-local-strict" / "_definitions.json"
    return json.loads(path.read_text())


@functools.cache
def _kubernetes_names(kubernetes_version: str) -> dict[str, str]:
    """Python client class names (V1PodTemplateSpec) -> definition keys."""
    names: dict[str, str] = {}
    # core and meta first: their names win over a same-named type of another group.
    keys = sorted(
        kubernetes_definitions(kubernetes_version)["$defs"],
        key=lambda k: (not k.startswith(("io.k8s.api.core.", "io.k8s.apimachinery.")), k),
    )
    for key in keys:
        *_, version, kind = key.split(".")
        names.setdefault(version[:1].upper() + version[1:] + kind, key)
    names["ResourceQuantity"] = names["Quantity"] = "io.k8s.apimachinery.pkg.api.resource.Quantity"
    return names


def _kubernetes_ref(type_name: str, kubernetes_version: str) -> dict | None:
    """{"$ref": ...} for a Kubernetes type the SDKs name, or None when it is not one."""
    match = re.fullmatch(r"K8sIoApi([A-Z][a-z]+)(V\d+(?:(?:alpha|beta)\d+)?)(\w+)", type_name)
    if match:
        key = f"io.k8s.api.{match[1].lower()}.{match[2].lower()}.{match[3]}"
    else:
        key = _kubernetes_names(kubernetes_version).get(type_name)
    if key is None:
        return None
    if key not in kubernetes_definitions(kubernetes_version)["$defs"]:
        raise KeyError(f"{type_name}: no {key} in Kubernetes {kubernetes_version}'s definitions")
    return {"$ref": f"{K8S_DEFINITIONS_ID}#/$defs/{key}"}


def _read_models(wheel: Path, models_dir: str) -> dict[str, _Model]:
    """Every OpenAPI Generator model class in the wheel's models folder, read without import."""
    models = {}
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if not (name.startswith(models_dir) and name.endswith(".py")):
                continue
            source = archive.read(name).decode()
            for node in ast.parse(source).body:
                if not isinstance(node, ast.ClassDef):
                    continue
                tables = {
                    stmt.targets[0].id: ast.literal_eval(stmt.value)
                    for stmt in node.body
                    if isinstance(stmt, ast.Assign)
                    and isinstance(stmt.targets[0], ast.Name)
                    and stmt.targets[0].id in ("openapi_types", "attribute_map")
                }
                if len(tables) == 2:
                    # Generated setters refuse None for required fields.
                    required = set(re.findall(r"client_side_validation and (\w+) is None", source))
                    models[node.name] = _Model(
                        tables["openapi_types"], tables["attribute_map"], required
                    )
    return models


def _sdk_schema(crd: Crd, kubernetes_version: str) -> dict:
    models = _read_models(sdk_wheel(crd.package), crd.models_dir)
    defs: dict[str, dict] = {}

    def type_schema(type_name: str) -> dict | bool:
        type_name = ALIASES.get(type_name.strip(), type_name.strip())
        if type_name in PRIMITIVES:
            return dict(PRIMITIVES[type_name])
        if type_name in UNMODELED:
            return False
        if match := re.fullmatch(r"list\[(.+)\]", type_name):
            return {"type": "array", "items": type_schema(match[1])}
        if match := re.fullmatch(r"dict\(str, (.+)\)", type_name):
            return {"type": "object", "additionalProperties": type_schema(match[1])}
        if type_name in models:
            if type_name not in defs:
                defs[type_name] = {}  # placeholder: models may refer to each other
                defs[type_name] = model_schema(models[type_name])
            return {"$ref": f"#/$defs/{type_name}"}
        if ref := _kubernetes_ref(type_name, kubernetes_version):
            return ref
        if _kubernetes_ref(type_name, kubernetes_validate.latest_version()):
            # The SDK is newer than the pinned Kubernetes: a field of this type does not exist
            # in that version's API, so any value is refused.
            return False
        if STATUS_ONLY_TYPES.match(type_name):
            return {}
        raise KeyError(f"{crd.package}: unknown type {type_name!r}")

    def model_schema(model: _Model) -> dict:
        properties = {
            model.json_keys[attr]: type_schema(type_name) for attr, type_name in model.types.items()
        }
        schema = {"type": "object", "properties": properties, "additionalProperties": False}
        required = sorted(model.json_keys[attr] for attr in model.required)
        if required:
            schema["required"] = required
        return schema

    root = model_schema(models[crd.root_model])
    root["properties"]["apiVersion"] = {"const": crd.api_version}
    root["properties"]["kind"] = {"const": crd.kind}
    root["required"] = sorted({*root.get("required", ()), "apiVersion", "kind", "spec"})
    return {"$schema": JSON_SCHEMA, **root, "$defs": defs}


def _strict(schema):
    """Make every object with named properties refuse other properties (in place), and write
    Go's case-insensitive patterns (`(?i)`, which JSON Schema's regexes lack) as classes."""
    if isinstance(schema, dict):
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
        if isinstance(schema.get("pattern"), str) and "(?i)" in schema["pattern"]:
            schema["pattern"] = _case_insensitive(schema["pattern"].replace("(?i)", ""))
        for value in schema.values():
            _strict(value)
    elif isinstance(schema, list):
        for value in schema:
            _strict(value)
    return schema


def _case_insensitive(pattern: str) -> str:
    """`pattern` matching either case of each letter outside a character class."""
    out, in_class, escaped = [], False, False
    for char in pattern:
        if escaped:
            out.append(char)
            escaped = False
        elif char == "\\":
            out.append(char)
            escaped = True
        elif char in "[]":
            in_class = char == "["
            out.append(char)
        elif char.isalpha() and not in_class:
            out.append(f"[{char.lower()}{char.upper()}]")
        else:
            out.append(char)
    return "".join(out)


# The Prometheus Operator's kinds the manifests use, read from cloudcoil's models.
PROMETHEUS_OPERATOR_KINDS = ("ServiceMonitor", "PrometheusRule")


def _prometheus_operator_schema(kind: str) -> dict:
    from cloudcoil.models.prometheus_operator import v1

    model = getattr(v1, kind)
    schema = _strict(model.model_json_schema(by_alias=True, mode="validation"))
    schema["properties"]["apiVersion"] = {"const": "monitoring.coreos.com/v1"}
    schema["properties"]["kind"] = {"const": kind}
    schema["required"] = ["apiVersion", "kind", "spec"]
    return {"$schema": JSON_SCHEMA, **schema}


@functools.cache
def crd_validator(api_version: str, kind: str, kubernetes_version: str):
    """A jsonschema validator for a custom resource, or None for a kind not known here."""
    if api_version == "monitoring.coreos.com/v1" and kind in PROMETHEUS_OPERATOR_KINDS:
        schema = _prometheus_operator_schema(kind)
    else:
        crd = next((c for c in SDK_CRDS if (c.api_version, c.kind) == (api_version, kind)), None)
        if crd is None:
            return None
        schema = _sdk_schema(crd, kubernetes_version)
    definitions = referencing.Resource.from_contents(
        kubernetes_definitions(kubernetes_version),
        default_specification=referencing.jsonschema.DRAFT202012,
    )
    registry = referencing.Registry().with_resource(K8S_DEFINITIONS_ID, definitions)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, registry=registry)


CRD_KINDS = {
    *(("monitoring.coreos.com/v1", kind) for kind in PROMETHEUS_OPERATOR_KINDS),
    *((crd.api_version, crd.kind) for crd in SDK_CRDS),
}
