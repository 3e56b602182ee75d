"""The service's command line: TensorFlow Serving's flags, `--version` and `--help`.

`python -m service` and `tensorflow_model_server` (the same `main`, service/__main__.py) take
`tensorflow_model_server`'s flags with its names, types and meanings
(tensorflow_serving/model_servers/main.cc and server.h, TF Serving 2.15 to 2.19): a flag that
applies here sets one setting, the environment variable `FLAGS` names, and wins over it; `parse`
returns them in `CommandLine.environment`, which `main` puts in the environment before it reads
`Settings` (so the workers it starts inherit them too). A flag TF Serving has that does not
apply here is accepted with one warning line naming it, so a manifest written for TF Serving
starts; any other argument is refused in one line (exit 2).

The syntax is TF Serving's: `--name=value`; a bool flag alone is true, and takes `=true`,
`=false`, `=1` or `=0`. argparse also takes `--name value`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import textwrap
import typing
from collections.abc import Callable
from typing import NoReturn

from pydantic.fields import FieldInfo

from service.settings import Settings

PROG = "python -m service"
DESCRIPTION = (
    "Serve the SavedModels of a model repository (TensorFlow Serving's layout) over TF "
    "Serving's REST and gRPC APIs, the Open Inference Protocol and /predict. It takes "
    "tensorflow_model_server's flags; each sets an environment variable, named below, and wins "
    "over it. Every setting is an environment variable, named as in the tensorflow/serving "
    "image where it has one; docs/settings.md lists them, docs/operations.md says more."
)
WIDTH = 92
# The server's name and version: `--version` says them, and so do the Open Inference
# Protocol's server metadata and the OpenAPI document (service/app.py).
SERVER_NAME = "estimator-serving"
VERSION = "0.1.0"


class UsageError(Exception):
    """The command line cannot be used: one line saying why (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    # argparse prints the usage and exits on an error; the service says one line instead.
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


@dataclasses.dataclass(frozen=True)
class Flag:
    """One of `tensorflow_model_server`'s flags.

    Args:
        name: its name, without the dashes.
        kind: its type in TF Serving: bool, int32, int64, float or string.
        tf_default: its default in TF Serving, as written there.
        setting: the environment variable (a `Settings` field, upper-cased) it sets here;
            None: accepted, with a warning, and ignored.
        about: what it does here, or why it is ignored.
        scale: the setting's value is the flag's times this (milliseconds into seconds).
    """

    name: str
    kind: str
    tf_default: str
    setting: str | None
    about: str
    scale: float = 1.0

    @property
    def applies(self) -> bool:
        return self.setting is not None


# Every flag of tensorflow_model_server (TF Serving's main.cc), in its order, `--version` and
# `--help` apart.
FLAGS: tuple[Flag, ...] = (
    Flag("port", "int32", "8500", "GRPC_PORT", "TCP port of the gRPC API; 0 = none"),
    Flag("grpc_socket_path", "string", "", "GRPC_SOCKET_PATH",
         "also serve gRPC on this UNIX socket"),
    Flag("rest_api_port", "int32", "0", "PORT",
         "port of the HTTP server (REST and the rest); 0 = none, gRPC only"),
    Flag("rest_api_num_threads", "int32", "4 per CPU", "HTTP_THREADS",
         "the HTTP server's own threads (connections, parsing)"),
    Flag("rest_api_timeout_in_ms", "int32", "30000", "REQUEST_TIMEOUT_SECONDS",
         "longest an HTTP request is worked on, in ms; then 504", scale=0.001),
    Flag("rest_api_enable_cors_support", "bool", "false", None,
         "CORS_ALLOW_ORIGINS lists the origins whose pages may call the API"),
    Flag("enable_batching", "bool", "false", "ENABLE_BATCHING", "dynamic batching"),
    Flag("allow_version_labels_for_unavailable_models", "bool", "false",
         "ALLOW_VERSION_LABELS_FOR_UNAVAILABLE_MODELS",
         "a new label may point to a version not AVAILABLE yet"),
    Flag("batching_parameters_file", "string", "", "BATCHING_PARAMETERS_FILE",
         "a BatchingParameters text file: the batcher's sizes, timeout and queue"),
    Flag("enable_per_model_batching_parameters", "bool", "false", None,
         "one batcher's parameters serve every model"),
    Flag("model_config_file", "string", "", "MODEL_CONFIG_FILE",
         "a ModelServerConfig text file: the models, their policies and labels"),
    Flag("model_config_file_poll_wait_seconds", "int32", "0", "MODEL_CONFIG_FILE_POLL_SECONDS",
         "seconds between reads of the model config file; 0 = at start only"),
    Flag("model_name", "string", "default", "MODEL_NAME", "the model's name"),
    Flag("model_base_path", "string", "", "MODEL_PATH",
         "the model's folder (or URL), holding its version folders"),
    Flag("num_load_threads", "int32", "0", None,
         "versions load one at a time, on TensorFlow's thread"),
    Flag("num_unload_threads", "int32", "0", None,
         "versions unload once their requests are done"),
    Flag("max_num_load_retries", "int32", "5", None,
         "a version that fails to load is tried again when its files change"),
    Flag("load_retry_interval_micros", "int64", "60000000", None,
         "a version that fails to load is tried again when its files change"),
    Flag("file_system_poll_wait_seconds", "int32", "1", "MODEL_POLL_SECONDS",
         "seconds between looks for new versions; 0 = at start only"),
    Flag("flush_filesystem_caches", "bool", "true", None, "no file system caches to flush"),
    Flag("tensorflow_session_parallelism", "int64", "0", None,
         "use --tensorflow_intra_op_parallelism and --tensorflow_inter_op_parallelism"),
    Flag("tensorflow_session_config_file", "string", "", None,
         "no TF1 session: --tensorflow_*_parallelism and DEVICE set what applies"),
    Flag("tensorflow_intra_op_parallelism", "int64", "0", "INTRA_OP_THREADS",
         "TensorFlow threads inside one op; 0 = one per core"),
    Flag("tensorflow_inter_op_parallelism", "int64", "0", "INTER_OP_THREADS",
         "TensorFlow ops run at once; 0 = TensorFlow's choice"),
    Flag("use_alts_credentials", "bool", "false", None,
         "no ALTS: --ssl_config_file or TLS_CERT_FILE serve gRPC over TLS"),
    Flag("ssl_config_file", "string", "", "SSL_CONFIG_FILE",
         "an SSLConfig text file: gRPC over TLS, client certificates optional"),
    Flag("platform_config_file", "string", "", None, "one platform: TensorFlow SavedModels"),
    Flag("per_process_gpu_memory_fraction", "float", "0", None,
         "TensorFlow takes GPU memory as it needs it"),
    Flag("saved_model_tags", "string", "serve", None, "the SavedModel's `serve` graph loads"),
    Flag("grpc_channel_arguments", "string", "", None,
         "GRPC_MAX_MESSAGE_BYTES and GRPC_MAX_CONCURRENT_RPCS set gRPC's limits"),
    Flag("grpc_max_threads", "int32", "4 per CPU", None,
         "gRPC runs on the event loop; GRPC_MAX_CONCURRENT_RPCS bounds the calls"),
    Flag("enable_model_warmup", "bool", "true", "ENABLE_MODEL_WARMUP",
         "replay a version's warmup requests before it serves"),
    Flag("num_request_iterations_for_warmup", "int32", "0", None,
         "each warmup request runs once"),
    Flag("monitoring_config_file", "string", "", "MONITORING_CONFIG_FILE",
         "a MonitoringConfig text file: the metrics at its Prometheus path too"),
    Flag("remove_unused_fields_from_bundle_metagraph", "bool", "true", None,
         "the SavedModel's graph is TensorFlow's to keep"),
    Flag("prefer_tflite_model", "bool", "false", None, "no TensorFlow Lite"),
    Flag("num_tflite_pools", "int32", "1 per CPU", None, "no TensorFlow Lite"),
    Flag("num_tflite_interpreters_per_pool", "int32", "1", None, "no TensorFlow Lite"),
    Flag("enable_signature_method_name_check", "bool", "false", None,
         "signatures are checked by their inputs and outputs"),
    Flag("xla_cpu_compilation_enabled", "bool", "false", None,
         "TensorFlow's own default applies"),
    Flag("xla_gpu_compilation_enabled", "bool", "false", None,
         "TensorFlow's own default applies"),
    Flag("enable_profiler", "bool", "true", None, "no profiler service"),
    Flag("thread_pool_factory_config_file", "string", "", None,
         "--tensorflow_*_parallelism set TensorFlow's threads"),
    Flag("mixed_precision", "string", "", None, "the SavedModel runs as exported"),
    Flag("skip_initialize_tpu", "bool", "false", None, "no TPUs"),
    Flag("enable_grpc_healthcheck_service", "bool", "false", None,
         "HTTP's /healthz and /readyz, and gRPC's GetModelStatus, say the health"),
    Flag("enable_serialization_as_tensor_content", "bool", "false", "GRPC_TENSOR_CONTENT",
         "gRPC Predict answers as tensor_content bytes"),
)  # fmt: skip
FLAGS_BY_NAME = {flag.name: flag for flag in FLAGS}


@dataclasses.dataclass(frozen=True)
class CommandLine:
    """What the command line asked for.

    Attributes:
        help: print the help and exit.
        version: print the version and exit.
        environment: the settings the flags set, by environment variable.
        flags: the flag that set each of those variables, by variable (for messages).
        warnings: one line per flag accepted and ignored.
    """

    help: bool = False
    version: bool = False
    environment: dict[str, str] = dataclasses.field(default_factory=dict)
    flags: dict[str, str] = dataclasses.field(default_factory=dict)
    warnings: tuple[str, ...] = ()


def _bool(text: str) -> str:
    """A bool flag's value as TF Serving reads it (true, false, 1 or 0), for the environment."""
    if text in ("true", "1"):
        return "true"
    if text in ("false", "0"):
        return "false"
    raise ValueError(text)


_bool.__name__ = "bool"  # argparse names the type in its message: "invalid bool value: 'x'"

TYPES: dict[str, Callable[[str], object]] = {
    "bool": _bool,
    "int32": int,
    "int64": int,
    "float": float,
    "string": str,
}


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command line: TF Serving's flags, `--version` and `-h`/`--help` (which prints the
    flags and every setting, and exits)."""
    parser = _Parser(
        prog=prog,
        usage=f"{prog} [-h] [--version] [--flag=value ...]",
        description=textwrap.fill(DESCRIPTION, width=WIDTH),
        epilog=ignored_help() + "\n\n" + settings_help(),
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(
            prog, max_help_position=36, width=WIDTH
        ),
        add_help=False,
        allow_abbrev=False,
    )
    parser.add_argument(
        "-h", "--help", action="store_true", help="print the flags and settings, and exit"
    )
    parser.add_argument(
        "--version", action="store_true", help="print the server's and TensorFlow's versions"
    )
    group = parser.add_argument_group(
        "TensorFlow Serving's flags (each sets the environment variable named, and wins over it)"
    )
    for flag in FLAGS:
        kind = TYPES[flag.kind]
        boolean = flag.kind == "bool"
        help_text = argparse.SUPPRESS
        if flag.setting is not None:
            field = Settings.model_fields[flag.setting.lower()]
            help_text = (
                f"{flag.setting}: {flag.about}. Here {flag_default(flag, field)}, "
                f"TF Serving {flag.tf_default or '(empty)'}"
            )
        (group if flag.applies else parser).add_argument(
            f"--{flag.name}",
            dest=flag.name,
            type=kind,
            nargs="?" if boolean else None,
            const="true" if boolean else None,
            metavar="BOOL" if boolean else flag.kind.upper().rstrip("0123456789"),
            help=help_text,
        )
    return parser


def flag_default(flag: Flag, field: FieldInfo) -> str:
    """The default a flag has here (its setting's, in the flag's units)."""
    value = field.default
    if value is None or value == "":
        return "(unset)"
    if isinstance(value, bool):
        return str(value).lower()
    if flag.scale != 1:
        value = value / flag.scale
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def parse(argv: list[str]) -> CommandLine:
    """Read the command line.

    Raises:
        UsageError: an argument the service does not take, or a flag's value of the wrong
            type; one line.
    """
    namespace, unknown = build_parser().parse_known_args(argv)
    if unknown:
        raise UsageError(
            f"unknown argument{'s' if len(unknown) > 1 else ''}: {' '.join(unknown)} "
            "(python -m service --help lists the flags and settings)"
        )
    given = vars(namespace)
    environment, flags, warnings = {}, {}, []
    for flag in FLAGS:
        value = given[flag.name]
        if value is None:
            continue
        if flag.setting is None:
            warnings.append((_position(argv, flag.name), f"--{flag.name}: TF Serving's flag does "
                             f"not apply here, ignored ({flag.about})"))  # fmt: skip
            continue
        if flag.scale != 1:
            value = value * flag.scale
        environment[flag.setting] = str(value)
        flags[flag.setting] = f"--{flag.name}"
    return CommandLine(
        help=given["help"],
        version=given["version"],
        environment=environment,
        flags=flags,
        warnings=tuple(text for _, text in sorted(warnings)),
    )


def _position(argv: list[str], name: str) -> int:
    """Where a flag is first given on the command line (warnings come in that order)."""
    for at, argument in enumerate(argv):
        if argument == f"--{name}" or argument.startswith(f"--{name}="):
            return at
    return len(argv)


def version_text() -> str:
    """`--version`'s lines, as TF Serving's: the server's version and TensorFlow's (read from
    its installed package, without importing TensorFlow)."""
    try:
        tensorflow = importlib.metadata.version("tensorflow")
    except importlib.metadata.PackageNotFoundError:
        tensorflow = "not installed"
    return (
        f"TensorFlow ModelServer: {SERVER_NAME} {VERSION} (TensorFlow Serving's APIs)\n"
        f"TensorFlow Library: {tensorflow}\n"
    )


def ignored_help() -> str:
    """The paragraph naming TF Serving's flags that are accepted and ignored here."""
    names = ", ".join(f"--{flag.name}" for flag in FLAGS if not flag.applies)
    return textwrap.fill(
        f"Accepted and ignored, each with one warning line saying why (they do not apply "
        f"here): {names}.",
        width=WIDTH,
    )


def settings_help() -> str:
    """Every setting: its environment variable, default and description, in the order
    service/settings.py declares them; `(--flag)` after one a flag sets."""
    by_setting = {flag.setting: flag.name for flag in FLAGS if flag.applies}
    lines = ["settings (environment variables, with their defaults):"]
    for name, field in Settings.model_fields.items():
        flag = by_setting.get(name.upper())
        set_by = f"  (--{flag})" if flag else ""
        lines.append(f"  {name.upper()}{default_text(field)}{choices_text(field)}{set_by}")
        lines.append(
            textwrap.fill(
                field.description or "",
                width=WIDTH,
                initial_indent=" " * 6,
                subsequent_indent=" " * 6,
            )
        )
    return "\n".join(lines)


def default_text(field: FieldInfo) -> str:
    """`=DEFAULT` as the default would be written in the environment; ` (unset)` when there
    is none, ` (empty)` for an empty text."""
    value = field.default
    if value is None:
        return " (unset)"
    if value == "":
        return " (empty)"
    if isinstance(value, bool):
        return f"={str(value).lower()}"
    if isinstance(value, float) and value.is_integer():
        return f"={int(value)}"
    return f"={value}"


def choices_text(field: FieldInfo) -> str:
    """`  (one of: a, b)` for a setting that takes one of a few words."""
    if typing.get_origin(field.annotation) is not typing.Literal:
        return ""
    return f"  (one of: {', '.join(map(str, typing.get_args(field.annotation)))})"
