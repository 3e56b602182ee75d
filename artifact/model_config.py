"""TF Serving's model config: a `ModelServerConfig` in protobuf text format, read and edited here.

The service (both backends) and TF Serving read the same file; `python -m training promote`
and the gated retrain edit it. It is parsed with TF Serving's own protos
(`tensorflow_serving.config.model_server_config_pb2`, which needs no TensorFlow):

    model_config_list {
      config {
        name: "fashion_mnist"
        base_path: "/models/fashion_mnist"
        model_platform: "tensorflow"
        model_version_policy { specific { versions: 3 versions: 4 } }
        version_labels { key: "stable" value: 3 }
        version_labels { key: "canary" value: 4 }
      }
    }

Rules, as TF Serving has them: model names are unique; the version policy is `latest`
(`num_versions`, at least 1; the default policy), `all` or `specific`; label names are
`[a-zA-Z0-9_]+`. Two additions, said where they apply: a relative `base_path` is read
relative to the config file's folder (TF Serving wants absolute paths: give it those when it
reads the same file), and a version a label points to stays aspired even when a `latest`
policy moves past it, so a new export never unloads the version `stable` names.

A `base_path` may be a URL on object storage (`s3://bucket/models/name`, `gs://...`): it is
kept as a string, and its versions are listed there (artifact/storage.py).
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from artifact.repository import list_versions, parse_version
from artifact.storage import RemoteModel, StorageError, display, is_url, join, location

LABEL_PATTERN = re.compile(r"[a-zA-Z0-9_]+\Z")
PLATFORM = "tensorflow"
POLICY_KINDS = ("latest", "all", "specific")


class ConfigError(ValueError):
    """The model config cannot be used; the message is one line saying what and where."""


@dataclasses.dataclass(frozen=True)
class Policy:
    """A model's version policy: which versions on disk are served (aspired)."""

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def aspired(self, on_disk: Iterable[int]) -> set[int]:
        """The versions this policy serves among those given (TF Serving's rule)."""
        versions = sorted(set(on_disk))
        if self.kind == "all":
            return set(versions)
        if self.kind == "specific":
            return set(versions) & set(self.versions)
        return set(versions[-max(self.num_versions, 1) :])

    def describe(self) -> str:
        """'latest 2', 'all' or 'specific 3, 4'."""
        if self.kind == "latest":
            return f"latest {self.num_versions}"
        if self.kind == "specific":
            return "specific " + ", ".join(map(str, self.versions))
        return "all"

    def as_json(self) -> dict:
        if self.kind == "latest":
            return {"latest": {"num_versions": self.num_versions}}
        if self.kind == "specific":
            return {"specific": {"versions": list(self.versions)}}
        return {"all": {}}

    @classmethod
    def parse(cls, text: str) -> Policy:
        """A policy from the command line: 'latest', 'latest:2', 'all' or 'specific:3,4'.

        Raises:
            ConfigError: none of these.
        """
        kind, _, argument = text.strip().partition(":")
        try:
            if kind == "latest":
                number = int(argument) if argument else 1
                if number < 1:
                    raise ValueError
                return cls("latest", number)
            if kind == "all" and not argument:
                return cls("all")
            if kind == "specific":
                versions = tuple(sorted({_int64(part) for part in argument.split(",")}))
                return cls("specific", versions=versions)
        except ValueError:
            pass
        raise ConfigError(
            f"policy {text!r}: expected latest, latest:N (N >= 1), all, or specific:V1,V2,..."
        )


def _int64(text: str) -> int:
    version = parse_version(text.strip())
    if version is None:
        raise ValueError(text)
    return version


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """One model of the config: where its versions are, which are served, their labels."""

    name: str
    # A folder, or the URL of one on object storage (a str exactly then).
    base_path: Path | str
    policy: Policy = Policy()
    labels: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))

    def versions_on_disk(self) -> list[int]:
        """The versions there now (for a URL: the complete ones, without the second look).

        Raises:
            StorageError: a URL that cannot be listed.
        """
        if is_url(self.base_path):
            model = RemoteModel(self.base_path)
            listed, _ = model.listing()
            return sorted(v for v, found in listed.items() if model.problem(found) is None)
        return [version for version, _ in list_versions(self.base_path)]

    def aspired(self, candidates: Iterable[int]) -> set[int]:
        """The policy's versions among `candidates`, plus every labeled one among them."""
        candidates = set(candidates)
        return self.policy.aspired(candidates) | (set(self.labels.values()) & candidates)

    def as_json(self) -> dict:
        return {
            "name": self.name,
            "base_path": display(self.base_path),
            "policy": self.policy.as_json(),
            "labels": dict(self.labels),
        }


def shortcut(name: str, base_path: str | Path) -> list[ModelEntry]:
    """MODEL_NAME and MODEL_BASE_PATH as a config: one model, the latest version, no labels."""
    return [ModelEntry(name, join(location(base_path), name))]


def check_reachable(entries: Iterable[ModelEntry]) -> None:
    """List every model at a URL once (folders on disk are left alone).

    Raises:
        ConfigError: a URL that cannot be listed (bad URL, no such bucket, credentials
            refused, endpoint unreachable), in one line without secrets.
    """
    for entry in entries:
        if is_url(entry.base_path):
            try:
                RemoteModel(entry.base_path).listing()
            except StorageError as err:
                raise ConfigError(f"model {entry.name!r}: {err}") from None


def parse_config(text: str, source: str | Path = "model config") -> list[ModelEntry]:
    """The models of a ModelServerConfig in text format.

    Args:
        text: the file's content.
        source: the file's path: named in messages, and relative base paths start there.
    Raises:
        ConfigError: not a ModelServerConfig, or it breaks a rule (message says which).
    """
    config = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as err:
        raise ConfigError(f"{source}: not a ModelServerConfig in text format: {err}") from err
    return config_entries(config, source, Path(source).parent)


def config_entries(
    config: model_server_config_pb2.ModelServerConfig,
    source: str | Path = "model config",
    folder: Path | None = None,
) -> list[ModelEntry]:
    """The models of a ModelServerConfig message.

    Args:
        config: the message.
        source: where it came from, named in messages.
        folder: where relative base paths start; None: a relative base path is refused, as TF
            Serving refuses it (model_servers/server_core.cc, ValidateModelConfigList).
    Raises:
        ConfigError: it breaks a rule (the message says which).
    """
    if config.WhichOneof("config") == "custom_model_config":
        raise ConfigError(f"{source}: custom_model_config is not supported; use model_config_list")
    entries, seen = [], set()
    for model in config.model_config_list.config:
        where = f"{source}: model {model.name!r}"
        if not model.name or "/" in model.name or model.name in (".", ".."):
            raise ConfigError(f"{where}: a model name must be a plain, non-empty name")
        if model.name in seen:
            # TF Serving's own wording.
            raise ConfigError(
                f"{source}: Illegal to list model {model.name} multiple times in config list"
            )
        seen.add(model.name)
        if model.model_platform not in ("", PLATFORM):
            raise ConfigError(
                f"{where}: model_platform must be {PLATFORM!r}, got {model.model_platform!r}"
            )
        if not model.base_path:
            raise ConfigError(f"{where}: base_path is empty")
        base_path = location(model.base_path)
        if isinstance(base_path, Path) and not base_path.is_absolute():
            if folder is None:
                # TF Serving's own words.
                raise ConfigError(
                    f"Expected model {model.name} to have an absolute path or URI; got "
                    f"base_path()={model.base_path}"
                )
            base_path = folder / base_path
        for label, version in model.version_labels.items():
            if not LABEL_PATTERN.match(label):
                raise ConfigError(
                    f"{where}: label {label!r} must be letters, digits and underscores"
                )
            if version < 0:
                raise ConfigError(f"{where}: label {label!r} points to version {version}")
        entries.append(
            ModelEntry(model.name, base_path, _policy(model, where), dict(model.version_labels))
        )
    if not entries:
        raise ConfigError(f"{source}: lists no model (model_config_list {{ config {{ ... }} }})")
    return entries


def _policy(model, where: str) -> Policy:
    policy = model.model_version_policy
    kind = policy.WhichOneof("policy_choice") or "latest"
    if kind == "specific":
        versions = tuple(sorted(set(policy.specific.versions)))
        if not versions or min(versions) < 0:
            raise ConfigError(f"{where}: a specific policy needs one or more versions >= 0")
        return Policy("specific", versions=versions)
    if kind == "all":
        return Policy("all")
    return Policy("latest", max(policy.latest.num_versions, 1))


def check_on_disk(entries: Iterable[ModelEntry], source: str | Path = "model config") -> None:
    """Refuse a config whose models cannot serve what it asks for, as found on disk now.

    Raises:
        ConfigError: a base path that does not exist, a policy that matches no version on
            disk, a specific version or a labeled version that is not on disk.
    """
    for entry in entries:
        where = f"{source}: model {entry.name!r}"
        if is_url(entry.base_path):
            try:
                on_disk = entry.versions_on_disk()
            except StorageError as err:
                raise ConfigError(f"{where}: {err}") from None
        elif not Path(entry.base_path).is_dir():
            raise ConfigError(f"{where}: base_path {entry.base_path} does not exist")
        else:
            on_disk = entry.versions_on_disk()
        if entry.policy.kind == "specific":
            missing = sorted(set(entry.policy.versions) - set(on_disk))
            if missing:
                raise ConfigError(
                    f"{where}: policy specific asks for version(s) "
                    f"{', '.join(map(str, missing))}, not in {display(entry.base_path)} "
                    f"(on disk: {_listed(on_disk)})"
                )
        elif not on_disk:
            raise ConfigError(f"{where}: policy {entry.policy.describe()} matches no version "
                              f"in {display(entry.base_path)}")  # fmt: skip
        for label, version in sorted(entry.labels.items()):
            if version not in on_disk:
                raise ConfigError(
                    f"{where}: label {label!r} points to version {version}, not in "
                    f"{display(entry.base_path)} (on disk: {_listed(on_disk)})"
                )


def _listed(versions: list[int]) -> str:
    return ", ".join(map(str, versions)) or "none"


def read_config(path: str | Path) -> list[ModelEntry]:
    """Parse a model config file and check it against the disk.

    Raises:
        ConfigError: unreadable, unparsable, or breaking a rule.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the model config: {err}") from err
    entries = parse_config(text, path)
    check_on_disk(entries, path)
    return entries


# --- editing (promote, retrain) --------------------------------------------------------------


def edit_config(
    text: str,
    model: str,
    *,
    labels: Mapping[str, int] | None = None,
    policy: Policy | None = None,
    source: str | Path = "model config",
) -> str:
    """The config's text with one model's labels set and/or its policy replaced.

    Comments at the top of the file are kept; TF Serving's text format keeps no others.

    Raises:
        ConfigError: the config does not parse or does not list the model.
    """
    parse_config(text, source)  # every rule, before anything is changed
    config = model_server_config_pb2.ModelServerConfig()
    text_format.Parse(text, config)
    matches = [m for m in config.model_config_list.config if m.name == model]
    if not matches:
        known = ", ".join(m.name for m in config.model_config_list.config)
        raise ConfigError(f"{source}: lists no model {model!r} (it lists: {known})")
    (entry,) = matches
    for label, version in (labels or {}).items():
        if not LABEL_PATTERN.match(label):
            raise ConfigError(f"label {label!r} must be letters, digits and underscores")
        entry.version_labels[label] = version
    if policy is not None:
        entry.model_version_policy.Clear()
        if policy.kind == "latest":
            entry.model_version_policy.latest.num_versions = policy.num_versions
        elif policy.kind == "all":
            entry.model_version_policy.all.SetInParent()
        else:
            entry.model_version_policy.specific.versions.extend(policy.versions)
    header = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            break
        header.append(line)
    while header and not header[-1].strip():
        header.pop()
    body = text_format.MessageToString(config)
    return "".join(line + "\n" for line in header if line.strip()) + body


def write_config(path: str | Path, text: str) -> None:
    """Replace the config file atomically: written beside it, then renamed over it.

    A reader (the service, TF Serving) sees the old file or the new one, never a part.
    """
    path = Path(path)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            os.chmod(temp, path.stat().st_mode & 0o777)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
