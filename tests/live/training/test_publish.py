"""The nightly retrain in two steps, as deploy/kubernetes's retrain CronJob runs them: its
command lines are read from the rendered manifest, with /models, /staging, /feedback and the
data moved into a scratch folder, a smaller budget and new data added, on a copy of
models/models.config and the session's trained model as version 1.

`retrain --stage-to` writes nothing into the model repository (every path's kind, mode, size,
modification time and bytes compared); `publish` puts the candidate in place as version 2,
labeled canary, a model that loads and predicts; and `publish` refuses a staging changed
since, half-written, not blessed, or judged against a version that no longer serves, each
with one line and the repository unchanged. The same checks on hand-made stagings, fast:
tests/unit/training/test_staging.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from contextlib import redirect_stdout
from pathlib import Path
from typing import NamedTuple

import pytest
from support.helpers import REPO_ROOT, assert_one_error_line, tree
from support.manifest_harness import KUBE_DIR, argv, entrypoints, render
from support.training_harness import call_main, integer_dirs

from artifact.contract import ASSETS_EXTRA, BLESSING_FILE, normalize_pixels
from artifact.model_config import parse_config
from artifact.saved_model import SavedModelPredictor
from training import data, staging

MODEL_NAME = "fashion_mnist"
NEW_IMAGES = 1200  # real train images 600..1800: new to the small data's 600
# Enough to beat the 40-step session model on the small data (as the one-step retrain's
# Kubernetes test found): measured, 0.820 on the test split and 0.823 on the reference against
# its 0.750 and 0.753, ahead by 21 of the 300 images and 11 of the 158.
BUDGET = ("--max-steps", "60", "--batch-size", "50", "--eval-every-secs", "1000",
          "--hooks", "none", "--deterministic")  # fmt: skip


class Staged(NamedTuple):
    """The CronJob's retrain step, run once; `restore()` puts its folders back as it left them."""

    root: Path  # /models, /staging, /feedback of the manifests live here
    places: dict[str, str]  # manifest path -> scratch path
    repository_before: dict  # tree() of the repository before the retrain
    out: str
    backup: Path

    def restore(self) -> None:
        for name in ("models", "staging"):
            shutil.rmtree(self.root / name, ignore_errors=True)
            shutil.copytree(self.backup / name, self.root / name, symlinks=True)

    def moved(self, args: list[str]) -> list[str]:
        return [
            next((new + a[len(old) :] for old, new in self.places.items() if a.startswith(old)), a)
            for a in args
        ]


@pytest.fixture(scope="module")
def cronjob_steps() -> tuple[list[str], list[str]]:
    """(retrain's, publish's) training arguments as the base's retrain CronJob runs them."""
    (cron,) = [
        o for o in render(KUBE_DIR / "base")
        if o["kind"] == "CronJob" and o["metadata"]["name"] == "retrain"
    ]  # fmt: skip
    spec = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (retrain,) = [c for c in spec["initContainers"] if c["name"] == "retrain"]
    (publish,) = spec["containers"]
    return argv(retrain, entrypoints())[3:], argv(publish, entrypoints())[3:]


@pytest.fixture(scope="module")
def staged(trained_model, small_data_dir, real_data_dir, cronjob_steps, tmp_path_factory):
    root = tmp_path_factory.mktemp("cronjob")
    models = root / "models"
    shutil.copytree(trained_model.export_base, models / MODEL_NAME)
    shipped = (REPO_ROOT / "models" / "models.config").read_text()
    assert '"/models/fashion_mnist"' in shipped
    (models / "models.config").write_text(shipped.replace('"/models/', f'"{models}/'))
    (root / "feedback").mkdir()
    _, images, labels = data.load_split(real_data_dir, "train")
    new = slice(600, 600 + NEW_IMAGES)
    data.write_idx(root / "new", "train", images[new], labels[new])
    places = {
        "/usr/share/datasets/fashion-mnist": str(small_data_dir),
        "/models": str(models),
        "/staging": str(root / "staging"),
        "/feedback": str(root / "feedback"),
    }
    retrain_args, _ = cronjob_steps
    before = tree(models)
    out = io.StringIO()
    result = Staged(root, places, before, "", tmp_path_factory.mktemp("backup"))
    with redirect_stdout(out):
        code = call_main(*result.moved(retrain_args), *BUDGET, "--extra-data", root / "new")
    assert code == 0, out.getvalue()
    for name in ("models", "staging"):
        shutil.copytree(root / name, result.backup / name, symlinks=True)
    return result._replace(out=out.getvalue())


@pytest.fixture
def cronjob(staged) -> Staged:
    """The scratch folders as the retrain step left them (every test changes them)."""
    staged.restore()
    return staged


def stage_dir(cronjob: Staged, cronjob_steps) -> Path:
    retrain_args, _ = cronjob_steps
    return Path(cronjob.moved([retrain_args[retrain_args.index("--stage-to") + 1]])[0])


def test_the_retrain_step_writes_nothing_in_the_repository_and_publish_puts_it_in_place(
    cronjob, cronjob_steps, capsys, small_test_data
):
    models = cronjob.root / "models"
    assert tree(models) == cronjob.repository_before  # not a file, mode or timestamp
    assert "Blessed: staged in" in cronjob.out and "is unchanged" in cronjob.out
    staging_dir = stage_dir(cronjob, cronjob_steps)
    manifest = json.loads((staging_dir / staging.MANIFEST_FILE).read_text())
    assert (manifest["outcome"], manifest["baseline_version"]) == (staging.STAGED, 1)
    staged_files = tree(staging_dir)

    _, publish_args = cronjob_steps
    assert call_main(*cronjob.moved(publish_args)) == 0
    out = capsys.readouterr().out
    assert f"Published {models / MODEL_NAME / '2'}" in out
    assert integer_dirs(models / MODEL_NAME) == ["1", "2"]
    config = models / "models.config"
    (entry,) = parse_config(config.read_text(), config)
    assert dict(entry.labels) == {"stable": 1, "canary": 2}
    version = models / MODEL_NAME / "2"
    for rel, digest in manifest["files"].items():
        if rel != f"{ASSETS_EXTRA}/{BLESSING_FILE}":
            assert hashlib.sha256((version / rel).read_bytes()).hexdigest() == digest["sha256"]
    blessing = json.loads((version / ASSETS_EXTRA / BLESSING_FILE).read_text())
    assert blessing["blessed"] is True and blessing["versions"]["candidate"] == 2
    for metric in ("accuracy/test split", "accuracy/reference"):
        assert blessing["candidate"][metric] >= blessing["baseline"][metric] + 0.03, metric
    assert blessing["publish"]["mode"] == "canary"
    images, _ = small_test_data
    classes, _ = SavedModelPredictor(version).predict_batched(normalize_pixels(images[:8]), 8)
    assert classes.shape == (8,)
    assert tree(staging_dir) == staged_files  # the staging is only read

    # Again: the same staging is published already; nothing new.
    before = tree(models)
    assert call_main(*cronjob.moved(publish_args)) == 0
    assert "published from this very staging already" in capsys.readouterr().out
    assert tree(models) == before

    # The next night on the same data: the retrain finds its run published (as after a
    # publish step that stopped before the label) and stages only that; publish moves the
    # label if it must, and nothing else.
    retrain_args, _ = cronjob_steps
    new_data = ("--extra-data", cronjob.root / "new")
    assert call_main(*cronjob.moved(retrain_args), *BUDGET, *new_data) == 0
    manifest = json.loads((staging_dir / staging.MANIFEST_FILE).read_text())
    assert (manifest["outcome"], manifest["published_version"]) == (staging.PUBLISHED, 2)
    assert not (staging_dir / staging.VERSION_DIR).exists()
    assert call_main(*cronjob.moved(publish_args)) == 0
    assert "is published already" in capsys.readouterr().out
    assert tree(models) == before


def change_a_byte(staging_dir: Path) -> None:
    (path,) = (staging_dir / "version" / "variables").glob("variables.data-*")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def unbless(staging_dir: Path) -> None:
    """The verdict turned, staged.json's digest of it too: only the verdict refuses it."""
    rel = f"{ASSETS_EXTRA}/{BLESSING_FILE}"
    path = staging_dir / "version" / rel
    path.write_text(json.dumps(json.loads(path.read_text()) | {"blessed": False}))
    manifest_path = staging_dir / staging.MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text())
    content = path.read_bytes()
    manifest["files"][rel] = {"bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    manifest_path.write_text(json.dumps(manifest))


def half_written(staging_dir: Path) -> None:
    (staging_dir / staging.MANIFEST_FILE).unlink()


def a_file_missing(staging_dir: Path) -> None:
    (staging_dir / "version" / "variables" / "variables.index").unlink()


def a_newer_version_serves(staging_dir: Path) -> None:
    """Version 2 appears (another export): the config's policy, latest 2, serves it now."""
    base = staging_dir.parents[2] / "models" / MODEL_NAME
    shutil.copytree(base / "1", base / "2")


@pytest.mark.parametrize(
    "spoil, message",
    [
        pytest.param(change_a_byte, "not the bytes that were staged", id="changed"),
        pytest.param(unbless, "the candidate is not blessed", id="not-blessed"),
        pytest.param(half_written, "no staged.json", id="half-written"),
        pytest.param(a_file_missing, "variables/variables.index: staged, but not there", id="file-missing"),
        pytest.param(a_newer_version_serves, "judged against version 1, but version 2 serves now", id="stale-baseline"),
    ],
)  # fmt: skip
def test_publish_refuses_a_spoiled_staging_and_changes_nothing(
    cronjob, cronjob_steps, capsys, spoil, message
):
    staging_dir = stage_dir(cronjob, cronjob_steps)
    assert staging_dir.parents[2] == cronjob.root  # a_newer_version_serves relies on it
    spoil(staging_dir)
    models = cronjob.root / "models"
    before = tree(models)
    _, publish_args = cronjob_steps
    assert call_main(*cronjob.moved(publish_args)) == 2
    assert_one_error_line(capsys.readouterr().err, message, "nothing published")
    assert tree(models) == before


@pytest.mark.parametrize(
    "extra, message",
    [
        pytest.param(["--stage-to", "{tmp}/staging", "--publish", "canary"], "--publish canary with --stage-to: the publish step moves the label", id="publish-with-stage-to"),
        pytest.param(["--stage-to", "{tmp}/models/staging"], "inside the model repository", id="staging-inside-the-repository"),
    ],
)  # fmt: skip
def test_a_staged_retrain_refuses_bad_options_before_it_trains(
    trained_model, small_data_dir, tmp_path, capsys, extra, message
):
    models = tmp_path / "models"
    shutil.copytree(trained_model.export_base, models / MODEL_NAME)
    before = tree(models)
    code = call_main(
        "retrain", "--data-dir", small_data_dir, "--model-dir", tmp_path / "runs",
        "--export-dir", models / MODEL_NAME,
        *[a.replace("{tmp}", str(tmp_path)) for a in extra],
    )  # fmt: skip
    assert code == 2
    assert_one_error_line(capsys.readouterr().err, message)
    assert tree(models) == before
    assert not list((tmp_path / "runs").glob("retrain-*"))
