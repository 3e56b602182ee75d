"""Reloading the model config: a good new file is applied whole, a bad one refused whole."""

from __future__ import annotations

import asyncio
import logging

import pytest
from support.fakes import FakeBackend, write_version

from artifact.model_config import ConfigError
from service.config_watcher import ConfigWatcher
from service.settings import Settings, default_model, initial_entries

CONFIG = """model_config_list {{
  config {{ name: "fashion_mnist" base_path: "fashion_mnist" {extra} }}
}}
"""


@pytest.fixture
def config_file(tmp_path):
    for version in (1, 2):
        write_version(tmp_path / "fashion_mnist", version)
    path = tmp_path / "models.config"
    path.write_text(CONFIG.format(extra=""))
    return path


class RefusingBackend(FakeBackend):
    """Refuses every config, as a backend does when a label breaks TF Serving's rule."""

    async def apply_config(self, entries):
        raise ConfigError("Request to assign label to version 2 of model fashion_mnist, ...")


def test_a_changed_file_is_applied_and_an_unchanged_one_is_not(config_file):
    backend = FakeBackend()
    watcher = ConfigWatcher(config_file, 0, backend)
    assert asyncio.run(watcher.check()) is False
    config_file.write_text(CONFIG.format(extra='version_labels { key: "stable" value: 1 }'))
    assert asyncio.run(watcher.check()) is True
    assert asyncio.run(watcher.check()) is False
    (applied,) = backend.applied
    assert [(e.name, dict(e.labels)) for e in applied] == [("fashion_mnist", {"stable": 1})]
    assert watcher.status()["error"] is None


@pytest.mark.parametrize(
    "text, message",
    [
        pytest.param("model_config_list {", "not a ModelServerConfig in text format", id="syntax"),
        pytest.param(CONFIG.format(extra='version_labels { key: "stable" value: 7 }'),
                     "label 'stable' points to version 7, not in", id="label-to-missing-version"),
        pytest.param(CONFIG.format(extra="model_version_policy { specific { versions: 9 } }"),
                     "policy specific asks for version(s) 9", id="policy-without-version"),
        pytest.param('model_config_list { config { name: "fashion_mnist" base_path: "fashion_mnist" } '
                     'config { name: "fashion_mnist" base_path: "fashion_mnist" } }',
                     "Illegal to list model fashion_mnist multiple times", id="duplicate-model"),
    ],
)  # fmt: skip
def test_a_bad_file_is_refused_logged_and_reported_and_the_old_config_stays(
    config_file, caplog, text, message
):
    backend = FakeBackend()
    watcher = ConfigWatcher(config_file, 0, backend)
    config_file.write_text(text)
    with caplog.at_level(logging.ERROR, logger="service.config"):
        assert asyncio.run(watcher.check()) is False
        assert asyncio.run(watcher.check()) is False  # tried again, but not logged again
    assert backend.applied == []
    status = watcher.status()
    assert message in status["error"] and status["error_at"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "refused, the previous one keeps serving" in errors[0]
    # Fixed: applied, and the error is gone.
    config_file.write_text(CONFIG.format(extra='version_labels { key: "stable" value: 2 }'))
    assert asyncio.run(watcher.check()) is True
    assert watcher.status()["error"] is None


def test_a_config_the_backend_refuses_is_reported(config_file):
    watcher = ConfigWatcher(config_file, 0, RefusingBackend())
    config_file.write_text(CONFIG.format(extra='version_labels { key: "stable" value: 2 }'))
    assert asyncio.run(watcher.check()) is False
    assert watcher.status()["error"].startswith("Request to assign label to version 2")


def test_the_shortcut_and_the_file_give_the_models_to_serve(config_file, tmp_path):
    shortcut = initial_entries(Settings(model_name="m", model_base_path=str(tmp_path)))
    assert [(e.name, e.base_path) for e in shortcut] == [("m", tmp_path / "m")]
    from_file = initial_entries(Settings(model_config_file=str(config_file)))
    assert [(e.name, e.base_path) for e in from_file] == [
        ("fashion_mnist", tmp_path / "fashion_mnist")
    ]
    assert default_model(Settings(model_name="other"), from_file) == "fashion_mnist"
    with pytest.raises(ConfigError, match="cannot read the model config"):
        initial_entries(Settings(model_config_file=str(tmp_path / "missing.config")))


class AvailableLaterBackend(FakeBackend):
    """Refuses a config until its versions have "loaded" (after the first attempt)."""

    def __init__(self):
        super().__init__()
        self.attempts = 0

    async def apply_config(self, entries):
        self.attempts += 1
        if self.attempts == 1:
            raise ConfigError(
                "Request to assign label to version 2 of model fashion_mnist, which is not currently available for inference"
            )
        return await super().apply_config(entries)


def test_a_refused_file_is_tried_again_and_applies_once_its_version_is_available(config_file):
    backend = AvailableLaterBackend()
    watcher = ConfigWatcher(config_file, 0, backend)
    config_file.write_text(CONFIG.format(extra='version_labels { key: "canary" value: 2 }'))
    assert asyncio.run(watcher.check()) is False
    assert "not currently available" in watcher.status()["error"]
    assert asyncio.run(watcher.check()) is True
    assert watcher.status()["error"] is None and len(backend.applied) == 1
