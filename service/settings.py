"""The service's settings, read from the environment (names as in the tensorflow/serving image)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from artifact.model_config import ModelEntry, check_reachable, read_config, shortcut
from artifact.storage import is_url, location


class Settings(BaseSettings):
    """Everything the service can be told at start; built once in the entry point."""

    # No prefix: MODEL_NAME and MODEL_BASE_PATH mean what they mean to tensorflow/serving.
    model_config = SettingsConfigDict(env_prefix="", case_sensitive=False, extra="ignore")

    model_name: str = Field(
        "fashion_mnist", description="Model served, the folder under MODEL_BASE_PATH."
    )
    model_base_path: str = Field(
        "models",
        description="Model repository: <base>/<name>/<version>/saved_model.pb; a folder, or "
        "s3://bucket/prefix or gs://bucket/prefix (docs/object-storage.md).",
    )
    model_path: str | None = Field(
        None,
        description="The model's own folder, holding its version folders (TF Serving's "
        "--model_base_path, which the tensorflow/serving image sets to "
        "$MODEL_BASE_PATH/$MODEL_NAME); a folder or a URL. Unset = MODEL_BASE_PATH/MODEL_NAME; "
        "not used with MODEL_CONFIG_FILE.",
    )
    model_cache_dir: str | None = Field(
        None,
        description="Where versions on object storage are copied, verified, before they load "
        "(a folder per process, holding only the versions loaded); unset = a folder in the "
        "user's cache, $XDG_CACHE_HOME or ~/.cache.",
    )
    model_config_file: str | None = Field(
        None,
        description="TF Serving's model config (ModelServerConfig text): several models, "
        "version policies, labels. When set, MODEL_BASE_PATH is not used and MODEL_NAME only "
        "picks the model /predict serves.",
    )
    model_config_file_poll_seconds: float = Field(
        0.0,
        ge=0,
        description="How often to re-read MODEL_CONFIG_FILE and apply it when it changed; "
        "0 = read it at start only (TF Serving's --model_config_file_poll_wait_seconds).",
    )
    allow_version_labels_for_unavailable_models: bool = Field(
        False,
        description="A new version label may point to a version that is not AVAILABLE yet "
        "(TF Serving's flag of the same name); a label moving from one version to another "
        "must still point to an AVAILABLE one.",
    )
    allow_signature_changes: bool = Field(
        False,
        description="A new version whose signatures (inputs, outputs, their dtypes and "
        "shapes, methods) differ from the serving version's may serve; by default it is "
        "refused (state END, the difference in its error), so a retrain cannot silently "
        "change what clients must send.",
    )
    allow_file_system_ops: bool = Field(
        False,
        description="Serve versions whose graphs read or write files (tf.io.read_file, "
        "write_file, checkpoint savers, file datasets...: artifact/file_ops.py's list) from "
        "their signatures or at load; by default such a version is refused (state END, the "
        "ops in its error) before it is loaded. The in-process backend only.",
    )
    canary_percent: float = Field(
        0.0,
        ge=0,
        le=100,
        description="Share of the requests naming neither a version nor a label that go to "
        "a model's `canary` label, when it has one.",
    )
    shadow_percent: float = Field(
        0.0,
        ge=0,
        le=100,
        description="Share of the requests naming neither a version nor a label copied to a "
        "model's `shadow` label, off the response path, to compare its answers.",
    )
    host: str = Field("127.0.0.1", description="Address the HTTP server and gRPC bind.")
    port: int = Field(
        8000,
        ge=0,
        le=65535,
        description="Port of the HTTP server (TF Serving's REST API, the Open Inference "
        "Protocol, /predict, the page, the probes); 0 = no HTTP, gRPC only (TF Serving's "
        "--rest_api_port=0).",
    )
    grpc_port: int = Field(
        8500,
        ge=0,
        le=65535,
        description="Port of TensorFlow Serving's gRPC API (PredictionService, ModelService) "
        "on HOST; 0 = none on a TCP port.",
    )
    grpc_socket_path: str | None = Field(
        None,
        description="Also serve gRPC on this UNIX socket (TF Serving's --grpc_socket_path); "
        "a socket file left there by a stopped server is replaced. Unset = none.",
    )
    grpc_max_message_bytes: int = Field(
        8 * 1024 * 1024,
        gt=0,
        description="Largest gRPC message received or sent; larger gets RESOURCE_EXHAUSTED.",
    )
    grpc_max_concurrent_rpcs: int = Field(
        256,
        gt=0,
        description="Most gRPC calls served at once (per worker), each holding up to "
        "GRPC_MAX_MESSAGE_BYTES; past it gRPC answers RESOURCE_EXHAUSTED at once.",
    )
    backend: Literal["tensorflow", "tfserving"] = Field(
        "tensorflow",
        description="tensorflow: run the SavedModel in this process; tfserving: forward to "
        "TensorFlow Serving over gRPC.",
    )
    tfserving_grpc_address: str = Field(
        "tfserving:8500",
        description="host:port of TensorFlow Serving's gRPC API (BACKEND=tfserving).",
    )
    tfserving_deadline_seconds: float = Field(
        10.0, gt=0, description="Deadline of each gRPC call to TensorFlow Serving; past it, 504."
    )
    enable_batching: bool = Field(
        True,
        description="In-process dynamic batching (TF Serving's --enable_batching, false by "
        "default there): requests that arrive while the model is busy share its next call; "
        "at BATCH_TIMEOUT_MS=0 no request waits for company.",
    )
    batching_parameters_file: str | None = Field(
        None,
        description="TF Serving's BatchingParameters (text format): max_batch_size, "
        "batch_timeout_micros, max_enqueued_batches and allowed_batch_sizes set the batcher, "
        "in place of BATCH_MAX_SIZE, BATCH_TIMEOUT_MS and BATCH_MAX_QUEUE (docs/operations.md).",
    )
    batch_max_size: int = Field(
        64,
        ge=1,
        description="In-process dynamic batching (TF Serving batches on its own side): most "
        "images merged into one model call (1 = no batching).",
    )
    batch_timeout_ms: float = Field(
        0.0,
        ge=0,
        description="Dynamic batching: longest wait for more requests once the model is free "
        "(0 = run what is queued at once, TF Serving's advice on CPU).",
    )
    batch_max_queue: int = Field(
        64,
        ge=1,
        description="Dynamic batching: most requests waiting (per worker); beyond it, 503 at "
        "once. 64 (one full batch) keeps the wait of the requests served under overload short.",
    )
    device: Literal["auto", "cpu", "gpu"] = Field(
        "auto",
        description="auto: a GPU when TensorFlow sees one, else the CPU; gpu: fail without one.",
    )
    model_poll_seconds: float = Field(
        2.0,
        ge=0,
        description="How often to look for a newer version and swap it in; 0 = never, after "
        "the start (TF Serving's --file_system_poll_wait_seconds, 1 there).",
    )
    enable_model_warmup: bool = Field(
        True,
        description="Replay a version's assets.extra/tf_serving_warmup_requests before it "
        "serves (TF Serving's --enable_model_warmup); false: one call of zeros per signature "
        "instead, which still traces it and checks its answers.",
    )
    max_body_bytes: int = Field(
        8 * 1024 * 1024, gt=0, description="Largest request body accepted; larger gets 413."
    )
    max_body_bytes_in_flight: int = Field(
        256 * 1024 * 1024,
        gt=0,
        description="Most request-body bytes the process holds at once, being received or "
        "being answered, across all requests; a body past it gets 503 with Retry-After before "
        "it is read.",
    )
    max_images: int = Field(1024, gt=0, description="Most images in one request; more gets 413.")
    # --- TF Serving's behaviour where this service may differ (docs/protocols.md) --------
    grpc_tensor_content: bool = Field(
        False,
        description="gRPC Predict answers carry each output as raw `tensor_content` bytes; "
        "false = TF Serving's default, the typed fields (float_val, int64_val...) and shape.",
    )
    strict_numbers: bool = Field(
        False,
        description="Refuse NaN, Infinity and values past float32's range in /v1 and gRPC "
        "inputs, and a gRPC float_val shorter than its shape; false = TF Serving's way "
        "(passed to the model; the last value repeated to fill the shape).",
    )
    tfserving_extra_keys: bool = Field(
        True,
        description="Add `model_version` to /v1 predict answers and `device` to /v1 metadata "
        "(keys TF Serving does not send); false = TF Serving's bodies exactly.",
    )
    # --- feedback and prediction logs (docs/retraining.md) -------------------------------
    feedback_dir: str | None = Field(
        None,
        description="Labeled feedback (POST /v1/models/{name}/feedback) is stored here as "
        "tf.Example shards, a folder per model, for the retrain job; unset = feedback is off.",
    )
    feedback_shard_images: int = Field(
        1000,
        ge=1,
        description="Feedback: close the current shard once it holds this many examples (the "
        "retrain job reads closed shards; a shard is also closed at shutdown).",
    )
    feedback_max_bytes: int = Field(
        1024**3,
        gt=0,
        description="Feedback: most bytes the store (every writer's shards) may take; a "
        "request past it gets 507 and nothing of it is stored.",
    )
    feedback_sender_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Feedback: the share of FEEDBACK_MAX_BYTES one sender (a token's name; "
        "`anonymous` without tokens) may hold, its examples' records; a request past it gets "
        "507.",
    )
    feedback_rate_per_minute: float = Field(
        600.0,
        ge=0,
        description="Feedback: examples per minute one sender may post (a token bucket per "
        "sender and process); past it, 429 with Retry-After. 0 = no rate.",
    )
    feedback_burst_images: int = Field(
        1024,
        ge=1,
        description="Feedback: the most examples one sender may post at once (the bucket's "
        "size); a request of more gets 413.",
    )
    prediction_log_sampling_rate: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of successful predictions written to PREDICTION_LOG_DIR as TF "
        "Serving's PredictionLog records (its logging_config); 0 = off.",
    )
    prediction_log_dir: str | None = Field(
        None,
        description="Prediction logs: TFRecord files of PredictionLog, a folder per model.",
    )
    prediction_log_file_records: int = Field(
        10000,
        ge=1,
        description="Prediction logs: close the current file once it holds this many records.",
    )
    prediction_log_max_bytes: int = Field(
        1024**3,
        gt=0,
        description="Prediction logs: most bytes the folder may take; past it, sampled "
        "predictions are dropped (and counted).",
    )
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="Server processes sharing PORT and GRPC_PORT (SO_REUSEPORT), each with its "
        "own event loop, batcher and copy of the models, under one supervisor; /metrics adds "
        "them up. Whether more than one pays depends on the machine: the benchmark's "
        'WORKERS=2 rows against one process (docs/operations.md, "Several processes").',
    )
    intra_op_threads: int = Field(
        0,
        ge=0,
        description="TensorFlow threads inside one op; 0 = one per core, shared out among "
        "WORKERS (best measured).",
    )
    inter_op_threads: int = Field(
        1,
        ge=0,
        description="TensorFlow ops run in parallel; 1 was best measured here, 0 = TF's choice.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level of the service (INFO writes one access line a request)."
    )
    log_format: Literal["text", "json", "auto"] = Field(
        "text",
        description="text: one line a record for a person; json: one JSON object a line "
        "(time, level, logger, message; a request's request_id, trace_id, and on its access "
        "line method, path, status, model, version, signature, batch_size, duration_ms, "
        "client); auto: json when stderr is not a terminal, text when it is.",
    )
    log_config: str | None = Field(
        None,
        description="A logging.config.dictConfig file (JSON; YAML where PyYAML is "
        "installed), applied over LOG_FORMAT's handler: more handlers, other levels per "
        "logger. A file that cannot be read or applied stops the start (exit 2).",
    )
    # --- clients that are slow, large or many ---------------------------------------------
    max_header_bytes: int = Field(
        32 * 1024,
        ge=8192,
        description="Largest header section of a request; larger gets 431 (the server's read "
        "buffer, 8 KiB at least).",
    )
    header_timeout_seconds: float = Field(
        10.0,
        ge=0.001,
        le=60,
        description="Time a client has to send a request's headers, and the longest a kept-alive "
        "connection waits idle for the next request; then the connection is closed.",
    )
    body_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="Time a client has to send a request's body; then 408. A gRPC call's "
        "request message too (then DEADLINE_EXCEEDED, and the call's slot is free).",
    )
    request_timeout_seconds: float = Field(
        30.0,
        ge=0,
        description="Longest an HTTP request is worked on once its body is read (the batch "
        "queue and the model included); then 504 (TF Serving's --rest_api_timeout_in_ms, "
        "30000). 0 = no limit.",
    )
    http_threads: int = Field(
        1,
        ge=1,
        le=256,
        description="Threads of the HTTP server's own, for connections and HTTP parsing, "
        "beside the event loop that runs the requests (TF Serving's --rest_api_num_threads, "
        "4 per core there); WORKERS sets the processes.",
    )
    max_connections: int = Field(
        2048,
        gt=0,
        description="Most connections served at once; more wait in the listen queue until one "
        "closes.",
    )
    max_request_pixels: int = Field(
        48_000_000,
        gt=0,
        description="Most pixels the image files of one request may decode to, all of them "
        "together (each image is also limited to 24 megapixels); more gets 413.",
    )
    max_pixels_in_flight: int = Field(
        192_000_000,
        gt=0,
        description="Most pixels being decoded from image files at once, across all requests "
        "(/predict and feedback); a request past it gets 503 with Retry-After before its "
        "files are decoded.",
    )
    # --- shutdown -------------------------------------------------------------------------
    drain_seconds: float = Field(
        5.0,
        ge=0,
        description="After SIGTERM: /readyz answers 503 at once while the listener stays open "
        "this long, so load balancers stop sending before it closes.",
    )
    shutdown_timeout_seconds: float = Field(
        20.0, gt=0, description="After the drain: the longest in-flight requests get to finish."
    )
    # --- access ---------------------------------------------------------------------------
    auth_tokens_file: str | None = Field(
        None,
        description="Bearer tokens, one per line: `<token> <scope>[,<scope>]` with scopes "
        "predict, feedback and status (# comments); read again when it changes. Unset: no "
        "authentication, only on a loopback HOST unless ALLOW_ANONYMOUS=true.",
    )
    allow_anonymous: bool = Field(
        False,
        description="Serve without AUTH_TOKENS_FILE on a HOST other machines can reach "
        "(0.0.0.0, an address); false refuses to start there without tokens (exit 2). On a "
        "loopback HOST no tokens are needed.",
    )
    auth_tokens_check_seconds: float = Field(
        2.0,
        ge=0,
        description="How often, at most, AUTH_TOKENS_FILE is looked at for a change; what it "
        "holds then is in force (emptied or gone: no token; a bad line: not its token); 0 = "
        "on every request.",
    )
    allowed_hosts: str = Field(
        "",
        description="Comma-separated host names (api.example.com, .example.com for its "
        "subdomains, * for any) this service answers for, besides HOST and the loopback "
        "names; when set, or when unset and HOST is a loopback address, a request for "
        "another Host gets 400 (probes excepted). A request is same-origin only when its Host "
        "is one of these (no DNS rebinding).",
    )
    cors_allow_origins: str = Field(
        "",
        description="Comma-separated origins (https://app.example) whose pages may call the "
        "API from a browser; empty: none but the service's own page.",
    )
    tls_cert_file: str | None = Field(
        None, description="TLS certificate (PEM): serve HTTPS, and TLS on GRPC_PORT."
    )
    tls_key_file: str | None = Field(None, description="TLS private key (PEM) of TLS_CERT_FILE.")
    ssl_config_file: str | None = Field(
        None,
        description="TF Serving's SSLConfig (text format: server_key, server_cert, custom_ca, "
        "client_verify, PEM text inline) for gRPC: TLS, and with client_verify only clients "
        "with a certificate custom_ca signed. Replaces TLS_CERT_FILE for gRPC only.",
    )
    monitoring_config_file: str | None = Field(
        None,
        description="TF Serving's MonitoringConfig (text format): with prometheus_config "
        "{ enable: true }, the metrics are also served at its path (default "
        "/monitoring/prometheus/metrics), as /metrics is.",
    )
    grpc_allow_plaintext_tokens: bool = Field(
        False,
        description="With AUTH_TOKENS_FILE and no TLS_CERT_FILE, take gRPC calls carrying a "
        "bearer token in clear (only where the network is encrypted or trusted already: a "
        "service mesh, loopback); false refuses them with UNAUTHENTICATED saying why.",
    )

    @field_validator("backend", "device", "log_level", "log_format", mode="before")
    @classmethod
    def _any_case(cls, value):
        # DEVICE=GPU and LOG_LEVEL=INFO mean what they say.
        return value.lower() if isinstance(value, str) else value

    @field_validator("model_name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not value or "/" in value or value in (".", ".."):
            raise ValueError(f"must be a plain folder name, got {value!r}")
        return value

    @field_validator("model_config_file")
    @classmethod
    def _config_file(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            return None
        return value

    @field_validator(
        "feedback_dir",
        "prediction_log_dir",
        "model_cache_dir",
        "model_path",
        "grpc_socket_path",
        "batching_parameters_file",
        "monitoring_config_file",
        "ssl_config_file",
        "log_config",
    )
    @classmethod
    def _optional_dir(cls, value: str | None) -> str | None:
        return None if value is not None and not value.strip() else value

    @model_validator(mode="after")
    def _prediction_log_has_a_dir(self) -> Settings:
        if self.prediction_log_sampling_rate > 0 and not self.prediction_log_dir:
            raise ValueError(
                f"PREDICTION_LOG_SAMPLING_RATE={self.prediction_log_sampling_rate} needs "
                "PREDICTION_LOG_DIR: where to write the logs"
            )
        return self

    def tensorflow_threads(self, cores: int | None) -> tuple[int, int]:
        """(intra-op, inter-op) threads for each worker: INTRA_OP_THREADS=0 shares the cores
        out among the workers (TF's own 0 means one per core, in every process)."""
        intra = self.intra_op_threads
        if intra == 0 and self.workers > 1:
            intra = max(1, (cores or 1) // self.workers)
        return intra, self.inter_op_threads

    @model_validator(mode="after")
    def _limits_agree(self) -> Settings:
        # One 28x28 image is at least ~1.6 KB as JSON; a limit below that rejects everything.
        if self.max_body_bytes < 4096:
            raise ValueError(f"MAX_BODY_BYTES={self.max_body_bytes} is too small for one image")
        if self.max_body_bytes_in_flight < self.max_body_bytes:
            raise ValueError(
                f"MAX_BODY_BYTES_IN_FLIGHT={self.max_body_bytes_in_flight} is below "
                f"MAX_BODY_BYTES={self.max_body_bytes}: no body of the largest size could come"
            )
        if self.max_pixels_in_flight < self.max_request_pixels:
            raise ValueError(
                f"MAX_PIXELS_IN_FLIGHT={self.max_pixels_in_flight} is below "
                f"MAX_REQUEST_PIXELS={self.max_request_pixels}: no request of the largest size "
                "could be decoded"
            )
        # One image as a float32 tensor is 3,136 bytes.
        if self.grpc_max_message_bytes < 4096:
            raise ValueError(
                f"GRPC_MAX_MESSAGE_BYTES={self.grpc_max_message_bytes} is too small for one image"
            )
        if self.grpc_port == self.port and self.port:
            raise ValueError(f"GRPC_PORT and PORT are both {self.port}; give gRPC its own port")
        if not (self.port or self.grpc_port or self.grpc_socket_path):
            raise ValueError(
                "PORT and GRPC_PORT are both 0 and GRPC_SOCKET_PATH is not set: nothing to serve on"
            )
        if self.grpc_socket_path and self.workers > 1:
            raise ValueError(
                f"GRPC_SOCKET_PATH takes one process; WORKERS={self.workers} would each bind it"
            )
        if self.batching_parameters_file and not self.enable_batching:
            # TF Serving's rule (model_servers/server.cc).
            raise ValueError("BATCHING_PARAMETERS_FILE is set, and ENABLE_BATCHING=false")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("TLS_CERT_FILE and TLS_KEY_FILE go together: set both or neither")
        for name in (
            "auth_tokens_file",
            "tls_cert_file",
            "tls_key_file",
            "batching_parameters_file",
            "monitoring_config_file",
            "ssl_config_file",
            "log_config",
        ):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{name.upper()}={path}: no such file")
        return self

    def json_logs(self, stderr_is_a_terminal: bool) -> bool:
        """Whether the logs are JSON lines (LOG_FORMAT; auto: when stderr is no terminal)."""
        if self.log_format == "auto":
            return not stderr_is_a_terminal
        return self.log_format == "json"

    def allowed_host_names(self) -> list[str]:
        """ALLOWED_HOSTS as a list."""
        return [h.strip() for h in self.allowed_hosts.split(",") if h.strip()]

    def allowed_origins(self) -> list[str]:
        """CORS_ALLOW_ORIGINS as a list."""
        return [o.strip().rstrip("/") for o in self.cors_allow_origins.split(",") if o.strip()]


def initial_entries(settings: Settings) -> list[ModelEntry]:
    """The models to serve at start.

    Raises:
        ConfigError: MODEL_CONFIG_FILE cannot be read, parsed or served from what is on disk.
    """
    if settings.model_config_file:
        return read_config(settings.model_config_file)
    if settings.model_path:
        entries = [ModelEntry(settings.model_name, location(settings.model_path))]
    else:
        entries = shortcut(settings.model_name, settings.model_base_path)
    # A URL is listed once now, so a bad URL, bucket, credential or endpoint is one line at
    # start (a folder on disk may appear later, as TF Serving allows).
    check_reachable(entries)
    return entries


def config_variable(settings: Settings) -> str:
    """The variable that names the models: MODEL_CONFIG_FILE when set, else MODEL_PATH when
    set, else MODEL_BASE_PATH."""
    if settings.model_config_file:
        return "MODEL_CONFIG_FILE"
    return "MODEL_PATH" if settings.model_path else "MODEL_BASE_PATH"


def uses_object_storage(entries: list[ModelEntry]) -> bool:
    """True when a model's versions are at a URL (they need MODEL_CACHE_DIR)."""
    return any(is_url(entry.base_path) for entry in entries)


def default_model(settings: Settings, entries: list[ModelEntry]) -> str:
    """MODEL_NAME when the config lists it, else the config's first model."""
    names = [entry.name for entry in entries]
    return settings.model_name if settings.model_name in names else names[0]
