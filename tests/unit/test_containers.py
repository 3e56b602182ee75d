"""The container setup, checked without a Docker engine (none runs here).

`docker-compose config` (Debian's docker-compose, installed by `make setup`) must accept
docker-compose.yml alone and with the GPU override; the parsed result must say what the
README promises. The TF Serving config files must parse as TF Serving's protos, and the
Dockerfile must have its stages, a non-root user and a health check.
"""

from __future__ import annotations

import re

from support.compose import env, port_bindings
from support.helpers import REPO_ROOT

SERVICES = {"api", "tfserving", "api-tfserving", "trainer", "retrain", "publish"}
TF_SERVING_IMAGE = re.compile(r"^tensorflow/serving:2\.15\.\d+$")
TF_SERVING_GPU_IMAGE = re.compile(r"^tensorflow/serving:2\.15\.\d+-gpu$")


def published(service: dict) -> dict[int, int]:
    """{container port: host port}."""
    return {target: host_port for _, host_port, target in port_bindings(service)}


def mounts(service: dict) -> dict[str, tuple[str, str]]:
    """{container path: (host path, mode)} of the bind mounts and volumes."""
    result = {}
    for volume in service.get("volumes", []):
        source, target, *mode = volume.split(":")
        result[target] = (source, mode[0] if mode else "rw")
    return result


def test_compose_file_has_the_six_services(config):
    assert set(config["services"]) == SERVICES


def test_api_runs_in_process_on_8000(config):
    api = config["services"]["api"]
    assert api["build"]["target"] == "api"
    assert env(api)["BACKEND"] == "tensorflow"
    assert env(api)["MODEL_BASE_PATH"] == "/models"
    assert published(api) == {8000: 8000}
    assert mounts(api)["/models"] == (str(REPO_ROOT / "models"), "ro")


def test_tfserving_is_the_official_pinned_image_on_the_shared_repository(config):
    tfserving = config["services"]["tfserving"]
    assert TF_SERVING_IMAGE.match(tfserving["image"]), tfserving["image"]
    assert published(tfserving) == {8500: 8500, 8501: 8501}
    assert mounts(tfserving)["/models"] == (str(REPO_ROOT / "models"), "ro")
    flags = dict(flag.split("=", 1) for flag in tfserving["command"])
    assert flags["--port"] == "8500" and flags["--rest_api_port"] == "8501"
    assert flags["--enable_batching"] == "true"
    # Every config file it is given is in ./models, which is mounted at /models.
    for flag in ("--model_config_file", "--batching_parameters_file", "--monitoring_config_file"):
        assert flags[flag].startswith("/models/"), flags[flag]
        assert (REPO_ROOT / "models" / flags[flag].removeprefix("/models/")).is_file(), flag
    assert "/v1/models/fashion_mnist" in " ".join(tfserving["healthcheck"]["test"])


def test_api_tfserving_waits_for_a_healthy_tfserving(config):
    service = config["services"]["api-tfserving"]
    assert service["build"]["target"] == "api"
    assert env(service)["BACKEND"] == "tfserving"
    assert env(service)["TFSERVING_GRPC_ADDRESS"] == "tfserving:8500"
    assert service["depends_on"] == {"tfserving": {"condition": "service_healthy"}}
    assert published(service) == {8000: 8001}
    assert mounts(service)["/models"][1] == "ro"


def test_trainer_is_a_profile_that_writes_the_shared_repository(config):
    trainer = config["services"]["trainer"]
    assert trainer["profiles"] == ["train"]
    assert trainer["build"]["target"] == "trainer"
    assert mounts(trainer)["/models"] == (str(REPO_ROOT / "models"), "rw")
    assert mounts(trainer)["/app/runs"][0] in config["volumes"]


def options_of(service: dict) -> dict[str, str]:
    command = service["command"]
    return dict(zip(command[1::2], command[2::2], strict=True))


def test_retrain_is_a_profile_that_reads_the_repository_and_the_apis_feedback(feedback_config):
    """The retrain runs the serving version's model: it may write its runs and staging only."""
    config = feedback_config
    services = config["services"]
    retrain, trainer = services["retrain"], services["trainer"]
    assert retrain["profiles"] == ["retrain"]
    assert retrain["image"] == trainer["image"] and retrain["build"]["target"] == "trainer"
    assert retrain["command"][0] == "retrain"
    options = options_of(retrain)
    assert "--publish" not in options and options["--stage-to"].startswith("/app/runs/")
    # Warm-starts from the trainer's runs, judges against the versions the APIs serve, reads
    # the config they read and the feedback they write; writes only the runs volume.
    assert options["--model-dir"] == "/app/runs/fashion_mnist"
    assert mounts(retrain)["/app/runs"] == mounts(trainer)["/app/runs"]
    assert options["--export-dir"] == f"{env(services['api'])['MODEL_BASE_PATH']}/fashion_mnist"
    assert options["--config"] == env(services["api"])["MODEL_CONFIG_FILE"]
    assert mounts(retrain)["/models"] == (str(REPO_ROOT / "models"), "ro")
    assert {path for path, (_, mode) in mounts(retrain).items() if mode == "rw"} == {"/app/runs"}
    for name in ("api", "api-tfserving"):
        feedback_dir = env(services[name])["FEEDBACK_DIR"]
        assert feedback_dir == options["--feedback-dir"], name
        assert mounts(services[name])[feedback_dir] == (mounts(retrain)[feedback_dir][0], "rw")
    assert mounts(retrain)[options["--feedback-dir"]][1] == "ro"
    assert mounts(retrain)[options["--feedback-dir"]][0] in config["volumes"]


def test_publish_is_the_retrains_second_step_and_alone_writes_the_repository(config):
    services = config["services"]
    retrain, publish = services["retrain"], services["publish"]
    assert publish["profiles"] == ["retrain"] and publish["image"] == retrain["image"]
    assert publish["command"][0] == "publish"
    staged, options = options_of(retrain), options_of(publish)
    assert options["--staged"] == staged["--stage-to"]
    assert options["--export-dir"] == staged["--export-dir"]
    assert options["--config"] == staged["--config"]
    assert options["--publish"] == "canary"
    assert mounts(publish)["/models"] == (str(REPO_ROOT / "models"), "rw")
    assert mounts(publish)["/app/runs"] == (mounts(retrain)["/app/runs"][0], "ro")
    assert {path for path, (_, mode) in mounts(publish).items() if mode == "rw"} == {"/models"}


def test_feedback_expires_in_a_profile_that_writes_only_the_store(config, feedback_config):
    assert "expire-feedback" not in config["services"]
    services = feedback_config["services"]
    expire = services["expire-feedback"]
    assert expire["profiles"] == ["expire-feedback"] and expire["command"][0] == "expire-feedback"
    options = options_of(expire)
    assert options["--feedback-dir"] == env(services["api"])["FEEDBACK_DIR"]
    assert options["--model"] == env(services["api"])["MODEL_NAME"]
    assert float(options["--max-age-days"]) > 0
    source = mounts(services["api"])[options["--feedback-dir"]][0]
    assert mounts(expire) == {options["--feedback-dir"]: (source, "rw")}


def test_the_trainers_have_no_network(feedback_config):
    services = feedback_config["services"]
    for name in ("retrain", "publish", "expire-feedback"):
        assert services[name]["network_mode"] == "none", name


def test_gpu_override_uses_gpu_images_and_reserves_gpus(gpu_config):
    services = gpu_config["services"]
    assert set(services) == SERVICES
    assert TF_SERVING_GPU_IMAGE.match(services["tfserving"]["image"])
    for name in ("api", "tfserving", "trainer"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices), name
    for name in ("api", "trainer"):
        assert services[name]["build"]["args"]["TENSORFLOW_EXTRAS"] == "and-cuda", name
        assert services[name]["image"].endswith("-gpu")
    assert env(services["api"])["DEVICE"] == "gpu"
    # The rest of the base file still holds.
    assert services["api-tfserving"]["depends_on"]["tfserving"]["condition"] == "service_healthy"
    assert mounts(services["tfserving"])["/models"][1] == "ro"


def test_tf_serving_config_files_parse():
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    from service import config_files

    models = REPO_ROOT / "models"
    config = text_format.Parse(
        (models / "models.config").read_text(), model_server_config_pb2.ModelServerConfig()
    )
    (model,) = config.model_config_list.config
    assert model.name == "fashion_mnist"
    assert model.base_path == "/models/fashion_mnist"
    assert model.model_platform == "tensorflow"
    assert model.model_version_policy.WhichOneof("policy_choice") == "latest"
    # BatchingParameters and MonitoringConfig, as the service reads them (TF Serving's messages,
    # field for field: service/config_files.py).
    batching = config_files.parse_text_file(
        models / "batching_parameters.txt", config_files.BatchingParameters(), "batching"
    )
    for field in ("max_batch_size", "batch_timeout_micros", "max_enqueued_batches"):
        assert batching.HasField(field), field
    monitoring = config_files.parse_text_file(
        models / "monitoring.config", config_files.MonitoringConfig(), "monitoring"
    )
    assert monitoring.prometheus_config.enable
    assert monitoring.prometheus_config.path == "/monitoring/prometheus/metrics"


def test_dockerfile_stages_user_and_healthcheck():
    text = (REPO_ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+(\S+)\s+AS\s+(\S+)", text, re.MULTILINE)
    assert {name for _, name in stages} >= {"api-deps", "trainer-deps", "api", "trainer"}
    assert stages[-1][1] == "api", "the default target (last stage) should be the API"
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)", text, re.MULTILINE).group(1)
    assert re.match(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?$", base), base
    # Dependencies are installed before the code is copied (their own cached layer).
    assert text.index("requirements-training.lock") < text.index("COPY training")
    assert text.index("requirements-service.lock") < text.index("COPY service")
    assert re.search(r"^USER app$", text, re.MULTILINE)
    assert re.search(r"^HEALTHCHECK .*", text, re.MULTILINE)
    assert '"python", "-m", "service.healthcheck"' in text
    assert "dataset-fashion-mnist" in text


def test_the_api_image_is_tensorflow_serving_s_drop_in():
    """tensorflow/serving's ports, variables and entry point: its quickstart's `docker run` and
    manifests that run /usr/bin/tensorflow_model_server with its flags work unchanged."""
    from support.manifest_harness import dockerfile_stages

    text = (REPO_ROOT / "Dockerfile").read_text()
    api = dockerfile_stages()["api"]
    assert {k: api["env"][k] for k in ("PORT", "GRPC_PORT", "MODEL_NAME", "MODEL_BASE_PATH")} == {
        "PORT": "8501", "GRPC_PORT": "8500", "MODEL_NAME": "model", "MODEL_BASE_PATH": "/models"
    }  # fmt: skip
    api_stage = text[text.index("AS api\n") :]
    assert re.search(r"^EXPOSE 8500 8501$", api_stage, re.MULTILINE)
    # The entry point passes its arguments on, to TF Serving's binary name, which is the
    # service's main; no CMD of the base image's is left to be taken for an argument.
    assert api["entrypoint"] == ["/usr/bin/tf_serving_entrypoint.sh"] and api["cmd"] == []
    scripts = dict(re.findall(r"printf '(#!/bin/sh\\n[^']*)' > (\S+)", api_stage))
    assert {path: body.replace("\\n", "\n") for body, path in scripts.items()} == {
        "/usr/bin/tensorflow_model_server": '#!/bin/sh\nexec /opt/venv/bin/python -m service "$@"\n',
        "/usr/bin/tf_serving_entrypoint.sh": '#!/bin/sh\nexec /usr/bin/tensorflow_model_server "$@"\n',
    }


def test_both_apis_and_tf_serving_read_one_model_config(config):
    services = config["services"]
    flags = [f for f in services["tfserving"]["command"] if f.startswith("--model_config_file=")]
    (tf_serving_file,) = [f.split("=", 1)[1] for f in flags]
    for name in ("api", "api-tfserving"):
        environment = services[name]["environment"]
        assert environment["MODEL_CONFIG_FILE"] == tf_serving_file, name
        assert float(environment["MODEL_CONFIG_FILE_POLL_SECONDS"]) > 0, name


def test_the_stop_grace_period_covers_the_drain_and_the_shutdown(config):
    from service.settings import Settings

    defaults = Settings()
    needed = defaults.drain_seconds + defaults.shutdown_timeout_seconds
    for name in ("api", "api-tfserving"):
        grace = config["services"][name]["stop_grace_period"]
        seconds = float(str(grace).rstrip("s")) if not isinstance(grace, int | float) else grace
        assert seconds > needed, (name, grace, needed)


def test_the_api_images_own_environment_serves_anyone_with_a_warning(tmp_path):
    """The image listens on every interface and, as tensorflow/serving's, answers anyone without
    AUTH_TOKENS_FILE (ALLOW_ANONYMOUS=true), saying so in one WARNING line; the compose files
    and the Kubernetes manifests give it tokens. Outside the image the refusal stays."""
    import logging

    from support.entry import run_main_in_process
    from support.manifest_harness import dockerfile_stages

    from service.security import anonymous_refusal, open_access_notice

    image_env = dockerfile_stages()["api"]["env"]
    host = image_env["HOST"]
    assert (host, image_env["ALLOW_ANONYMOUS"]) == ("0.0.0.0", "true")
    assert anonymous_refusal(host, None, allow_anonymous=True) is None
    level, _ = open_access_notice(host, None)
    assert level == logging.WARNING
    result = run_main_in_process(HOST=host, MODEL_BASE_PATH=str(tmp_path))
    assert result.returncode == 2 and "ALLOW_ANONYMOUS=true" in result.stderr
