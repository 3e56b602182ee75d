"""The version registry with a fake loader: no TensorFlow, no model, only its rules.

The policy and label cases are TF Serving's, from its g3doc/serving_config.md: "Serving a
Specific Version", "Serving Multiple Versions", "Assigning String Labels" (labels only to
AVAILABLE versions; --allow_version_labels_for_unavailable_models for new labels only).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from support.fakes import FakeLoader, write_version

from artifact.model_config import ConfigError, ModelEntry, Policy
from service.backends.registry import ModelRegistry, VersionRegistry
from service.errors import BadInput, NotFound, NotReady
from service.types import SignatureSpec, TensorSpec, VersionState

NAME = "fashion_mnist"
LATEST = Policy()


@pytest.fixture
def model_dir(tmp_path):
    return tmp_path / NAME


def entry(model_dir, policy: Policy = LATEST, labels=None, name=NAME) -> ModelEntry:
    return ModelEntry(name, Path(model_dir), policy, labels or {})


def make(model_dir, policy: Policy = LATEST, labels=None) -> tuple[VersionRegistry, FakeLoader]:
    loader = FakeLoader()
    return VersionRegistry(entry(model_dir, policy, labels), loader), loader


def states(registry) -> dict[int, str]:
    return {s.version: s.state.name for s in registry.statuses()}


def touch_later(path) -> None:
    """Move a file's modification time forward, as a finished copy or a fix does."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))


def served(registry, version=None, label=None) -> tuple[int, str]:
    lease = registry.acquire(version, label)
    lease.release()
    return lease.version, lease.servable


# --- the version policy --------------------------------------------------------------------


@pytest.mark.parametrize(
    "policy, on_disk, loaded",
    [
        pytest.param(Policy(), [1, 2, 10], [10], id="latest-default-is-one-numeric-order"),
        pytest.param(Policy("latest", 2), [1, 2, 3], [2, 3], id="latest-two"),
        pytest.param(Policy("latest", 5), [1, 2], [1, 2], id="latest-more-than-on-disk"),
        pytest.param(Policy("all"), [1, 2, 3], [1, 2, 3], id="all"),
        pytest.param(Policy("specific", versions=(42,)), [41, 42, 43], [42], id="specific-pin"),
        pytest.param(
            Policy("specific", versions=(42, 43)), [41, 42, 43, 44], [42, 43], id="specific-two"
        ),
    ],
)
def test_the_policy_picks_the_versions_that_load(model_dir, policy, on_disk, loaded):
    for version in on_disk:
        write_version(model_dir, version)
    registry, loader = make(model_dir, policy)
    asyncio.run(registry.refresh())
    assert sorted(loader.loads) == loaded
    # Newest first: the version that will answer is ready soonest.
    assert loader.loads == sorted(loaded, reverse=True)
    assert registry.available() == loaded
    assert registry.serving == max(loaded)
    for version in set(on_disk) - set(loaded):
        with pytest.raises(
            NotFound, match=rf"Servable not found for request: Specific\({NAME}, {version}\)"
        ):
            registry.acquire(version)


def test_a_new_version_takes_requests_only_once_loaded_and_the_old_one_leaves_after(model_dir):
    write_version(model_dir, 1)
    registry, loader = make(model_dir)

    async def run():
        await registry.refresh()
        write_version(model_dir, 2)
        loader.release = asyncio.Event()
        refreshing = asyncio.ensure_future(registry.refresh())
        while 2 not in loader.loads:
            await asyncio.sleep(0)
        # Version 2 loads: listed as LOADING, not served even when named; 1 answers.
        assert states(registry) == {1: "AVAILABLE", 2: "LOADING"}
        assert served(registry) == (1, "model-1")
        with pytest.raises(NotFound):
            registry.acquire(2)
        # A second refresh meanwhile waits for the first: the version loads once.
        second = asyncio.ensure_future(registry.refresh())
        loader.release.set()
        await asyncio.gather(refreshing, second)
        assert served(registry) == (2, "model-2")
        await asyncio.sleep(0)  # the unload runs as a task

    asyncio.run(run())
    assert loader.loads == [1, 2]
    assert loader.unloads == [1]
    # Unloaded, and still listed as TF Serving lists it: END, error code OK.
    assert states(registry) == {2: "AVAILABLE", 1: "END"}


def test_a_leaving_version_is_unloaded_only_after_its_requests_finish(model_dir):
    write_version(model_dir, 1)
    registry, loader = make(model_dir)

    async def run():
        await registry.refresh()
        lease = registry.acquire()  # a request in flight on version 1
        write_version(model_dir, 2)
        await registry.refresh()
        assert states(registry) == {2: "AVAILABLE", 1: "UNLOADING"}
        assert lease.servable == "model-1"
        await asyncio.sleep(0)
        assert loader.unloads == []
        lease.release()
        await asyncio.sleep(0)
        assert loader.unloads == [1]

    asyncio.run(run())
    assert states(registry) == {2: "AVAILABLE", 1: "END"}


# --- failures ------------------------------------------------------------------------------


def test_a_broken_newest_version_at_start_leaves_the_next_good_one_serving_at_once(model_dir):
    write_version(model_dir, 1)
    write_version(model_dir, 2)
    write_version(model_dir, 3, "garbage")
    registry, loader = make(model_dir)
    asyncio.run(registry.refresh())  # one refresh: no poller is needed
    assert registry.serving == 2
    assert loader.loads == [3, 2]
    broken = registry.version_status(3)
    assert broken.state == VersionState.END
    assert broken.error_code == "UNKNOWN"
    assert "not a SavedModel: 'garbage'" in broken.error_message


def test_when_no_version_loads_the_readiness_reason_names_the_failure(model_dir):
    write_version(model_dir, 1, "garbage")
    write_version(model_dir, 2, "rubbish")
    registry, loader = make(model_dir)
    asyncio.run(registry.refresh())
    assert registry.serving is None
    assert loader.loads == [2, 1]
    reason = registry.not_ready_reason()
    assert reason.startswith(f"no version of {NAME} loads; version 2 failed: ")
    assert "rubbish" in reason
    with pytest.raises(NotReady, match="rubbish"):
        registry.acquire()


def test_an_empty_model_folder_says_so(model_dir):
    registry, _ = make(model_dir)
    asyncio.run(registry.refresh())
    assert registry.serving is None
    assert registry.not_ready_reason() == f"no version under {model_dir}"
    assert registry.statuses() == []


def test_a_failed_version_is_tried_again_only_when_its_files_change(model_dir):
    write_version(model_dir, 1)
    broken = write_version(model_dir, 2, "half-copied")
    registry, loader = make(model_dir)

    async def run():
        for _ in range(3):
            await registry.refresh()
        assert loader.loads == [2, 1]
        assert registry.version_status(2).state == VersionState.END
        (broken / "saved_model.pb").write_text("good")
        touch_later(broken / "saved_model.pb")
        await registry.refresh()
        await asyncio.sleep(0)

    asyncio.run(run())
    assert loader.loads == [2, 1, 2]
    assert registry.serving == 2
    assert loader.unloads == [1]


def test_a_deleted_version_is_unloaded_and_the_newest_left_serves(model_dir):
    for version in (1, 2, 3):
        write_version(model_dir, version)
    registry, loader = make(model_dir)

    async def run():
        await registry.refresh()
        shutil.rmtree(model_dir / "3")
        await registry.refresh()
        # The newest left is loaded before 3 leaves: something answers all along.
        assert loader.loads == [3, 2]
        assert registry.serving == 2
        await asyncio.sleep(0)
        assert loader.unloads == [3]
        shutil.rmtree(model_dir / "2")
        shutil.rmtree(model_dir / "1")
        await registry.refresh()
        assert registry.serving is None
        assert registry.not_ready_reason() == f"no version under {model_dir}"
        write_version(model_dir, 4)
        await registry.refresh()
        assert registry.serving == 4

    asyncio.run(run())
    # Deleted versions that were served stay listed in END (TF Serving's status history).
    assert states(registry) == {4: "AVAILABLE", 3: "END", 2: "END"}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("²", id="superscript-two"),
        pytest.param("１", id="fullwidth-one"),
        pytest.param("v3", id="prefixed"),
        pytest.param("-1", id="negative"),
        pytest.param("99999999999999999999", id="past-int64"),
    ],
)
def test_strange_folder_names_are_ignored_with_one_warning(model_dir, caplog, name):
    write_version(model_dir, 1)
    write_version(model_dir, name)
    (model_dir / ".export-abc").mkdir()  # an export being staged: silently ignored
    registry, loader = make(model_dir)
    with caplog.at_level(logging.WARNING, logger="service.backends.registry"):
        asyncio.run(registry.refresh())
        asyncio.run(registry.refresh())
    assert registry.serving == 1
    assert loader.loads == [1]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and repr(name) in warnings[0], warnings


# --- labels --------------------------------------------------------------------------------


def test_labels_name_versions_and_stable_takes_the_unpinned_requests(model_dir):
    for version in (41, 42, 43):
        write_version(model_dir, version)
    policy = Policy("specific", versions=(42, 43))
    registry, _ = make(model_dir, policy, {"stable": 42, "canary": 43})
    asyncio.run(registry.refresh())
    assert served(registry, label="stable") == (42, "model-42")
    assert served(registry, label="canary") == (43, "model-43")
    # TF Serving would answer with the newest, 43: a stable label keeps new versions out.
    assert registry.serving == 42 and served(registry) == (42, "model-42")
    with pytest.raises(BadInput, match="Unrecognized servable version label: beta"):
        registry.acquire(label="beta")
    with pytest.raises(
        BadInput, match=r"Both model version \(42\) and model version label \(stable\)"
    ):
        registry.acquire(42, "stable")
    with pytest.raises(BadInput, match="letters, digits and underscores"):
        registry.acquire(label="sta-ble")


def test_a_labeled_version_stays_when_the_latest_policy_moves_past_it(model_dir):
    write_version(model_dir, 1)
    registry, loader = make(model_dir, Policy("latest", 1), {"stable": 1})

    async def run():
        await registry.refresh()
        write_version(model_dir, 2)
        await registry.refresh()

    asyncio.run(run())
    assert registry.available() == [1, 2]
    assert registry.serving == 1  # the new export does not go live by itself
    assert loader.unloads == []


def apply(models: ModelRegistry, entries) -> list[str]:
    return asyncio.run(models.apply(entries))


def test_a_label_may_point_only_to_an_available_version_and_a_bad_config_changes_nothing(
    tmp_path,
):
    model_dir = tmp_path / NAME
    for version in (1, 2, 3):
        write_version(model_dir, version)
    loader = FakeLoader()
    models = ModelRegistry(loader)

    async def run():
        await models.apply([entry(model_dir, Policy("specific", versions=(1, 2)), {"stable": 1})])
        registry = models.get(NAME)
        assert registry.available() == [1, 2] and registry.serving == 1
        # Version 3 is not loaded: labelling it, even while adding it to the policy, is refused
        # whole (TF Serving's rule: add the version first, then move the label).
        refused = entry(
            model_dir, Policy("specific", versions=(1, 2, 3)), {"stable": 1, "canary": 3}
        )
        with pytest.raises(
            ConfigError,
            match="assign label to version 3 of model fashion_mnist, which is not currently available",
        ):
            await models.apply([refused])
        assert registry.entry.policy.versions == (1, 2) and registry.labels == {"stable": 1}
        assert registry.available() == [1, 2]
        # Step one: add the version. Step two: move the label.
        await models.apply(
            [entry(model_dir, Policy("specific", versions=(1, 2, 3)), {"stable": 1})]
        )
        changes = await models.apply(
            [entry(model_dir, Policy("specific", versions=(1, 2, 3)), {"stable": 1, "canary": 3})]
        )
        assert registry.labels == {"stable": 1, "canary": 3}
        return changes

    changes = asyncio.run(run())
    assert changes == [
        "model fashion_mnist: policy specific 1, 2, 3 -> specific 1, 2, 3, labels {'stable': 1} -> {'stable': 1, 'canary': 3}"
    ]
    assert loader.loads == [2, 1, 3]


def test_allow_unavailable_labels_relaxes_the_rule_for_new_labels_only(tmp_path):
    model_dir = tmp_path / NAME
    for version in (1, 2, 3, 4):
        write_version(model_dir, version)
    models = ModelRegistry(FakeLoader(), allow_unavailable_labels=True)

    async def run():
        await models.apply([entry(model_dir, Policy("specific", versions=(1,)), {"stable": 1})])
        # A new label to a version not loaded: allowed.
        await models.apply(
            [entry(model_dir, Policy("specific", versions=(1, 2)), {"stable": 1, "canary": 3})]
        )
        registry = models.get(NAME)
        assert registry.labels == {"stable": 1, "canary": 3}
        # A labeled version is aspired, so it loads, and then answers to its label.
        assert registry.available() == [1, 2, 3]
        assert served(registry, label="canary") == (3, "model-3")
        # Moving an existing label to a version that is not available: still refused.
        with pytest.raises(ConfigError, match="version 4 of model fashion_mnist"):
            await models.apply(
                [entry(model_dir, Policy("specific", versions=(1, 2)), {"stable": 4, "canary": 3})]
            )
        assert registry.labels == {"stable": 1, "canary": 3}

    asyncio.run(run())


def test_a_new_config_is_applied_whole_models_come_and_go(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    write_version(first, 1)
    write_version(second, 5)
    loader = FakeLoader()
    models = ModelRegistry(loader)

    async def run():
        await models.apply([entry(first, name="first")])
        changes = await models.apply([entry(second, name="second", labels={"stable": 5})])
        await asyncio.sleep(0)
        return changes

    changes = asyncio.run(run())
    assert list(models.models) == ["second"]
    assert models.get("second").serving == 5
    assert loader.unloads == [1]
    assert changes == [
        "model first: no longer in the config, unloaded",
        "model second: added (latest 1, labels {'stable': 5})",
    ]


def test_a_policy_change_unloads_what_leaves_once_what_stays_is_available(model_dir):
    for version in (1, 2, 3):
        write_version(model_dir, version)
    loader = FakeLoader()
    models = ModelRegistry(loader)

    async def run():
        await models.apply([entry(model_dir, Policy("all"))])
        await models.apply([entry(model_dir, Policy("specific", versions=(2,)))])
        await asyncio.sleep(0)

    asyncio.run(run())
    assert models.get(NAME).available() == [2]
    assert sorted(loader.unloads) == [1, 3]


# --- a new version's signatures -------------------------------------------------------------


class ContractLoader(FakeLoader):
    """Loads folders whose saved_model.pb names the one input of their signature."""

    async def load(self, version: int, path: Path):
        self.loads.append(version)
        name = (path / "saved_model.pb").read_text()
        inputs = (TensorSpec(name, np.dtype(np.float32), (-1,)),)
        contract = {"serving_default": SignatureSpec("serving_default", "predict", inputs, ())}
        return SimpleNamespace(version=version, contract=contract)

    async def unload(self, servable) -> None:
        self.unloads.append(servable.version)


@pytest.mark.parametrize("allowed", [False, True], ids=["refused", "allowed"])
def test_a_new_version_whose_signatures_differ_is_refused_unless_allowed(model_dir, allowed):
    write_version(model_dir, 1, "x")
    loader = ContractLoader()
    registry = VersionRegistry(entry(model_dir), loader, allow_signature_changes=allowed)

    async def run():
        await registry.refresh()
        write_version(model_dir, 2, "x")  # the same signatures: serves
        await registry.refresh()
        write_version(model_dir, 3, "pixels")
        await registry.refresh()
        await asyncio.sleep(0)  # unloads run as tasks

    asyncio.run(run())
    if allowed:
        assert registry.serving == 3
        return
    assert registry.serving == 2 and states(registry)[3] == "END"
    (status,) = [s for s in registry.statuses() if s.version == 3]
    assert status.error_message == (
        "ValueError: its signatures differ from version 2's, which serves: 'serving_default': "
        "inputs ['x'] -> ['pixels']; set ALLOW_SIGNATURE_CHANGES=true to serve it"
    )
    assert 3 in loader.unloads  # loaded to be read, then let go
