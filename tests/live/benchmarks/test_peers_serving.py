"""Each peer row of `make bench-peers` really serves the session's model: it starts from its
venv, answers one image with the SavedModel's own probabilities, and takes a second of wrk;
and each tabular row the same with the session's tabular classifier (`any_models`), through the
peer's own runtime for named inputs.

The peers' venvs are 2 GB each and installed only by `make bench-peers` (or
`python -m benchmarks.peers setup`): without them these tests skip and say so.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.helpers import require_tool

from benchmarks import generic
from benchmarks.peers import run, spec, venvs


@pytest.fixture(scope="module")
def bodies(tmp_path_factory, small_test_data):
    """TF Serving bodies as common.request_bodies writes them, from the small test split."""
    images, _ = small_test_data
    directory = tmp_path_factory.mktemp("peer-bodies")
    out = {}
    for n in (1, 8):
        pixels = np.round(images[:n].astype(np.float32) / np.float32(255.0), 4)
        out[n] = directory / f"body-{n}.json"
        out[n].write_text(json.dumps({"instances": pixels.tolist()}))
    return out


def needs_venv(variant: spec.Variant):
    """The variant, skipped (before any fixture trains a model) when its venv is missing."""
    reason = (
        f"{variant.peer}'s venv is not installed in {venvs.venv_dir(variant.peer)}: "
        "`python -m benchmarks.peers setup` (or `make bench-peers`) installs it (2 GB)"
    )
    skip = pytest.mark.skipif(not venvs.is_installed(variant.peer), reason=reason)
    return pytest.param(variant, id=variant.key, marks=skip)


@pytest.mark.parametrize("variant", [needs_venv(v) for v in spec.ROWS])
def test_the_peer_serves_the_models_probabilities(variant, trained_model, bodies, tmp_path):
    require_tool("wrk", "wrk")
    instances = spec.instances_of(bodies[1].read_text())
    expected = run.reference_probabilities(trained_model.version_path, instances)
    peer_bodies = run.peer_bodies(variant.peer, bodies, tmp_path)

    row = run.bench_variant(
        variant, trained_model.version_path, peer_bodies, expected, tmp_path, 1, [(4, 1), (2, 8)]
    )

    assert row["max_abs_diff"] <= run.TOLERANCE
    assert set(row["loads"]) == {"c4x1", "c2x8"}
    for r in row["loads"].values():
        assert r["requests_per_s"] > 0 and r["errors"] == 0
    assert row["loads"]["c2x8"]["images_per_s"] == pytest.approx(
        8 * row["loads"]["c2x8"]["requests_per_s"]
    )


@pytest.mark.parametrize("variant", [needs_venv(v) for v in spec.TABULAR_ROWS])
def test_the_peer_serves_the_tabular_classifiers_probabilities(
    variant, any_models, sample_data, tmp_path
):
    require_tool("wrk", "wrk")
    version = any_models["classifier"] / "1"
    tabular = next(model for model in generic.MODELS if model.key == "tabular")
    instances = generic.instances_for(tabular, version, sample_data, 8)
    bodies = generic.write_bodies(tabular, instances, tmp_path, [(1, 1), (1, 8)])
    expected = run.reference_probabilities(version, instances[:1], spec.TABULAR)
    assert expected.shape == (1, 3)
    peer_bodies = run.peer_bodies(variant.peer, bodies, tmp_path, spec.TABULAR)

    row = run.bench_variant(variant, version, peer_bodies, expected, tmp_path, 1, [(4, 1), (2, 8)])

    assert row["max_abs_diff"] <= run.TOLERANCE and row["model"] == spec.TABULAR
    for r in row["loads"].values():
        assert r["requests_per_s"] > 0 and r["errors"] == 0 and r["cpu_us_per_request"] > 0
