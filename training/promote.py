"""`python -m training promote`: move a version label, or change the version policy, in TF
Serving's model config, atomically.

    python -m training promote --config models/models.config --model fashion_mnist \\
        --label stable --version 4
    python -m training promote --config models/models.config --model fashion_mnist \\
        --policy specific:3,4

The file is edited beside itself and renamed over the old one, so the service and TF Serving,
which poll it, never read half of it. Rolling back is promoting the previous version.

The label rule is TF Serving's: a label may point only to a version that is served (loaded
and AVAILABLE). This command sees the files, not the servers, so it checks what it can: the
version is on disk and the current config serves it (its policy picks it, or another label
names it). To label a version the policy does not serve yet, first change the policy
(`--policy`), wait until the service shows the version AVAILABLE, then move the label.

Its command line: training/commands/promote.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from artifact.model_config import Policy, edit_config, parse_config, write_config
from artifact.repository import parse_version
from artifact.storage import display
from training.errors import UsageError


def version_number(text: str) -> int:
    version = parse_version(text)
    if version is None:
        raise argparse.ArgumentTypeError(f"must be a version number (int64), got {text!r}")
    return version


version_number.__name__ = "version number"


def promote(
    config: str | Path,
    model: str,
    label: str | None = None,
    version: int | None = None,
    policy: Policy | None = None,
) -> list[str]:
    """Set a label and/or a policy in the model config file; what changed, a line each.

    Raises:
        ConfigError: the config does not parse or does not list the model.
        UsageError: the version is not on disk, or the config does not serve it.
    """
    path = Path(config)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"--config {path}: cannot read it: {err}") from err
    entries = {entry.name: entry for entry in parse_config(text, path)}
    entry = entries.get(model)
    if entry is None:
        raise UsageError(f"--model {model}: {path} lists no such model (it lists: "
                         f"{', '.join(entries)})")  # fmt: skip
    on_disk = entry.versions_on_disk()
    changes = []
    labels = None
    if label is not None:
        if version not in on_disk:
            raise UsageError(
                f"--version {version}: not in {display(entry.base_path)} (on disk: "
                f"{', '.join(map(str, on_disk)) or 'none'})"
            )
        served = entry.aspired(on_disk)
        if version not in served:
            raise UsageError(
                f"--version {version}: the config does not serve it (policy "
                f"{entry.policy.describe()}), so the service would refuse the label: first "
                f"promote --policy to include it (e.g. specific:"
                f"{','.join(map(str, sorted({*served, version})))}), wait until it is "
                "AVAILABLE, then move the label"
            )
        before = entry.labels.get(label)
        if before != version:
            changes.append(
                f"{model}: label {label} {before if before is not None else '(none)'} -> {version}"
            )
        labels = {label: version}
    if policy is not None:
        if policy.kind == "specific":
            missing = sorted(set(policy.versions) - set(on_disk))
            if missing:
                raise UsageError(
                    f"--policy {policy.describe()}: version(s) {', '.join(map(str, missing))} "
                    f"not in {display(entry.base_path)}"
                )
        if policy != entry.policy:
            changes.append(f"{model}: policy {entry.policy.describe()} -> {policy.describe()}")
    if changes:
        write_config(path, edit_config(text, model, labels=labels, policy=policy, source=path))
    return changes
