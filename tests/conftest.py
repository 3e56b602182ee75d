"""What every test gets: a clean environment, and its tier, read from the folder it lives in.

tests/unit/ is the fast tier (no TensorFlow); tests/live/ is the real end-to-end tier, and each of
its tests gets the `slow` marker here, so `pytest -m "not slow"` selects the fast tier too
(tests/README.md). The real data's folder is here, for both tiers; the live tier's session
fixtures (a small copy of it, a model trained on that) are in tests/live/conftest.py; plain
helpers are in tests/support/.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from support.servers import settings_vars

# Before anything imports TensorFlow: keep its C++ INFO/WARNING lines out of the test output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# training.data.DEFAULT_DATA_DIR, not imported here: training.data imports TensorFlow.
DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"
REAL_DATA_DIR = Path(os.environ.get("FASHION_MNIST_DIR", DEFAULT_DATA_DIR))

TESTS_DIR = Path(__file__).parent
UNIT_DIR = TESTS_DIR / "unit"
LIVE_DIR = TESTS_DIR / "live"
# Whether this run collected a test under tests/live (which may import TensorFlow).
COLLECTED_LIVE = pytest.StashKey[bool]()


def _is_live(path: Path) -> bool:
    return path.is_relative_to(LIVE_DIR)


def _deselects_slow(config) -> bool:
    return config.option.markexpr.replace(" ", "") == "notslow"


@pytest.fixture(scope="session", autouse=True)
def clean_environment(tmp_path_factory):
    """Run every test as CI would, whatever the developer's shell holds.

    The service's settings (PORT, BACKEND, MAX_IMAGES, ...) and TF_CONFIG are read by code
    that runs inside the test process; the working directory is a scratch folder, so a test
    whose refusal regresses cannot write into the repository's models/ or runs/.
    """
    with pytest.MonkeyPatch.context() as patch:
        for name in settings_vars() | {"TF_CONFIG"}:
            patch.delenv(name, raising=False)
        patch.chdir(tmp_path_factory.mktemp("cwd"))
        yield


def pytest_ignore_collect(collection_path, config):
    """With `-m "not slow"`, tests/live is not even imported: collecting it would import
    TensorFlow (seconds) only to deselect every test in it."""
    if _deselects_slow(config) and _is_live(collection_path):
        return True
    return None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    """Mark every test under tests/live slow; refuse a test that has no tier by its folder."""
    misplaced = []
    config.stash[COLLECTED_LIVE] = False
    for item in items:
        if _is_live(item.path):
            item.add_marker(pytest.mark.slow)
            config.stash[COLLECTED_LIVE] = True
        elif not item.path.is_relative_to(UNIT_DIR) or item.get_closest_marker("slow"):
            misplaced.append(item.nodeid)
    if misplaced:
        raise pytest.UsageError(
            "a test's tier is the folder it lives in: tests/unit (fast, no TensorFlow) or "
            "tests/live (slow, marked here), never a marker; move these:\n  "
            + "\n  ".join(misplaced)
        )


@pytest.fixture(scope="session")
def real_data_dir() -> Path:
    """The real Fashion-MNIST directory; `make setup` installs it, so missing is a failure."""
    if not (REAL_DATA_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.fail(
            f"Fashion-MNIST not found in {REAL_DATA_DIR}: run `make setup` "
            "(it installs the Debian package dataset-fashion-mnist)"
        )
    return REAL_DATA_DIR


@pytest.fixture(scope="session", autouse=True)
def fast_tier_stays_light(request):
    """Fail a run that collected no live test (`pytest tests/unit`, `pytest -m "not slow"`)
    when TensorFlow was imported anyway: it takes seconds, and is what the fast tier exists to
    avoid."""
    yield
    if not request.config.stash.get(COLLECTED_LIVE, False):
        assert "tensorflow" not in sys.modules, (
            "a test under tests/unit imported TensorFlow: move it to tests/live, or keep "
            "TensorFlow out of its path"
        )
