"""What the rendered manifests promise, checked against the code and the container setup.

Security context, resources and probes on every pod; probe paths and ports that match the
service's settings (service/settings.py, read here); a grace period that covers the service's
drain; training commands that the training CLI's own parser accepts; images that the
Dockerfile's targets build (as docker-compose.yml names them); one model repository layout and
config path shared by every server and trainer.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from support.manifest_harness import (
    KUBE_DIR,
    NAMESPACE,
    REPO_ROOT,
    Pod,
    all_objects,
    argv,
    compose_images,
    containers,
    dockerfile_stages,
    entrypoints,
    env,
    mounts,
    name_of,
    pods,
    port_number,
    render,
    repository,
    training_commands,
)

MODELS_DIR = REPO_ROOT / "models"
API_IMAGE = "estimator-serving-api"
TRAINER_IMAGE = "estimator-serving-trainer"
TF_SERVING_IMAGE = "tensorflow/serving"
MODEL_PVC = "model-repository"
FEEDBACK_PVC = "feedback"
STAGING_PVC = "retrain-staging"
# Between the end of the service's shutdown and SIGKILL.
GRACE_MARGIN_SECONDS = 5
TF_REPLICA_TYPES = {"Chief", "Worker", "PS", "Evaluator"}
TFSERVING = ("Deployment", "tfserving")


# --- fixtures and small helpers -------------------------------------------------------------


@pytest.fixture(scope="module")
def objects() -> list[tuple[str, dict]]:
    return list(all_objects())


@pytest.fixture(scope="module")
def all_pods(objects) -> list[tuple[str, Pod]]:
    return [(where, pod) for where, obj in objects for pod in pods(obj)]


def tag(image: str) -> str:
    return image.rsplit(":", 1)[1]


def settings_default(name: str):
    from service.settings import Settings

    return Settings.model_fields[name.lower()].default


def setting(container: dict, name: str) -> str:
    """A service setting as the container gets it: its env, else the image's, else default."""
    value = env(container).get(name, dockerfile_stages()["api"]["env"].get(name))
    return str(settings_default(name) if value is None else value)


def api_containers(all_pods) -> list[tuple[str, Pod, dict]]:
    found = [
        (where, pod, c)
        for where, pod in all_pods
        for c in containers(pod, init=False)
        if repository(c.get("image", "")) == API_IMAGE
    ]
    assert len(found) >= 5, "expected the API in base, overlays and KServe"
    return found


def quantity(text) -> float:
    """A Kubernetes quantity ("100m", "2", "1Gi") as a number."""
    units = {"m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20,
             "Gi": 2**30, "Ti": 2**40}  # fmt: skip
    number, unit = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text)).groups()
    return float(number) * units[unit]


def option(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name:
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def mount_of(pod: Pod, container: dict, path: str) -> tuple[str, bool]:
    """(claim name, read-only) of the volume holding path in this container."""
    best = None
    for mount_path, (volume, read_only) in mounts(pod, container).items():
        if (path == mount_path or path.startswith(mount_path.rstrip("/") + "/")) and (
            best is None or len(mount_path) > len(best[0])
        ):
            best = (mount_path, volume, read_only)
    assert best is not None, f"{pod.owner} {container['name']}: nothing mounted at {path}"
    claim = best[1].get("persistentVolumeClaim", {}).get("claimName")
    assert claim, f"{pod.owner} {container['name']}: {path} is not on a persistent volume"
    return claim, best[2]


# --- every pod ------------------------------------------------------------------------------


CLUSTER_SCOPED = {"Namespace", "ClusterServingRuntime"}


def test_every_namespaced_object_is_in_the_namespace(objects):
    wrong = [
        f"{where}: {name_of(obj)}"
        for where, obj in objects
        if obj["kind"] not in CLUSTER_SCOPED and obj["metadata"].get("namespace") != NAMESPACE
    ]
    assert wrong == []


def test_every_pod_meets_the_restricted_security_profile(all_pods):
    problems = []
    for where, pod in all_pods:
        spec, pod_security = pod.spec, pod.spec.get("securityContext", {})
        for key, expected in (("automountServiceAccountToken", False),
                              ("enableServiceLinks", False),
                              ("serviceAccountName", "estimator-serving")):  # fmt: skip
            if spec.get(key) != expected:
                problems.append(f"{where} {pod.owner}: {key} is not {expected}")
        for c in containers(pod):
            security = {**pod_security, **c.get("securityContext", {})}
            checks = {
                "runAsNonRoot": security.get("runAsNonRoot") is True,
                "numeric non-root runAsUser": isinstance(security.get("runAsUser"), int)
                and security["runAsUser"] != 0,
                "seccompProfile RuntimeDefault": security.get("seccompProfile", {}).get("type")
                == "RuntimeDefault",
                "allowPrivilegeEscalation false": security.get("allowPrivilegeEscalation") is False,
                "readOnlyRootFilesystem": security.get("readOnlyRootFilesystem") is True,
                "drops ALL capabilities": security.get("capabilities", {}).get("drop") == ["ALL"]
                and not security.get("capabilities", {}).get("add"),
                "not privileged": not security.get("privileged"),
            }
            problems += [
                f"{where} {pod.owner} {c['name']}: {k}" for k, ok in checks.items() if not ok
            ]
    assert problems == []


def test_every_container_has_cpu_and_memory_requests_within_limits(all_pods):
    problems = []
    for where, pod in all_pods:
        for c in containers(pod):
            resources = c.get("resources", {})
            for resource in ("cpu", "memory"):
                request = resources.get("requests", {}).get(resource)
                limit = resources.get("limits", {}).get(resource)
                if request is None or limit is None:
                    problems.append(f"{where} {pod.owner} {c['name']}: {resource} request/limit")
                elif quantity(request) > quantity(limit):
                    problems.append(
                        f"{where} {pod.owner} {c['name']}: {resource} {request}>{limit}"
                    )
    assert problems == []


def test_every_main_container_has_a_writable_tmp(all_pods):
    """The root filesystem is read-only; TensorFlow and TF Serving write to /tmp (and so does
    the retrain, an init container)."""
    missing = []
    for where, pod in all_pods:
        pythons = [c for c in containers(pod) if argv(c, entrypoints())[:1] == ["python"]]
        for c in {id(c): c for c in containers(pod, init=False) + pythons}.values():
            volume = next((v for path, (v, _) in mounts(pod, c).items() if path == "/tmp"), None)
            if volume is None or "emptyDir" not in volume:
                missing.append(f"{where} {pod.owner} {c['name']}")
    assert missing == []


def test_servers_have_startup_readiness_and_liveness_probes(all_pods):
    """Deployments and the KServe custom predictor; KServe's own TF Serving runtime is KServe's."""
    missing = []
    for where, pod in all_pods:
        if pod.kind not in ("Deployment", "InferenceService"):
            continue
        for c in pod.spec.get("containers", []):
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if probe not in c:
                    missing.append(f"{where} {pod.owner} {c['name']}: {probe}")
    assert missing == []
    assert any(pod.kind == "Deployment" for _, pod in all_pods)


# --- the API against the service's settings --------------------------------------------------


def test_the_shipped_logs_are_json(all_pods):
    """Every API logs JSON lines, and every scheduled training command (the retrain
    CronJob's, the feedback expiry's) too: a cluster's log pipeline parses them."""
    text = {
        f"{where} {pod.owner}"
        for where, pod, c in api_containers(all_pods)
        if setting(c, "LOG_FORMAT") != "json"
    }
    scheduled = [
        (label, args)
        for label, args, pod, c in training_commands(all_pods)
        if pod.kind == "CronJob"
    ]
    assert {args[0] for _, args in scheduled} >= {"retrain", "publish", "expire-feedback"}
    text |= {label for label, args in scheduled if option(args, "--log-format") != "json"}
    assert text == set()


def test_api_env_names_are_service_settings(all_pods):
    """Settings ignores unknown variables: a misspelled name would be silently dropped."""
    from service.settings import Settings

    known = {name.upper() for name in Settings.model_fields}
    unknown = {
        f"{where} {pod.owner}: {name}"
        for where, pod, c in api_containers(all_pods)
        for name in env(c)
        if name not in known
    }
    assert unknown == set()


def test_api_probes_and_ports_match_the_service_settings(all_pods):
    for where, pod, c in api_containers(all_pods):
        label = f"{where} {pod.owner}"
        port = int(setting(c, "PORT"))
        assert setting(c, "HOST") in ("0.0.0.0", "::"), f"{label}: probes cannot reach HOST"
        for probe, path in (("startupProbe", "/readyz"), ("readinessProbe", "/readyz"),
                            ("livenessProbe", "/healthz")):  # fmt: skip
            http = c[probe]["httpGet"]
            assert http["path"] == path, f"{label}: {probe}"
            assert port_number(c, http["port"]) == port, f"{label}: {probe} port"
        ports = {p.get("name"): p["containerPort"] for p in c["ports"]}
        assert port in ports.values(), f"{label}: PORT {port} is not a container port"
        grpc_port = int(setting(c, "GRPC_PORT"))
        if grpc_port:
            assert ports.get("grpc") == grpc_port, f"{label}: GRPC_PORT"
        else:
            assert "grpc" not in ports, f"{label}: gRPC is off but a port is named grpc"


def test_api_scrape_annotations_point_at_the_metrics_port(objects):
    for where, obj in objects:
        if obj["kind"] != "Deployment" or obj["metadata"]["name"] != "api":
            continue
        template = obj["spec"]["template"]
        (c,) = template["spec"]["containers"]
        annotations = template["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == setting(c, "PORT"), where
        assert annotations["prometheus.io/path"] == "/metrics", where


def test_termination_grace_covers_prestop_drain_and_shutdown(all_pods):
    """SIGKILL comes terminationGracePeriodSeconds after the preStop hook starts."""
    checked = 0
    for where, pod, c in api_containers(all_pods):
        pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
        drain = float(setting(c, "DRAIN_SECONDS"))
        shutdown = float(setting(c, "SHUTDOWN_TIMEOUT_SECONDS"))
        grace = pod.spec["terminationGracePeriodSeconds"]
        assert pre_stop >= 1, f"{where} {pod.owner}: no pause for the endpoints to update"
        assert grace >= pre_stop + drain + shutdown + GRACE_MARGIN_SECONDS, (
            f"{where} {pod.owner}: grace {grace} s < preStop {pre_stop} + drain {drain} + "
            f"shutdown {shutdown} + margin {GRACE_MARGIN_SECONDS}"
        )
        checked += 1
    assert checked


def test_every_server_deployment_pauses_before_sigterm(objects):
    for where, obj in objects:
        if obj["kind"] == "Deployment":
            for c in obj["spec"]["template"]["spec"]["containers"]:
                assert c["lifecycle"]["preStop"]["sleep"]["seconds"] >= 1, f"{where} {c['name']}"


def test_services_select_pods_and_target_their_ports():
    checked = 0
    for directory in (KUBE_DIR / "base", KUBE_DIR / "overlays" / "tfserving"):
        objects = render(directory)
        workloads = [o for o in objects if o["kind"] == "Deployment"]
        for service in (o for o in objects if o["kind"] == "Service"):
            selector = service["spec"]["selector"]
            (target,) = [
                w for w in workloads
                if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
            ]  # fmt: skip
            (c,) = target["spec"]["template"]["spec"]["containers"]
            for port in service["spec"]["ports"]:
                assert port_number(c, port["targetPort"]) == port["port"], (service, port)
                if repository(c["image"]) == API_IMAGE:
                    name = {"http": "PORT", "grpc": "GRPC_PORT"}[port["name"]]
                    assert port["port"] == int(setting(c, name)), (service, port)
                checked += 1
    assert checked == 6  # api http and grpc (twice), tfserving grpc and rest


def test_hpa_owns_the_api_replicas_and_the_pdb_covers_its_pods():
    objects = {(o["kind"], o["metadata"]["name"]): o for o in render(KUBE_DIR / "base")}
    hpa = objects["HorizontalPodAutoscaler", "api"]
    ref = hpa["spec"]["scaleTargetRef"]
    deployment = objects[ref["kind"], ref["name"]]
    assert "replicas" not in deployment["spec"], "an apply would reset the HPA's count"
    assert hpa["spec"]["minReplicas"] >= 2
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 60
    pdb = objects["PodDisruptionBudget", "api"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] < hpa["spec"]["minReplicas"]


def test_custom_metric_overlay_scales_on_requests_in_flight():
    (hpa,) = [o for o in render(KUBE_DIR / "overlays" / "hpa-in-flight")
              if o["kind"] == "HorizontalPodAutoscaler"]  # fmt: skip
    metrics = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert metrics["Pods"]["pods"]["metric"]["name"] == "http_requests_in_flight"
    assert metrics["Pods"]["pods"]["target"]["type"] == "AverageValue"
    assert metrics["Resource"]["resource"]["name"] == "cpu"


# --- images ----------------------------------------------------------------------------------


def test_images_are_the_dockerfile_targets_and_tf_serving_of_the_compose_files(all_pods):
    import tomllib

    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    known = compose_images()
    stages = dockerfile_stages()
    seen = set()
    for where, pod in all_pods:
        for c in containers(pod):
            image = c.get("image")
            if image is None:  # KServe's runtime picks the TF Serving image
                continue
            assert image in known, f"{where} {pod.owner} {c['name']}: {image}"
            target = known[image]
            seen.add(image)
            if target is None:
                continue
            assert target in stages, image
            assert tag(image) in (version, f"{version}-gpu"), image
            command = argv(c, entrypoints())
            if target == "api":
                # The image's entry point: tensorflow_model_server, which is `python -m service`
                # (test_containers.py); with no arguments, the environment's settings.
                assert command == ["/usr/bin/tf_serving_entrypoint.sh"], f"{where} {pod.owner}"
            elif c in pod.spec.get("containers", []):
                assert command[:3] == ["python", "-m", "training"], f"{where} {pod.owner}"
    expected = {f"{API_IMAGE}:{version}", f"{TRAINER_IMAGE}:{version}",
                f"{API_IMAGE}:{version}-gpu", f"{TRAINER_IMAGE}:{version}-gpu"}  # fmt: skip
    assert expected <= seen
    assert {i for i in seen if repository(i) == TF_SERVING_IMAGE} == {
        i for i in known if repository(i) == TF_SERVING_IMAGE
    }


# --- training commands ----------------------------------------------------------------------


# Where each training command's paths live: (claim, read-only). The retrain only reads the
# repository and writes its staging volume; the publish step reads the staging and writes the
# repository; expire-feedback alone writes the feedback besides the API.
PATH_MOUNTS = {
    ("train", "--export-dir"): (MODEL_PVC, False),
    ("train", "--model-dir"): (MODEL_PVC, False),
    ("retrain", "--export-dir"): (MODEL_PVC, True),
    ("retrain", "--config"): (MODEL_PVC, True),
    ("retrain", "--feedback-dir"): (FEEDBACK_PVC, True),
    ("retrain", "--model-dir"): (STAGING_PVC, False),
    ("retrain", "--stage-to"): (STAGING_PVC, False),
    ("publish", "--export-dir"): (MODEL_PVC, False),
    ("publish", "--config"): (MODEL_PVC, False),
    ("publish", "--staged"): (STAGING_PVC, True),
    ("promote", "--config"): (MODEL_PVC, False),
    ("expire-feedback", "--feedback-dir"): (FEEDBACK_PVC, False),
}


def test_every_path_agrees_on_one_model_repository(all_pods):
    """Trainers export where the servers look, and edit the config file the servers read;
    each path on the volume and with the access PATH_MOUNTS gives it."""
    apis = api_containers(all_pods)
    export_dirs = {
        f"{setting(c, 'MODEL_BASE_PATH')}/{setting(c, 'MODEL_NAME')}" for _, _, c in apis
    }
    config_files = {setting(c, "MODEL_CONFIG_FILE") for _, _, c in apis}
    # Feedback is on only where an overlay turns it on (components/feedback).
    feedback_dirs = {env(c)["FEEDBACK_DIR"] for _, _, c in apis if "FEEDBACK_DIR" in env(c)}
    assert len(export_dirs) == len(config_files) == len(feedback_dirs) == 1
    for where, pod, c in apis:
        paths = [(setting(c, "MODEL_BASE_PATH"), MODEL_PVC, True)]
        if "FEEDBACK_DIR" in env(c):
            paths.append((env(c)["FEEDBACK_DIR"], FEEDBACK_PVC, False))
        for path, claim, read_only in paths:
            assert mount_of(pod, c, path) == (claim, read_only), f"{where} {pod.owner} {path}"
    checked = set()
    for label, args, pod, c in training_commands(all_pods):
        for flag, expected in (("--export-dir", export_dirs), ("--config", config_files),
                               ("--feedback-dir", feedback_dirs)):  # fmt: skip
            value = option(args, flag)
            if value is not None:
                assert {value} == expected, f"{label}: {flag} {value}"
        for (command, flag), mount in PATH_MOUNTS.items():
            if args[0] == command and (value := option(args, flag)) is not None:
                assert mount_of(pod, c, value) == mount, f"{label}: {flag} {value}"
                checked.add((command, flag))
    assert checked == set(PATH_MOUNTS)
    # Seeded where it is read: the init containers copy the seed to that very path.
    (config_file,) = config_files
    seeds = [
        c for _, pod in all_pods for c in pod.spec.get("initContainers", [])
        if c["name"] == "seed-model-config"
    ]  # fmt: skip
    assert seeds and all(config_file in " ".join(c["command"]) for c in seeds)


def test_models_config_copies_are_the_models_folder_files():
    copies = {
        KUBE_DIR / "model-repository" / "models.config": MODELS_DIR / "models.config",
        KUBE_DIR / "overlays" / "tfserving" / "batching_parameters.txt":
            MODELS_DIR / "batching_parameters.txt",
        KUBE_DIR / "overlays" / "tfserving" / "monitoring.config":
            MODELS_DIR / "monitoring.config",
    }  # fmt: skip
    for copy, original in copies.items():
        assert copy.read_text() == original.read_text(), f"{copy} differs from {original}"


def test_models_config_points_into_the_repository_the_servers_mount(all_pods):
    text = (KUBE_DIR / "model-repository" / "models.config").read_text()
    base_paths = set(re.findall(r'base_path:\s*"([^"]+)"', text))
    (_, _, c), *_ = api_containers(all_pods)
    assert base_paths == {f"{setting(c, 'MODEL_BASE_PATH')}/{setting(c, 'MODEL_NAME')}"}


# --- TF Serving ------------------------------------------------------------------------------


def tfserving_deployment(directory: str) -> dict:
    objects = render(KUBE_DIR / directory)
    (deployment,) = [o for o in objects if (o["kind"], o["metadata"]["name"]) == TFSERVING]
    return deployment


def test_tfserving_runs_with_the_flags_of_docker_compose():
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())["services"]
    wanted = dict(flag.split("=", 1) for flag in compose["tfserving"]["command"])
    (c,) = tfserving_deployment("overlays/tfserving")["spec"]["template"]["spec"]["containers"]
    assert c["command"] == compose["tfserving"]["entrypoint"]
    assert c["image"] == compose["tfserving"]["image"]
    flags = dict(flag.split("=", 1) for flag in c["args"])
    assert wanted.keys() <= flags.keys()
    for name, value in wanted.items():
        if name in ("--batching_parameters_file", "--monitoring_config_file"):
            # Mounted from the tfserving-config ConfigMap (copies of models/ files).
            assert Path(flags[name]).name == Path(value).name, name
        else:
            assert flags[name] == value, name
    assert int(flags["--port"]) == port_number(c, "grpc")
    assert int(flags["--rest_api_port"]) == port_number(c, "rest")


def test_tfserving_is_ready_only_with_an_available_version(all_pods):
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())["services"]
    health = compose["tfserving"]["healthcheck"]["test"]
    (c,) = tfserving_deployment("overlays/tfserving")["spec"]["template"]["spec"]["containers"]
    (_, _, api), *_ = api_containers(all_pods)
    for probe in ("startupProbe", "readinessProbe"):
        command = c[probe]["exec"]["command"]
        # Not an httpGet: the model status answers 200 while no version is AVAILABLE.
        assert command == health[1:], probe
        assert '"AVAILABLE"' in command[-1]
        assert f"/v1/models/{setting(api, 'MODEL_NAME')} " in command[-1]


def test_the_api_in_the_tfserving_overlay_calls_tfserving():
    objects = render(KUBE_DIR / "overlays" / "tfserving")
    (api,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "api"]
    (c,) = api["spec"]["template"]["spec"]["containers"]
    host, port = env(c)["TFSERVING_GRPC_ADDRESS"].split(":")
    assert env(c)["BACKEND"] == "tfserving"
    (service,) = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == host]
    assert int(port) in {p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc"}


# --- retraining and distributed training ----------------------------------------------------


def test_retrain_cronjob_never_retries_not_blessed_or_refused():
    (cron,) = [o for o in render(KUBE_DIR / "base") if o["kind"] == "CronJob"]
    spec, job = cron["spec"], cron["spec"]["jobTemplate"]["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["startingDeadlineSeconds"] > 0
    assert spec["successfulJobsHistoryLimit"] >= 1 and spec["failedJobsHistoryLimit"] >= 1
    assert job["activeDeadlineSeconds"] > 0
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy requires it
    (publish,) = pod["containers"]
    retrain = pod["initContainers"][-1]
    assert argv(retrain, entrypoints())[3] == "retrain"
    assert option(argv(publish, entrypoints()), "--publish") == "canary"
    rules = job["podFailurePolicy"]["rules"]
    exit_rules = [r for r in rules if "onExitCodes" in r]
    for rule in exit_rules:
        assert rule["onExitCodes"]["containerName"] in (retrain["name"], publish["name"])
        assert rule["onExitCodes"]["operator"] == "In"

    # The first matching rule wins: exit 3 must meet FailJob first, never Ignore (which
    # would retry it forever) or Count (which would retry it up to backoffLimit).
    def first(container, code):
        return next(
            r["action"] for r in exit_rules
            if r["onExitCodes"]["containerName"] == container["name"]
            and code in r["onExitCodes"]["values"]
        )  # fmt: skip

    assert first(retrain, 3) == first(retrain, 2) == first(publish, 2) == "FailJob"
    assert all(r["action"] != "Ignore" for r in exit_rules)


def test_tfjob_runs_one_training_command_on_every_task(all_pods):
    (tfjob,) = [o for o in render(KUBE_DIR / "overlays" / "distributed-training")
                if o["kind"] == "TFJob"]  # fmt: skip
    replicas = tfjob["spec"]["tfReplicaSpecs"]
    assert set(replicas) == TF_REPLICA_TYPES
    assert replicas["Chief"]["replicas"] == 1 and replicas["Evaluator"]["replicas"] == 1
    assert tfjob["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"  # ps never exits
    commands = set()
    for role, replica in replicas.items():
        spec = replica["template"]["spec"]
        assert "restartPolicy" not in spec, f"{role}: the operator sets it from the replica spec"
        (c,) = spec["containers"]
        assert c["name"] == "tensorflow", f"{role}: the operator injects TF_CONFIG there"
        assert "TF_CONFIG" not in env(c), role
        assert any(p["name"] == "tfjob-port" for p in c["ports"]), role
        commands.add(tuple(argv(c, entrypoints())))
    (command,) = commands
    assert command[3] == "train"


# --- KServe and GPU --------------------------------------------------------------------------


def test_kserve_serves_the_same_repository():
    objects = {o["metadata"]["name"]: o for o in render(KUBE_DIR / "overlays" / "kserve")
               if o["kind"] == "InferenceService"}  # fmt: skip
    custom = objects["fashion-mnist-api"]["spec"]["predictor"]
    (c,) = custom["containers"]
    assert repository(c["image"]) == API_IMAGE
    assert [p["containerPort"] for p in c["ports"]] == [int(setting(c, "PORT"))]
    model = objects["fashion-mnist-tfserving"]["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == "tensorflow"
    assert model["storageUri"] == f"pvc://{MODEL_PVC}/{setting(c, 'MODEL_NAME')}"
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())["services"]
    assert model["runtimeVersion"] == tag(compose["tfserving"]["image"])


@pytest.mark.parametrize("directory", ["overlays/gpu", "overlays/tfserving-gpu"])
def test_gpu_overlays_put_gpu_images_on_gpus(directory):
    """Every container with a GPU runs a -gpu image; the API and the retrain (an init
    container) get the GPU their -gpu image is for. The publish step and the config's seed
    share the trainer's image but load no model: no GPU."""
    gpu_containers = 0
    for obj in render(KUBE_DIR / directory):
        for pod in pods(obj):
            for c in containers(pod):
                has_gpu = "nvidia.com/gpu" in c["resources"]["limits"]
                if has_gpu or repository(c["image"]) == API_IMAGE or c["name"] == "retrain":
                    assert has_gpu == tag(c["image"]).endswith("-gpu"), f"{pod.owner} {c['name']}"
                if has_gpu:
                    gpu_containers += 1
                    tolerated = {t.get("key") for t in pod.spec.get("tolerations", [])}
                    assert "nvidia.com/gpu" in tolerated, pod.owner
                    if repository(c["image"]) == API_IMAGE:
                        assert env(c)["DEVICE"] == "gpu"
    assert gpu_containers >= 1


def test_service_monitor_scrapes_the_api_and_tfserving_metrics():
    objects = render(KUBE_DIR / "overlays" / "prometheus-operator")
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    services = [
        o for o in objects
        if o["kind"] == "Service" and selector.items() <= o["metadata"]["labels"].items()
    ]  # fmt: skip
    assert [s["metadata"]["name"] for s in services] == ["api"]
    endpoints = {e["port"]: e["path"] for e in monitor["spec"]["endpoints"]}
    assert endpoints["http"] == "/metrics"
    # TF Serving's path, as models/monitoring.config serves it.
    monitoring = (MODELS_DIR / "monitoring.config").read_text()
    assert f'path: "{endpoints["rest"]}"' in monitoring
    tfserving = render(KUBE_DIR / "overlays" / "tfserving")
    assert any(
        o["kind"] == "Service" and selector.items() <= o["metadata"]["labels"].items()
        and "rest" in {p["name"] for p in o["spec"]["ports"]}
        for o in tfserving
    )  # fmt: skip
