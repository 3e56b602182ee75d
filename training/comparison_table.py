"""What `compare` on IDX data and on a CSV file or an image folder share: the kinds chosen,
a fresh work dir, an export's parameter count, the classifiers' table and the files written."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf

from training.errors import UsageError

TABLE_FILE = "comparison.md"
RESULTS_FILE = "comparison.json"
CHART_FILE = "comparison.png"


def saved_model_parameter_count(version: Path) -> int:
    """Scalars in an exported version's float variables (the model; not the global step)."""
    reader = tf.train.load_checkpoint(str(version / "variables" / "variables"))
    dtypes = reader.get_variable_to_dtype_map()
    return int(
        sum(
            np.prod(shape)
            for name, shape in reader.get_variable_to_shape_map().items()
            if dtypes[name].is_floating
        )
    )


def format_table(rows: list[dict], labels, accuracy_name: str = "test accuracy") -> str:
    """The results as a Markdown table, in the given order."""
    head = ["rank", "model", accuracy_name, "training s", "parameters", "export MB"]
    head += [f"recall {label}" for label in labels]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rank, row in enumerate(rows, 1):
        cells = [
            str(rank),
            row["model"],
            f"{row['accuracy']:.4f}",
            f"{row['train_seconds']:.1f}",
            f"{row['parameters']:,}",
            f"{row['export_bytes'] / 1e6:.2f}",
        ]
        cells += [f"{recall:.3f}" for recall in row["recall"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def chosen_kinds(models: list[str] | None, known, for_what: str = "") -> list[str]:
    """The kinds --models names (all known ones by default), each once; UsageError for an
    unknown one."""
    kinds = list(dict.fromkeys(known if models is None else models))
    unknown = [k for k in kinds if k not in known]
    if unknown or not kinds:
        raise UsageError(
            f"--models: unknown kind(s) {', '.join(unknown) or '(none given)'}; "
            f"known kinds{for_what}: {', '.join(known)}"
        )
    return kinds


def check_work_dir(work_dir: Path) -> None:
    """UsageError unless the work dir is new or empty: every kind starts from scratch."""
    if work_dir.exists() and (not work_dir.is_dir() or any(work_dir.iterdir())):
        raise UsageError(
            f"--work-dir {work_dir}: already exists and is not empty; every kind must start "
            "from scratch, so give a new folder"
        )


def budget_text(max_steps: int, batch_size: int, steps_per_epoch: int) -> str:
    """'200 steps of 32 (40 epochs)': the budget every kind trained for."""
    epochs = max_steps / steps_per_epoch
    return f"{max_steps} steps of {batch_size} ({epochs:.2g} epoch{'s' * (epochs != 1)})"


def save_comparison(
    work_dir: Path,
    heading: str,
    preamble: str,
    table: str,
    results: dict,
    draw_chart: Callable[[Path], object],
) -> None:
    """Print the table under its heading; write it (after the preamble) to comparison.md, the
    results to comparison.json and the chart to comparison.png in the work dir."""
    print(f"\n{heading}:")
    print(table)
    (work_dir / TABLE_FILE).write_text(f"{preamble}\n\n{table}\n")
    (work_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2) + "\n")
    draw_chart(work_dir / CHART_FILE)
    print(f"Wrote {work_dir / TABLE_FILE}, {work_dir / RESULTS_FILE} and {work_dir / CHART_FILE}")
