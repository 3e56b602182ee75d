"""`python -m service` refuses bad settings, unknown arguments and unbindable addresses before
loading anything; `--help` lists the settings.

Fast: these fail before TensorFlow is imported. Most run its `main()` in this process
(`run_main_in_process`); two go through a real `python -m service`, the entry point itself.
"""

from __future__ import annotations

import socket

import pytest
from support.entry import run_main_in_process
from support.servers import free_port, run_service, settings_vars

from service.settings import Settings


def assert_one_error_line_naming(result, *fragments: str) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "name, value",
    [
        pytest.param("PORT", "notanumber", id="port-text"),
        pytest.param("PORT", "70000", id="port-range"),
        pytest.param("DEVICE", "tpu", id="device"),
        pytest.param("MAX_IMAGES", "0", id="max-images"),
        pytest.param("MAX_BODY_BYTES", "10", id="max-body-bytes"),
        pytest.param("MODEL_POLL_SECONDS", "-1", id="poll"),
        pytest.param("MODEL_NAME", "../elsewhere", id="model-name"),
        pytest.param("LOG_LEVEL", "loud", id="log-level"),
        pytest.param("HOST", "999.1.1.1", id="host"),
        pytest.param("GRPC_PORT", "70000", id="grpc-port-range"),
        pytest.param("GRPC_MAX_MESSAGE_BYTES", "10", id="grpc-message-bytes"),
    ],
)
def test_invalid_setting_exits_2_naming_it(tmp_path, name, value):
    result = run_main_in_process(MODEL_BASE_PATH=str(tmp_path), **{name: value})
    assert_one_error_line_naming(result, name)


def test_python_m_service_exits_2_with_the_line_main_prints(tmp_path):
    # The entry point itself: its exit code and stderr are main()'s, as the tests above see them.
    settings = {"MODEL_BASE_PATH": str(tmp_path), "DEVICE": "tpu"}
    result = run_service(timeout=60, **settings)
    line = assert_one_error_line_naming(result, "DEVICE")
    assert result.stdout == ""
    assert line == assert_one_error_line_naming(run_main_in_process(**settings), "DEVICE")


def test_a_grpc_port_equal_to_the_port_exits_2_naming_it(tmp_path):
    port = str(free_port())
    result = run_main_in_process(MODEL_BASE_PATH=str(tmp_path), PORT=port, GRPC_PORT=port)
    assert_one_error_line_naming(result, "GRPC_PORT", f"both {port}")


def test_a_port_in_use_exits_2_before_loading_anything(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_service(timeout=60, MODEL_BASE_PATH=str(tmp_path), PORT=str(port))
    assert_one_error_line_naming(result, "PORT", "in use")


def test_a_grpc_port_in_use_exits_2_before_loading_anything(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        grpc_port = taken.getsockname()[1]
        result = run_main_in_process(
            MODEL_BASE_PATH=str(tmp_path), PORT=str(free_port()), GRPC_PORT=str(grpc_port)
        )
    assert_one_error_line_naming(result, "GRPC_PORT", "in use")


def test_help_exits_0_listing_the_settings_before_reading_them(tmp_path):
    # A setting that would be refused does not stop --help: it is read before the settings.
    result = run_main_in_process(["--help"], MODEL_BASE_PATH=str(tmp_path), DEVICE="tpu")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith(
        "usage: python -m service [-h] [--version] [--flag=value ...]\n"
    )
    assert "\n  DEVICE=auto  (one of: auto, cpu, gpu)\n" in result.stdout


def test_an_unknown_argument_exits_2_naming_it(tmp_path):
    result = run_main_in_process(["--grpc_port", "9000"], MODEL_BASE_PATH=str(tmp_path))
    assert result.stdout == ""
    assert_one_error_line_naming(result, "unknown arguments: --grpc_port 9000", "--help")


def test_python_m_service_help_and_refusal_are_main_s():
    # The entry point passes its own arguments on: --help prints and exits, before any model.
    done = run_service(timeout=60, args=("--help",))
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == run_main_in_process(["--help"]).stdout
    refused = run_service(timeout=60, args=("--model_nam", "fashion_mnist"))
    assert refused.stdout == ""
    assert_one_error_line_naming(refused, "unknown arguments: --model_nam fashion_mnist")


@pytest.mark.parametrize(
    "env, field, expected",
    [
        pytest.param({"DEVICE": "GPU"}, "device", "gpu", id="device-any-case"),
        pytest.param({"log_level": "WARNING"}, "log_level", "warning", id="names-any-case"),
        pytest.param({"BACKEND": "TFServing"}, "backend", "tfserving", id="backend-any-case"),
        pytest.param({"MODEL_POLL_SECONDS": "0"}, "model_poll_seconds", 0.0, id="poll-off"),
    ],
)
def test_settings_read_the_environment(monkeypatch, env, field, expected):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert getattr(Settings(), field) == expected


def test_settings_defaults_match_tf_servings_names():
    settings = Settings()
    assert (settings.model_name, settings.model_base_path) == ("fashion_mnist", "models")
    assert settings.backend == "tensorflow"
    assert settings.grpc_port == 8500


def test_the_tests_read_every_setting_the_service_reads():
    """support.servers.settings_vars reads service/settings.py's source (the training side's
    tests have no pydantic): it must name exactly the fields Settings reads from the
    environment, or a developer's shell could leak a setting into a test's server."""
    assert settings_vars() == {name.upper() for name in Settings.model_fields}
