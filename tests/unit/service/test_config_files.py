"""TF Serving's server config files (service/config_files.py): BatchingParameters,
MonitoringConfig and SSLConfig text files parsed into messages with TF Serving's own field
numbers and types, good files read as TF Serving reads them, bad ones refused in one line
naming the variable, the file and the line; and the start refusing them (exit 2).

Fast tier: protobuf only, no TensorFlow.
"""

from __future__ import annotations

import pytest
from support.entry import run_main_in_process
from support.helpers import REPO_ROOT, self_signed

from service import config_files
from service.config_files import BatchOptions, ServerFileError

# Wire bytes written by hand from TF Serving's .proto files (field number << 3 | wire type):
# if a field's number or type here differed from TF Serving's, these would differ.
WIRE = [
    pytest.param(config_files.BatchingParameters, "max_batch_size { value: 64 }",
                 b"\x0a\x02\x08\x40", id="max_batch_size=1,Int64Value"),
    pytest.param(config_files.BatchingParameters, "batch_timeout_micros { value: 5 }",
                 b"\x12\x02\x08\x05", id="batch_timeout_micros=2"),
    pytest.param(config_files.BatchingParameters, "max_enqueued_batches { value: 3 }",
                 b"\x1a\x02\x08\x03", id="max_enqueued_batches=3"),
    pytest.param(config_files.BatchingParameters, "num_batch_threads { value: 2 }",
                 b"\x22\x02\x08\x02", id="num_batch_threads=4"),
    pytest.param(config_files.BatchingParameters, 'thread_pool_name { value: "t" }',
                 b"\x2a\x03\x0a\x01t", id="thread_pool_name=5,StringValue"),
    pytest.param(config_files.BatchingParameters, "allowed_batch_sizes: [1, 2]",
                 b"\x32\x02\x01\x02", id="allowed_batch_sizes=6,packed"),
    pytest.param(config_files.BatchingParameters, "pad_variable_length_inputs: true",
                 b"\x38\x01", id="pad_variable_length_inputs=7,bool"),
    pytest.param(config_files.BatchingParameters, "enable_large_batch_splitting { value: true }",
                 b"\x42\x02\x08\x01", id="enable_large_batch_splitting=8,BoolValue"),
    pytest.param(config_files.BatchingParameters, "max_execution_batch_size { value: 8 }",
                 b"\x4a\x02\x08\x08", id="max_execution_batch_size=9"),
    pytest.param(config_files.MonitoringConfig,
                 'prometheus_config { enable: true path: "/m" }',
                 b"\x0a\x06\x08\x01\x12\x02/m", id="monitoring"),
    pytest.param(config_files.SSLConfig,
                 'server_key: "k" server_cert: "c" custom_ca: "a" client_verify: true',
                 b"\x0a\x01k\x12\x01c\x1a\x01a\x20\x01", id="ssl"),
]  # fmt: skip


@pytest.mark.parametrize("message, text, wire", WIRE)
def test_the_messages_are_tf_servings_field_for_field(message, text, wire):
    from google.protobuf import text_format

    parsed = text_format.Parse(text, message())
    assert parsed.SerializeToString() == wire
    assert message.FromString(wire) == parsed


def test_the_messages_have_tf_servings_full_names():
    names = {m.DESCRIPTOR.full_name for m in (config_files.BatchingParameters,
             config_files.MonitoringConfig, config_files.SSLConfig)}  # fmt: skip
    assert names == {
        "tensorflow.serving.BatchingParameters",
        "tensorflow.serving.MonitoringConfig",
        "tensorflow.serving.SSLConfig",
    }


def test_the_repositorys_files_for_tf_serving_read_the_same_here():
    # models/*.txt|config: what docker-compose.yml's tensorflow/serving container reads.
    warnings: list[str] = []
    options = config_files.batch_options(REPO_ROOT / "models" / "batching_parameters.txt", warnings)
    # max_enqueued_batches 100 batches of 64: the queue holds that many requests here.
    assert options == BatchOptions(max_batch_size=64, timeout_ms=0.0, max_queue=6400)
    (warning,) = warnings
    assert warning.startswith("BATCHING_PARAMETERS_FILE: num_batch_threads 2: ")
    path = config_files.prometheus_path_of(REPO_ROOT / "models" / "monitoring.config")
    assert path == "/monitoring/prometheus/metrics"


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("", BatchOptions(1000, 0.0, 10_000), id="tf-servings-defaults"),
        pytest.param("max_batch_size { value: 8 }\nbatch_timeout_micros { value: 2500 }\n"
                     "max_enqueued_batches { value: 4 }\nallowed_batch_sizes: 2\n"
                     "allowed_batch_sizes: 4\nallowed_batch_sizes: 8\n",
                     BatchOptions(8, 2.5, 32, (2, 4, 8)), id="every-field"),
        pytest.param('thread_pool_name { value: "batch" }\nmax_batch_size { value: 1 }',
                     BatchOptions(1, 0.0, 10), id="name-only"),
    ],
)  # fmt: skip
def test_batching_parameters_set_the_batcher(tmp_path, text, expected):
    path = tmp_path / "batching.txt"
    path.write_text(text)
    warnings: list[str] = []
    assert config_files.batch_options(path, warnings) == expected
    assert warnings == []


@pytest.mark.parametrize(
    "text, field",
    [
        pytest.param("num_batch_threads { value: 4 }", "num_batch_threads 4", id="threads"),
        pytest.param("enable_large_batch_splitting { value: true }",
                     "enable_large_batch_splitting", id="splitting"),
        pytest.param("pad_variable_length_inputs: true", "pad_variable_length_inputs",
                     id="padding"),
    ],
)  # fmt: skip
def test_batching_fields_that_do_not_apply_are_one_warning_each(tmp_path, text, field):
    path = tmp_path / "batching.txt"
    path.write_text(text)
    warnings: list[str] = []
    config_files.batch_options(path, warnings)
    (warning,) = warnings
    assert warning.startswith(f"BATCHING_PARAMETERS_FILE: {field}")
    assert warning.endswith("ignored")


BAD_BATCHING = [
    pytest.param("max_batch_size { value: 8 }\nmax_batch_sizes { value: 8 }\n", 2,
                 'has no field named "max_batch_sizes"', id="unknown-field"),
    pytest.param("# comment\n\nmax_batch_size: 8\n", 3, "max_batch_size", id="not-a-wrapper"),
    pytest.param('max_batch_size { value: "eight" }', 1, "Couldn't parse integer",
                 id="wrong-type"),
    pytest.param("max_batch_size { value: 8 ", 1, "Expected", id="unclosed"),
    pytest.param("\nmax_batch_size { value: 0 }", 2, "max_batch_size must be positive, got 0",
                 id="zero-size"),
    pytest.param("max_enqueued_batches { value: -1 }", 1,
                 "max_enqueued_batches must be positive", id="negative-queue"),
    pytest.param("batch_timeout_micros { value: -5 }", 1,
                 "batch_timeout_micros must be 0 or more", id="negative-timeout"),
    pytest.param("num_batch_threads { value: 0 }", 1, "num_batch_threads must be 1 or more",
                 id="no-threads"),
    pytest.param("max_batch_size { value: 8 }\nallowed_batch_sizes: [2, 4]", 2,
                 "Last entry in allowed_batch_sizes must match max_batch_size; last entry was "
                 "4; expected 8", id="allowed-not-max"),
    pytest.param("max_batch_size { value: 8 }\nallowed_batch_sizes: [4, 2, 8]", 2,
                 "must be positive and increasing", id="allowed-not-increasing"),
]  # fmt: skip


@pytest.mark.parametrize("text, line, fragment", BAD_BATCHING)
def test_a_bad_batching_file_is_one_line_naming_it_and_the_line(tmp_path, text, line, fragment):
    path = tmp_path / "batching.txt"
    path.write_text(text)
    with pytest.raises(ServerFileError) as refused:
        config_files.batch_options(path)
    message = str(refused.value)
    assert message.startswith(f"BATCHING_PARAMETERS_FILE: {path}:{line}: "), message
    assert fragment in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("prometheus_config { enable: true }",
                     "/monitoring/prometheus/metrics", id="default-path"),
        pytest.param('prometheus_config { enable: true path: "/tfs/metrics" }',
                     "/tfs/metrics", id="a-path"),
        pytest.param('prometheus_config { enable: false path: "/x" }', None, id="disabled"),
        pytest.param("", None, id="empty"),
    ],
)  # fmt: skip
def test_a_monitoring_config_gives_the_metrics_path(tmp_path, text, expected):
    path = tmp_path / "monitoring.config"
    path.write_text(text)
    assert config_files.prometheus_path_of(path) == expected


@pytest.mark.parametrize(
    "text, line, fragment",
    [
        pytest.param('prometheus_config {\n  enable: true\n  path: "metrics"\n}', 3,
                     "must be a URL path starting with /, got 'metrics'", id="relative"),
        pytest.param('prometheus_config {\n  enable: true\n  path: "/a b"\n}', 3,
                     "got '/a b'", id="space"),
        pytest.param("prometheus_config {\n  enabled: true\n}", 2,
                     'has no field named "enabled"', id="unknown-field"),
        pytest.param("prometheus_config { enable: 3 }", 1, 'Expected "true" or "false"',
                     id="not-a-bool"),
    ],
)  # fmt: skip
def test_a_bad_monitoring_config_is_one_line(tmp_path, text, line, fragment):
    path = tmp_path / "monitoring.config"
    path.write_text(text)
    with pytest.raises(ServerFileError) as refused:
        config_files.prometheus_path_of(path)
    message = str(refused.value)
    assert message.startswith(f"MONITORING_CONFIG_FILE: {path}:{line}: "), message
    assert fragment in message


def _pem_text(path) -> str:
    # A PEM as a text-format string: newlines escaped.
    return path.read_text().replace("\n", "\\n")


def test_an_ssl_config_gives_grpc_its_tls(tmp_path):
    cert, key = self_signed(tmp_path)
    config = tmp_path / "ssl.config"
    config.write_text(f'server_key: "{_pem_text(key)}"\nserver_cert: "{_pem_text(cert)}"\n')
    tls = config_files.grpc_tls_of(config)
    assert (tls.chain, tls.key, tls.client_ca) == (cert.read_bytes(), key.read_bytes(), None)
    # client_verify asks for a client certificate signed by custom_ca; without it, no CA is
    # asked of the clients even when custom_ca is given (TF Serving's server.cc).
    config.write_text(config.read_text() + f'custom_ca: "{_pem_text(cert)}"\n')
    assert config_files.grpc_tls_of(config).client_ca is None
    config.write_text(config.read_text() + "client_verify: true\n")
    assert config_files.grpc_tls_of(config).client_ca == cert.read_bytes()


@pytest.mark.parametrize(
    "fields, field, fragment",
    [
        pytest.param({"server_key": "key"}, "server_cert", "is missing", id="no-cert"),
        pytest.param({"server_cert": "cert"}, "server_key", "is missing", id="no-key"),
        pytest.param({"server_cert": "cert", "server_key": "x"}, "server_key",
                     "is not a PEM private key", id="key-not-pem"),
        pytest.param({"server_cert": "not a certificate", "server_key": "key"}, "server_cert",
                     "is not PEM certificates", id="cert-not-pem"),
        pytest.param({"server_cert": "cert", "server_key": "key", "client_verify": True},
                     "client_verify", "needs custom_ca", id="verify-without-ca"),
    ],
)  # fmt: skip
def test_a_bad_ssl_config_is_one_line_naming_the_field(tmp_path, fields, field, fragment):
    cert, key = self_signed(tmp_path)
    pems = {"cert": _pem_text(cert), "key": _pem_text(key)}
    lines = []
    for name, value in fields.items():
        if isinstance(value, bool):
            lines.append(f"{name}: {str(value).lower()}")
        else:
            lines.append(f'{name}: "{pems.get(value, value)}"')
    config = tmp_path / "ssl.config"
    config.write_text("# TF Serving's SSLConfig\n" + "\n".join(lines) + "\n")
    with pytest.raises(ServerFileError) as refused:
        config_files.grpc_tls_of(config)
    message = str(refused.value)
    assert message.startswith(f"SSL_CONFIG_FILE: {config}"), message
    assert f": {field} {fragment}" in message
    if field in fields:
        line = 2 + list(fields).index(field)
        assert message.startswith(f"SSL_CONFIG_FILE: {config}:{line}: ")


@pytest.mark.parametrize(
    "variable, name, text, fragment",
    [
        pytest.param("BATCHING_PARAMETERS_FILE", "batching.txt", "max_batch_size: 4",
                     "batching.txt:1: not a tensorflow.serving.BatchingParameters",
                     id="batching"),
        pytest.param("MONITORING_CONFIG_FILE", "monitoring.config",
                     'prometheus_config { enable: true path: "x" }', "monitoring.config:1: ",
                     id="monitoring"),
        pytest.param("SSL_CONFIG_FILE", "ssl.config", 'server_cert: ""', "server_cert is "
                     "missing", id="ssl"),
    ],
)  # fmt: skip
def test_the_start_refuses_a_bad_file_in_one_line(tmp_path, variable, name, text, fragment):
    path = tmp_path / name
    path.write_text(text)
    result = run_main_in_process(MODEL_BASE_PATH=str(tmp_path), **{variable: str(path)})
    (line,) = result.stderr.strip().splitlines()
    assert result.returncode == 2
    assert line.startswith(f"error: {variable}: ") and fragment in line, line


def test_the_start_refuses_a_bad_file_given_by_its_flag(tmp_path):
    path = tmp_path / "batching.txt"
    path.write_text("max_batch_size { value: 0 }")
    result = run_main_in_process(
        ["--enable_batching", f"--batching_parameters_file={path}"], MODEL_BASE_PATH=str(tmp_path)
    )
    (line,) = result.stderr.strip().splitlines()
    assert result.returncode == 2
    assert (
        line == f"error: BATCHING_PARAMETERS_FILE: {path}:1: max_batch_size must be positive, got 0"
    )


def test_an_unreadable_file_is_one_line(tmp_path):
    with pytest.raises(ServerFileError) as refused:
        config_files.batch_options(tmp_path)
    assert str(refused.value).startswith(f"BATCHING_PARAMETERS_FILE: cannot read {tmp_path}: ")
