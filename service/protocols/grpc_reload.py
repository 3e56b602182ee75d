"""TF Serving's ModelService.HandleReloadConfigRequest: a new model config over gRPC.

The request's ModelServerConfig replaces the one serving, as TF Serving's
ServerCore::ReloadConfig replaces it (tensorflow_serving/model_servers/model_service_impl.cc,
server_core.cc): models no longer listed are unloaded, new ones loaded, the others take their
new version policy and labels, through the same path as MODEL_CONFIG_FILE's changes
(service/config_watcher.py, the version registry's rules). What it answers:

- a config that is not a `model_config_list` (or is empty): INVALID_ARGUMENT, in TF Serving's
  words; a list breaking a rule (a name twice, a relative base_path, a bad label):
  INVALID_ARGUMENT;
- a base path that does not hold what the config asks for, or a label to a version that is not
  AVAILABLE (TF Serving's rule and words): FAILED_PRECONDITION;
- a new model none of whose versions became available: UNKNOWN, "N model(s) did not become
  available", as TF Serving says it; that config stays, and its model keeps being tried;
- otherwise OK, with `status` OK.

Where it differs from TF Serving: a refused config changes nothing here (TF Serving may have
taken part of it), including a base path with no version (TF Serving takes it and waits), and
a list of no models is refused rather than unloading everything. A reload holds until
MODEL_CONFIG_FILE changes; TF Serving re-applies the file at every poll.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from tensorflow_serving.apis import model_management_pb2

from artifact.model_config import ConfigError, ModelEntry, check_on_disk, config_entries

log = logging.getLogger("service.grpc")

# Serves a new model config's entries, or refuses it whole (ConfigError); what changed.
ConfigReloader = Callable[[list[ModelEntry]], Awaitable[list[str]]]
SOURCE = "HandleReloadConfigRequest"


class ReloadRefused(Exception):
    """The reload's answer when it is not OK: a gRPC status code's name and the message."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


async def reload_config(request, reload: ConfigReloader, backend) -> object:
    """Serve a ReloadConfigRequest's config; the ReloadConfigResponse.

    Args:
        request: the ReloadConfigRequest.
        reload: serves the config's entries (service/app.py: the config watcher's apply, or
            the backend's).
        backend: the backend, asked afterwards which models serve.
    Raises:
        ReloadRefused: not OK (the code and message above).
    """
    config = request.config
    if config.WhichOneof("config") != "model_config_list":
        raise ReloadRefused(
            "INVALID_ARGUMENT",
            "ServerModelConfig type not supported by HandleReloadConfigRequest. Only "
            "ModelConfigList is currently supported",
        )
    try:
        entries = config_entries(config, SOURCE)
    except ConfigError as err:
        raise ReloadRefused("INVALID_ARGUMENT", str(err)) from err
    try:
        # As a config file's: its folders or URLs must hold what it asks for (a listing on
        # object storage may take a while: off the loop).
        await asyncio.to_thread(check_on_disk, entries, SOURCE)
        changes = await reload(entries)
    except ConfigError as err:
        log.error("Model config from %s refused, the previous one keeps serving: %s", SOURCE, err)
        raise ReloadRefused("FAILED_PRECONDITION", str(err)) from err
    log.info("Model config from %s applied%s", SOURCE, ": " + "; ".join(changes) if changes else "")
    unavailable = {
        entry.name: backend.not_ready_reason(entry.name)
        for entry in entries
        if backend.serving_version(entry.name) is None
    }
    if unavailable:
        reasons = "".join(f"{{{name} due to error: {why}}}, " for name, why in unavailable.items())
        raise ReloadRefused(
            "UNKNOWN", f"{len(unavailable)} model(s) did not become available: {{{reasons}}}"
        )
    response = model_management_pb2.ReloadConfigResponse()
    response.status.error_code = 0  # OK
    for name in request.metric_names:
        # TF Serving reports how much its metrics of these names grew, 0 for a name it does not
        # have; this service has none of TF Serving's metric names.
        response.metric.add(name=name, int64_value_increase=0)
    return response
