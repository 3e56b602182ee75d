"""`tensorflow_model_server`'s flags (service/cli.py): every one TF Serving has is taken, with its
name, type and default; those that apply set their setting and win over its environment
variable, the others are accepted with one warning line; anything else is refused in one line.

The table below is written from TF Serving's own sources (tensorflow_serving/model_servers/
main.cc, the flag list, and server.h/server.cc, Server::Options and its defaults), not from
service/cli.py: a flag the service lost, or one whose type or default it misstates, fails here.
"""

from __future__ import annotations

import tomllib

import pytest
from support.entry import run_main_in_process
from support.helpers import REPO_ROOT

from service import cli
from service.settings import Settings, config_variable, initial_entries

# TF Serving's flags: name -> (type, default). "4 per CPU" and "1 per CPU" are the defaults
# computed from the machine's CPUs (port::NumSchedulableCPUs()).
TF_SERVING_FLAGS = {
    "port": ("int32", "8500"),
    "grpc_socket_path": ("string", ""),
    "rest_api_port": ("int32", "0"),
    "rest_api_num_threads": ("int32", "4 per CPU"),
    "rest_api_timeout_in_ms": ("int32", "30000"),
    "rest_api_enable_cors_support": ("bool", "false"),
    "enable_batching": ("bool", "false"),
    "allow_version_labels_for_unavailable_models": ("bool", "false"),
    "batching_parameters_file": ("string", ""),
    "enable_per_model_batching_parameters": ("bool", "false"),
    "model_config_file": ("string", ""),
    "model_config_file_poll_wait_seconds": ("int32", "0"),
    "model_name": ("string", "default"),
    "model_base_path": ("string", ""),
    "num_load_threads": ("int32", "0"),
    "num_unload_threads": ("int32", "0"),
    "max_num_load_retries": ("int32", "5"),
    "load_retry_interval_micros": ("int64", "60000000"),
    "file_system_poll_wait_seconds": ("int32", "1"),
    "flush_filesystem_caches": ("bool", "true"),
    "tensorflow_session_parallelism": ("int64", "0"),
    "tensorflow_session_config_file": ("string", ""),
    "tensorflow_intra_op_parallelism": ("int64", "0"),
    "tensorflow_inter_op_parallelism": ("int64", "0"),
    "use_alts_credentials": ("bool", "false"),
    "ssl_config_file": ("string", ""),
    "platform_config_file": ("string", ""),
    "per_process_gpu_memory_fraction": ("float", "0"),
    "saved_model_tags": ("string", "serve"),
    "grpc_channel_arguments": ("string", ""),
    "grpc_max_threads": ("int32", "4 per CPU"),
    "enable_model_warmup": ("bool", "true"),
    "num_request_iterations_for_warmup": ("int32", "0"),
    "monitoring_config_file": ("string", ""),
    "remove_unused_fields_from_bundle_metagraph": ("bool", "true"),
    "prefer_tflite_model": ("bool", "false"),
    "num_tflite_pools": ("int32", "1 per CPU"),
    "num_tflite_interpreters_per_pool": ("int32", "1"),
    "enable_signature_method_name_check": ("bool", "false"),
    "xla_cpu_compilation_enabled": ("bool", "false"),
    "xla_gpu_compilation_enabled": ("bool", "false"),
    "enable_profiler": ("bool", "true"),
    "thread_pool_factory_config_file": ("string", ""),
    "mixed_precision": ("string", ""),
    "skip_initialize_tpu": ("bool", "false"),
    "enable_grpc_healthcheck_service": ("bool", "false"),
    "enable_serialization_as_tensor_content": ("bool", "false"),
}

# The flags that apply here (issue #36's list, and one more): flag -> (environment variable,
# the value a given flag puts there, what the flag was given).
APPLIED = {
    "port": ("GRPC_PORT", "9000", "9000"),
    "grpc_socket_path": ("GRPC_SOCKET_PATH", "/run/tfs.sock", "/run/tfs.sock"),
    "rest_api_port": ("PORT", "8080", "8080"),
    "rest_api_num_threads": ("HTTP_THREADS", "4", "4"),
    "rest_api_timeout_in_ms": ("REQUEST_TIMEOUT_SECONDS", "60.0", "60000"),
    "model_name": ("MODEL_NAME", "x", "x"),
    "model_base_path": ("MODEL_PATH", "/mnt/models", "/mnt/models"),
    "model_config_file": ("MODEL_CONFIG_FILE", "/m/models.config", "/m/models.config"),
    "model_config_file_poll_wait_seconds": ("MODEL_CONFIG_FILE_POLL_SECONDS", "60", "60"),
    "file_system_poll_wait_seconds": ("MODEL_POLL_SECONDS", "5", "5"),
    "enable_batching": ("ENABLE_BATCHING", "false", "false"),
    "batching_parameters_file": ("BATCHING_PARAMETERS_FILE", "/m/b.txt", "/m/b.txt"),
    "monitoring_config_file": ("MONITORING_CONFIG_FILE", "/m/mon.config", "/m/mon.config"),
    "ssl_config_file": ("SSL_CONFIG_FILE", "/m/ssl.config", "/m/ssl.config"),
    "enable_model_warmup": ("ENABLE_MODEL_WARMUP", "false", "false"),
    "allow_version_labels_for_unavailable_models": (
        "ALLOW_VERSION_LABELS_FOR_UNAVAILABLE_MODELS", "true", "true"),
    "tensorflow_intra_op_parallelism": ("INTRA_OP_THREADS", "2", "2"),
    "tensorflow_inter_op_parallelism": ("INTER_OP_THREADS", "3", "3"),
    "enable_serialization_as_tensor_content": ("GRPC_TENSOR_CONTENT", "true", "true"),
}  # fmt: skip

# Where the service's default differs from TF Serving's, and why (docs/operations.md's table
# says the same): flag -> the service's default, in the flag's units.
DIFFERENT_DEFAULTS = {
    "rest_api_port": 8000,  # REST is this service's front door; the image sets 8501
    "rest_api_num_threads": 1,  # measured: one HTTP thread beside the event loop
    "enable_batching": True,  # at BATCH_TIMEOUT_MS=0, only requests arriving while busy join
    "model_name": "fashion_mnist",  # `make serve`'s model; the image sets `model`
    "file_system_poll_wait_seconds": 2,
    "tensorflow_inter_op_parallelism": 1,  # measured best here
}


def test_every_tf_serving_flag_is_known_with_its_type_and_default():
    assert {flag.name: (flag.kind, flag.tf_default) for flag in cli.FLAGS} == TF_SERVING_FLAGS


def test_the_flags_that_apply_are_the_issues_and_each_sets_a_setting():
    applied = {flag.name: flag.setting for flag in cli.FLAGS if flag.applies}
    assert applied == {name: variable for name, (variable, _, _) in APPLIED.items()}
    for variable in applied.values():
        assert variable.lower() in Settings.model_fields, variable
    # One flag per setting: flags and variables map one to one.
    assert len(set(applied.values())) == len(applied)


@pytest.mark.parametrize("name", sorted(APPLIED))
def test_a_flag_sets_its_variable(name):
    variable, value, given = APPLIED[name]
    command = cli.parse([f"--{name}={given}"])
    assert command.environment == {variable: value}
    assert command.flags == {variable: f"--{name}"}
    assert command.warnings == ()


@pytest.mark.parametrize("name", sorted(APPLIED))
def test_a_flags_default_is_tf_servings_or_a_stated_difference(name):
    flag = cli.FLAGS_BY_NAME[name]
    field = Settings.model_fields[flag.setting.lower()]
    default = field.default
    if isinstance(default, float) and flag.scale != 1:
        default = round(default / flag.scale)
    if name in DIFFERENT_DEFAULTS:
        assert default == DIFFERENT_DEFAULTS[name]
        return
    tf_default = flag.tf_default
    if flag.kind == "bool":
        assert default is (tf_default == "true")
    elif flag.kind == "string":
        assert default in (None, tf_default)
    else:
        assert default == int(tf_default)


@pytest.mark.parametrize(
    "argv, value",
    [
        pytest.param(["--enable_batching"], "true", id="alone"),
        pytest.param(["--enable_batching=true"], "true", id="true"),
        pytest.param(["--enable_batching=1"], "true", id="one"),
        pytest.param(["--enable_batching=false"], "false", id="false"),
        pytest.param(["--enable_batching=0"], "false", id="zero"),
        pytest.param(["--enable_batching=true", "--enable_batching=false"], "false", id="last"),
    ],
)
def test_a_bool_flag_reads_as_tf_serving_reads_it(argv, value):
    assert cli.parse(argv).environment == {"ENABLE_BATCHING": value}


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(["--enable_batching=yes"], "argument --enable_batching: invalid bool value: "
                     "'yes'", id="bool"),
        pytest.param(["--port=abc"], "argument --port: invalid int value: 'abc'", id="int"),
        pytest.param(["--port"], "argument --port: expected one argument", id="no-value"),
        pytest.param(["--nonexistent_flag=1"], "unknown argument: --nonexistent_flag=1 (",
                     id="unknown"),
    ],
)  # fmt: skip
def test_a_bad_flag_is_one_line(argv, message):
    with pytest.raises(cli.UsageError) as refused:
        cli.parse(argv)
    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)


def test_kserves_tensorflow_serving_runtime_arguments():
    # KServe's kserve-tensorflow-serving ClusterServingRuntime (config/runtimes/), as
    # deploy/kubernetes/kserve/ ships it with this image.
    command = cli.parse(["--model_name=flowers", "--port=9000", "--rest_api_port=8080",
                         "--model_base_path=/mnt/models", "--rest_api_timeout_in_ms=60000"])  # fmt: skip
    assert command.environment == {
        "MODEL_NAME": "flowers",
        "GRPC_PORT": "9000",
        "PORT": "8080",
        "MODEL_PATH": "/mnt/models",
        "REQUEST_TIMEOUT_SECONDS": "60.0",
    }
    assert command.warnings == ()


def test_a_flag_that_does_not_apply_is_accepted_with_one_warning_naming_it():
    command = cli.parse(["--enable_profiler=false", "--grpc_channel_arguments=a=1", "--port=1"])
    assert command.environment == {"GRPC_PORT": "1"}
    assert len(command.warnings) == 2
    assert command.warnings[0].startswith("--enable_profiler: TF Serving's flag does not apply")
    assert command.warnings[1].startswith("--grpc_channel_arguments: ")


def test_main_warns_of_an_ignored_flag_and_goes_on(tmp_path):
    # It goes on, as far as a refusal of something else: the warning came first, in one line.
    result = run_main_in_process(["--enable_profiler", "--flush_filesystem_caches=false"],
                                 MODEL_BASE_PATH=str(tmp_path), DEVICE="tpu")  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2
    assert lines[0].startswith("warning: --enable_profiler: ")
    assert lines[1].startswith("warning: --flush_filesystem_caches: ")
    assert lines[2].startswith("error: DEVICE: ")
    assert len(lines) == 3


def test_a_flag_wins_over_its_variable_and_its_errors_name_the_flag(tmp_path):
    result = run_main_in_process(["--rest_api_port=70000"], PORT="8000",
                                 MODEL_BASE_PATH=str(tmp_path))  # fmt: skip
    (line,) = result.stderr.strip().splitlines()
    assert result.returncode == 2
    assert line.startswith("error: --rest_api_port (PORT): Input should be less than or equal")


def test_an_unknown_flag_exits_2_in_one_line(tmp_path):
    result = run_main_in_process(["--model_nme=x"], MODEL_BASE_PATH=str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.startswith("error: unknown argument: --model_nme=x (")
    assert result.stderr.count("\n") == 1


def test_version_says_the_server_and_tensorflow_and_exits_0():
    result = run_main_in_process(["--version"], DEVICE="tpu")
    assert (result.returncode, result.stderr) == (0, "")
    server, library = result.stdout.splitlines()
    expected = (
        f"TensorFlow ModelServer: estimator-serving {cli.VERSION} (TensorFlow Serving's APIs)"
    )
    assert server == expected
    assert library.startswith("TensorFlow Library: 2.")


def test_help_lists_every_flag_that_applies_and_names_the_others():
    text = cli.build_parser().format_help()
    for flag in cli.FLAGS:
        assert f"--{flag.name}" in text, flag.name
        if flag.applies:
            assert f"{flag.setting}: {flag.about}" in " ".join(text.split()), flag.name
    assert "(--rest_api_port)" in text  # the settings' list names the flag that sets one


def test_tensorflow_model_server_is_installed_as_the_same_main():
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["tensorflow_model_server"] == "service.__main__:main"


def test_model_base_path_is_the_models_own_folder(tmp_path):
    # TF Serving's --model_base_path holds the version folders themselves; MODEL_BASE_PATH (the
    # image's variable) is the repository, the model's folder under it named MODEL_NAME.
    folder = tmp_path / "mnt" / "models"
    (folder / "1").mkdir(parents=True)
    settings = Settings(model_name="flowers", model_path=str(folder), model_base_path="/nowhere")
    (entry,) = initial_entries(settings)
    assert (entry.name, entry.base_path) == ("flowers", folder)
    assert config_variable(settings) == "MODEL_PATH"
    (entry,) = initial_entries(Settings(model_name="flowers", model_base_path=str(tmp_path)))
    assert entry.base_path == tmp_path / "flowers"


@pytest.mark.parametrize(
    "env, fragments",
    [
        pytest.param({"PORT": "0", "GRPC_PORT": "0"}, ["nothing to serve on"], id="no-port"),
        pytest.param({"ENABLE_BATCHING": "false", "BATCHING_PARAMETERS_FILE": "{file}"},
                     ["BATCHING_PARAMETERS_FILE is set, and ENABLE_BATCHING=false"],
                     id="batching-file-without-batching"),
        pytest.param({"MONITORING_CONFIG_FILE": "{missing}"}, ["MONITORING_CONFIG_FILE=",
                     "no such file"], id="missing-file"),
        pytest.param({"GRPC_SOCKET_PATH": "{missing}/grpc.sock"},
                     ["GRPC_SOCKET_PATH: ", "does not exist"], id="socket-folder"),
        pytest.param({"GRPC_SOCKET_PATH": "{file}"}, ["GRPC_SOCKET_PATH: ",
                     "exists and is not a socket"], id="socket-not-a-socket"),
        pytest.param({"GRPC_SOCKET_PATH": "/tmp/x.sock", "WORKERS": "2"},
                     ["GRPC_SOCKET_PATH takes one process"], id="socket-workers"),
    ],
)  # fmt: skip
def test_settings_that_cannot_serve_exit_2_in_one_line(tmp_path, env, fragments):
    file = tmp_path / "file.txt"
    file.write_text("")
    values = {k: v.format(file=file, missing=tmp_path / "missing") for k, v in env.items()}
    result = run_main_in_process(MODEL_BASE_PATH=str(tmp_path), **values)
    (line,) = result.stderr.strip().splitlines()
    assert result.returncode == 2 and line.startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in line, line


def test_rest_api_port_0_is_grpc_only():
    settings = Settings(port=0, grpc_port=8500)
    assert (settings.port, settings.grpc_port) == (0, 8500)
    assert Settings(port=0, grpc_port=0, grpc_socket_path="/tmp/s.sock").port == 0
