"""The version registry with a fake loader: no TensorFlow, no model, only its rules."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil

import pytest
from fakes import FakeLoader, write_version

from service.errors import NotFound, NotReady
from service.registry import VersionRegistry
from service.types import VersionState

NAME = "fashion_mnist"


@pytest.fixture
def model_dir(tmp_path):
    return tmp_path / NAME


def make(model_dir) -> tuple[VersionRegistry, FakeLoader]:
    loader = FakeLoader()
    return VersionRegistry(NAME, model_dir, loader), loader


def states(registry) -> dict[int, str]:
    return {s.version: s.state.name for s in registry.statuses()}


def touch_later(path) -> None:
    """Move a file's modification time forward, as a finished copy or a fix does."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))


def test_the_newest_version_serves_and_older_ones_load_only_when_named(model_dir):
    for version in (1, 2, 10):
        write_version(model_dir, version)
    registry, loader = make(model_dir)

    async def run():
        await registry.refresh()
        assert registry.serving == 10
        assert await registry.servable(None) == (10, "model-10")
        assert loader.loads == [10]  # numeric order: 10 is newer than 2
        assert await registry.servable(1) == (1, "model-1")
        assert loader.loads == [10, 1]
        await registry.refresh()  # nothing newer: nothing loads
        assert loader.loads == [10, 1]

    asyncio.run(run())
    assert states(registry) == {10: "AVAILABLE", 1: "AVAILABLE"}
    # The serving version first, then newest first.
    assert [s.version for s in registry.statuses()] == [10, 1]


def test_a_newer_version_is_swapped_in_only_once_it_loaded(model_dir):
    write_version(model_dir, 1)
    registry, loader = make(model_dir)

    async def run():
        await registry.refresh()
        write_version(model_dir, 2)
        loader.release = asyncio.Event()
        refreshing = asyncio.ensure_future(registry.refresh())
        while 2 not in loader.loads:
            await asyncio.sleep(0)
        # Loading: listed as LOADING, while version 1 still answers.
        assert states(registry) == {1: "AVAILABLE", 2: "LOADING"}
        assert await registry.servable(None) == (1, "model-1")
        loader.release.set()
        await refreshing
        assert await registry.servable(None) == (2, "model-2")

    asyncio.run(run())


def test_a_broken_newest_version_at_start_leaves_the_next_good_one_serving_at_once(model_dir):
    write_version(model_dir, 1)
    write_version(model_dir, 2)
    write_version(model_dir, 3, "garbage")
    registry, loader = make(model_dir)
    asyncio.run(registry.refresh())  # one refresh: no poller is needed
    assert registry.serving == 2
    assert loader.loads == [3, 2]
    (broken,) = [s for s in registry.statuses() if s.version == 3]
    assert broken.state == VersionState.END
    assert broken.error_code == "UNKNOWN"
    assert "not a SavedModel: 'garbage'" in broken.error_message


def test_when_no_version_loads_the_readiness_reason_names_the_failure(model_dir):
    write_version(model_dir, 1, "garbage")
    write_version(model_dir, 2, "rubbish")
    registry, _ = make(model_dir)
    asyncio.run(registry.refresh())
    assert registry.serving is None
    reason = registry.not_ready_reason()
    assert reason.startswith(f"no version of {NAME} loads; version 2 failed: ")
    assert "rubbish" in reason
    with pytest.raises(NotReady, match="rubbish"):
        asyncio.run(registry.servable(None))


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
        # A request naming it is refused from the record, not by loading it again.
        with pytest.raises(NotReady, match="half-copied"):
            await registry.servable(2)
        assert loader.loads == [2, 1]
        (broken / "saved_model.pb").write_text("good")
        touch_later(broken / "saved_model.pb")
        await registry.refresh()
        assert loader.loads == [2, 1, 2]
        assert registry.serving == 2

    asyncio.run(run())
    assert states(registry) == {2: "AVAILABLE", 1: "AVAILABLE"}


def test_a_deleted_version_is_unloaded_and_the_newest_left_serves(model_dir):
    for version in (1, 2, 3):
        write_version(model_dir, version)
    registry, loader = make(model_dir)

    async def run():
        await registry.refresh()
        await registry.servable(1)  # loaded on demand
        shutil.rmtree(model_dir / "3")
        await registry.refresh()
        # Version 1 is loaded, but the newest left is 2: it is loaded and serves.
        assert registry.serving == 2
        assert loader.unloads == [3]
        shutil.rmtree(model_dir / "2")
        shutil.rmtree(model_dir / "1")
        await registry.refresh()
        assert registry.serving is None
        assert registry.not_ready_reason() == f"no version under {model_dir}"
        assert sorted(loader.unloads) == [1, 2, 3]
        write_version(model_dir, 4)
        await registry.refresh()
        assert registry.serving == 4

    asyncio.run(run())
    assert states(registry) == {4: "AVAILABLE"}


def test_concurrent_requests_for_a_version_being_loaded_share_one_load(model_dir):
    write_version(model_dir, 1)
    write_version(model_dir, 2)
    registry, loader = make(model_dir)

    async def run():
        await registry.refresh()
        loader.release = asyncio.Event()
        waiting = [asyncio.ensure_future(registry.servable(1)) for _ in range(5)]
        while 1 not in loader.loads:
            await asyncio.sleep(0)
        assert not any(task.done() for task in waiting)
        loader.release.set()
        return await asyncio.gather(*waiting)

    assert asyncio.run(run()) == [(1, "model-1")] * 5
    assert loader.loads == [2, 1]


def test_a_failed_load_fails_every_request_waiting_for_it(model_dir):
    write_version(model_dir, 2)
    write_version(model_dir, 1, "garbage")
    registry, loader = make(model_dir)

    async def run():
        await registry.refresh()
        loader.release = asyncio.Event()
        waiting = [asyncio.ensure_future(registry.servable(1)) for _ in range(3)]
        while 1 not in loader.loads:
            await asyncio.sleep(0)
        loader.release.set()
        return await asyncio.gather(*waiting, return_exceptions=True)

    results = asyncio.run(run())
    assert all(isinstance(r, NotReady) and "garbage" in r.message for r in results), results
    assert loader.loads == [2, 1]


def test_a_version_not_on_disk_is_not_found_in_tf_servings_words(model_dir):
    write_version(model_dir, 1)
    registry, _ = make(model_dir)
    asyncio.run(registry.refresh())
    with pytest.raises(NotFound) as excinfo:
        asyncio.run(registry.servable(7))
    assert excinfo.value.message == f"Servable not found for request: Specific({NAME}, 7)"
    with pytest.raises(NotFound) as excinfo:
        asyncio.run(registry.version_status(7))
    assert excinfo.value.message == f"Could not find version 7 of model {NAME}"


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
    with caplog.at_level(logging.WARNING, logger="service.registry"):
        asyncio.run(registry.refresh())
        asyncio.run(registry.refresh())
    assert registry.serving == 1
    assert loader.loads == [1]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and repr(name) in warnings[0], warnings


def test_close_unloads_everything(model_dir):
    write_version(model_dir, 1)
    write_version(model_dir, 2)
    registry, loader = make(model_dir)

    async def run():
        await registry.refresh()
        await registry.servable(1)
        await registry.close()

    asyncio.run(run())
    assert sorted(loader.unloads) == [1, 2]
    assert registry.serving is None
    assert registry.not_ready_reason() == "the service is shutting down"
