"""`python -m training export`: a model dir's latest checkpoint as a new version."""

from __future__ import annotations

from pathlib import Path

from training import cli, data, runs
from training.configs import ExportConfig
from training.errors import UsageError
from training.estimator import make_estimator
from training.publish import export_evaluated


def export(config: ExportConfig) -> int:
    """Export the latest checkpoint, evaluated on the test split, as the next version."""
    model_dir = Path(config.model_dir)
    params = runs.load_params(model_dir)
    step = runs.latest_step(model_dir)
    if step == 0:
        raise UsageError(f"{model_dir}: holds no checkpoint to export")
    labels = tuple(params.get("labels") or cli.labels(config.labels, config.data_dir))
    _, test_images, test_labels = data.load_split(config.data_dir, "test")
    estimator = make_estimator(str(model_dir), params)
    context = runs.report_context(config.data_dir, model_dir, params)
    version = export_evaluated(
        estimator, config.export_dir, labels, test_images, test_labels, context
    )
    print(f"Exported step {step} of {model_dir} as {version}")
    return 0
