"""`make bench`'s rows of the models of other contracts, in a short run: with no version
exported, the bench trains the tabular classifier and the 32x32x3 CNN from freshly written
sample data, holds each served answer against its SavedModel's, and loads each with wrk for a
second at two small loads."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.helpers import require_tool

from benchmarks import bench, generic

LOADS = [(2, 1), (2, 8)]


def test_the_rows_train_what_is_missing_and_measure_real_answers(tmp_path):
    require_tool("wrk", "wrk")
    lines = []
    rows = generic.bench_generic(
        bench.service_environment(), tmp_path, 1, loads=LOADS, models_root=tmp_path / "empty",
        log=lambda *args, **kwargs: lines.append(" ".join(map(str, args))),
        ceiling_seconds=0.05,
    )  # fmt: skip
    assert set(rows) == {model.key for model in generic.MODELS}
    for model in generic.MODELS:
        row = rows[model.key]
        # Trained now: nothing was exported under the models root.
        assert Path(row["version"]).parent == tmp_path / "models" / model.name
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
