"""`make bench`'s rows of the models of other contracts, in a short run, on the live tier's own
tabular classifier and 32x32x3 CNN (`any_models`: the same kinds the bench trains when
`models/` has none, tests/unit/benchmarks/test_bench.py): each served answer held against its
SavedModel's, each model loaded with wrk for a second at two small loads."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.helpers import require_tool

from benchmarks import bench, generic

LOADS = [(2, 1), (2, 8)]
# The live tier's models standing for the bench's (generic.MODELS' names).
STAND_INS = {"tabular_classifier": "classifier", "shapes": "shapes"}


def test_the_rows_measure_real_answers(tmp_path, any_models, sample_data):
    require_tool("wrk", "wrk")
    models_root = tmp_path / "models"
    models_root.mkdir()
    for name, ours in STAND_INS.items():
        (models_root / name).symlink_to(any_models[ours])
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "data").symlink_to(sample_data)  # sample-data's files, already written
    lines = []
    rows = generic.bench_generic(
        bench.service_environment(), workdir, 1, loads=LOADS, models_root=models_root,
        log=lambda *args, **kwargs: lines.append(" ".join(map(str, args))),
        ceiling_seconds=0.05,
    )  # fmt: skip
    assert set(rows) == {model.key for model in generic.MODELS}
    assert {model.name for model in generic.MODELS} == set(STAND_INS)
    for model in generic.MODELS:
        row = rows[model.key]
        assert Path(row["version"]) == models_root / model.name / "1"
        assert row["max_abs_diff"] <= generic.TOLERANCE
        assert row["ceiling"]["images_per_s"] > 0 and row["ceiling"]["best_batch"] in (
            1, 8, 32, 64, 128, 256
        )  # fmt: skip
        assert set(row["loads"]) == {"c2x1", "c2x8"}
        for measured in row["loads"].values():
            assert measured["requests_per_s"] > 0 and measured["errors"] == 0
        assert row["loads"]["c2x8"]["images_per_s"] == pytest.approx(
            8 * row["loads"]["c2x8"]["requests_per_s"]
        )
    table = generic.generic_table({"generic": rows})
    assert "| tabular classifier (LinearClassifier, 4 named features) | c=2, 8/req |" in table
    assert "| 32x32x3 image CNN (shapes) | c=2, 1/req |" in table
    assert any("tabular classifier" in line for line in lines)
