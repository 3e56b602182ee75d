"""Render the measured figures into the pages that show them, from their one source each.

    python docs/figures.py           # rewrite the generated blocks (make figures)
    python docs/figures.py --check   # exit 1 naming each block that is out of date

Sources:
- `benchmarks/results/latest.json`, the last `make bench` / `make bench-peers` run, rendered
  by the benchmark's own `benchmarks.tables.table` (the same tables as `latest.md`);
- `benchmarks/results/profiles/*.json`, the profiles of one request
  (`python -m benchmarks.profile`), rendered by `benchmarks.profile.profiles_block` on the
  Benchmarks page;
- `docs/measured.json`, the figures that are not benchmark results: setup and test times,
  training accuracy, the baselines' comparison; and `request_path`, the date the request
  path last changed in a way that moves the benchmark's figures: a benchmark older than it is
  flagged beside its figures.

Each generated block sits between `<!-- BEGIN figures:NAME -->` and `<!-- END figures:NAME -->`
in `docs/figures.md` (and the README's three commands, the WORKERS figures on the Running the
service page, the profiles and the staleness warning on the Benchmarks page); the text around
the markers is written by hand and never quotes a figure.
tests/unit/docs/test_docs.py fails when a block differs from what this script renders.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LATEST = ROOT / "benchmarks" / "results" / "latest.json"
MEASURED = ROOT / "docs" / "measured.json"
FIGURES_PAGE = ROOT / "docs" / "figures.md"
README = ROOT / "README.md"
CONTAINERS_PAGE = ROOT / "docs" / "containers.md"
BENCHMARKS_PAGE = ROOT / "docs" / "benchmarks.md"
OPERATIONS_PAGE = ROOT / "docs" / "operations.md"
# The files a request the benchmark sends passes through: a commit on one after the benchmark
# ran means its figures are the code's before (measured.json's request_path says when and what;
# tests/unit/docs/test_docs.py holds the two together).
REQUEST_PATH = (
    "service/server.py",
    "service/ingress.py",
    "service/routes.py",
    "service/codecs",
    "service/dataplane.py",
    "service/backends/batching.py",
    "service/backends/inprocess.py",
    "service/protocols/tfserving_rest.py",
    "service/protocols/v2.py",
    "service/protocols/grpc_server.py",
)
# The loads the WORKERS block compares, in the benchmark's keys: c=clients, x=images a request.
WORKERS_LOADS = ("c1x1", "c16x1", "c64x1", "c16x8")

# The benchmark's tables, in table()'s order, each under a heading other pages can link to.
SECTION_HEADINGS = (
    ("Ceiling (1)", "Throughput by load"),
    ("| load | (3)/(1)", "Ratios to the ceiling and to the naive app"),
    ("(4) service, batching on, by protocol", "By protocol"),
    ("(4) service, batching on, overloaded", "Overload"),
    ("(5) service, WORKERS=2, by protocol", "By protocol, WORKERS=2"),
    ("(5) service, WORKERS=2, overloaded", "Overload, WORKERS=2"),
    ("Memory", "Memory"),
    ("(4) against the peers on the tabular", "Against the peers, tabular classifier"),
    ("(4) against the peers", "Against the peers"),
    ("Peers on the tabular", "The peers' settings, tabular classifier"),
    ("Peers (", "The peers' settings"),
    ("The service on TensorFlow", "Both TensorFlows"),
    ("Other models", "Other models"),
    ("Targets", "Targets"),
)


def importable() -> None:
    """Put the repository on the path: run as a script, it is not."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def staleness_note(result: dict, measured: dict) -> str | None:
    """A warning when the benchmark ran before the request path's last change
    (measured.json's `request_path`), else None. Dates compare as ISO text (YYYY-MM-DD...)."""
    changed = measured.get("request_path")
    if changed is None or result["date"][:10] >= changed["date"]:
        return None
    return (
        f'!!! warning "Older than the code"\n    The last benchmark ran on {result["date"][:10]}; '
        f"the request path changed on {changed['date']} ({changed['what']}). Its figures "
        "are the code's before that change, until `make bench` runs again."
    )


def benchmark_block(result: dict, measured: dict | None = None) -> str:
    """The last benchmark run: where and when (and a warning when the request path changed
    after it), then every table, each under a heading."""
    importable()
    from benchmarks.tables import table

    machine = result.get("machine", {})
    command = "make bench-peers" if result.get("peers") else "make bench"
    lines = [
        f"Run: `{command}` on {result['date']}, {machine.get('cores', '?')} cores "
        f"({machine.get('cpu', '?')}), Python {machine.get('python', '?')}, "
        f"`TF_ENABLE_ONEDNN_OPTS={machine.get('onednn', '?')}`." + steal_text(result),
    ]
    note = staleness_note(result, measured or {})
    if note:
        lines += ["", note]
    for chunk in table(result).split("\n\n"):
        for prefix, heading in SECTION_HEADINGS:
            if chunk.startswith(prefix):
                lines += ["", f"### {heading}"]
                break
        lines += ["", chunk]
    return "\n".join(lines)


def steal_text(result: dict) -> str:
    """What the hypervisor took of the cores while the run measured (runs from before it was
    read say nothing): a run it took much from measured a slower machine, and its peers and
    rows measured at other moments may have met another speed."""
    steal = result.get("steal")
    if not steal:
        return ""
    return (
        f" The hypervisor took {steal['run']:.0%} of the cores' time over the run (steal, from "
        f"/proc/stat), and up to {steal['highest_load']:.0%} during one measured load."
    )


def load_name(key: str) -> str:
    """`c16x8` as the tables write it: `c=16, 8 img/req`."""
    clients, images = key[1:].split("x")
    return f"c={clients}, {images} img/req"


def workers_block(result: dict, measured: dict) -> str:
    """WORKERS=2 against one process, load by load, from the last benchmark run; the
    comparison's words (more, fewer) are the figures', not the writer's."""
    one, two = result["servers"]["batched"], result["servers"]["workers"]
    rows, more = [], []
    for key in WORKERS_LOADS:
        if key not in one or key not in two:
            continue
        a, b = one[key]["requests_per_s"], two[key]["requests_per_s"]
        rows.append([load_name(key), f"{a:,.0f}", f"{b:,.0f}", f"{b / a:.2f}"])
        more.append(b > a)
    machine = result.get("machine", {})
    if all(more):
        verdict = "two workers served more requests than one process at every load measured"
    elif not any(more):
        verdict = "two workers served fewer requests than one process at every load measured"
    else:
        loads = [row[0] for row, m in zip(rows, more, strict=True) if m]
        verdict = (
            "two workers served more requests than one process only at "
            + ", ".join(f"`{load}`" for load in loads)
            + ", fewer at the other loads"
        )
    lines = [
        f"In the last benchmark ({result['date']}, {machine.get('cores', '?')} cores, "
        f"[figures](figures.md#throughput-by-load)), {verdict}:",
        "",
        markdown_table(["load", "req/s, one process", "req/s, WORKERS=2", "ratio"], rows),
    ]
    note = staleness_note(result, measured)
    if note:
        lines += ["", note]
    return "\n".join(lines)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)


def setup_block(measured: dict) -> str:
    setup, containers = measured["setup"], measured["containers"]
    rows = [[row["step"], row["time"]] for row in setup["rows"]]
    rows += [[row["step"], row["time"]] for row in containers["rows"]]
    return f"Measured {setup['measured']}.\n\n" + markdown_table(["step", "time here"], rows)


def containers_block(measured: dict) -> str:
    containers = measured["containers"]
    rows = [[row["step"], row["time"]] for row in containers["rows"]]
    return f"Measured {containers['measured']}.\n\n" + markdown_table(["run", "time here"], rows)


def training_block(measured: dict) -> str:
    training, compare = measured["training"], measured["compare"]
    rows = [[r["command"], r["accuracy"], r["time"]] for r in training["rows"]]
    versus = [
        [r["model"], r["accuracy"], r["training"], r["parameters"], r["export"]]
        for r in compare["rows"]
    ]
    return "\n".join(
        [
            f"Test accuracy, measured {training['measured']}:",
            "",
            markdown_table(["command", "test accuracy", "training time"], rows),
            "",
            f"Every model kind on one budget, {compare['measured']}:",
            "",
            markdown_table(["model", "test accuracy", "training", "parameters", "export"], versus),
        ]
    )


def readme_commands_block(measured: dict) -> str:
    times = measured["setup"]["readme"]
    return "\n".join(
        [
            "```sh",
            "make serve   # set up the service and the trainer, serve the shipped model "
            "on 127.0.0.1:8000",
            f"             # ({times['serve']})",
            f"make test    # set up and run every test ({times['test']})",
            "make test-containers   # the images built and run with podman "
            f"({measured['containers']['readme']})",
            "```",
        ]
    )


def profiles_block() -> str:
    """The profiles of one request under benchmarks/results/profiles/, label by label."""
    importable()
    from benchmarks.profile import profiles_block as block

    return block()


def blocks() -> dict[Path, dict[str, str]]:
    """Every generated block's content, by file and block name."""
    result = json.loads(LATEST.read_text())
    measured = json.loads(MEASURED.read_text())
    return {
        FIGURES_PAGE: {
            "benchmark": benchmark_block(result, measured),
            "setup": setup_block(measured),
            "training": training_block(measured),
        },
        README: {"commands": readme_commands_block(measured)},
        CONTAINERS_PAGE: {"containers": containers_block(measured)},
        BENCHMARKS_PAGE: {
            "profiles": profiles_block(),
            "staleness": staleness_note(result, measured) or "",
        },
        OPERATIONS_PAGE: {"workers": workers_block(result, measured)},
    }


def marker_pattern(name: str) -> re.Pattern:
    return re.compile(
        rf"(<!-- BEGIN figures:{name} -->\n)(.*?)(<!-- END figures:{name} -->)", re.DOTALL
    )


def rendered(text: str, name: str, content: str, path: Path) -> str:
    """text with block `name` replaced by content.

    Raises:
        ValueError: the file has no such block, or has it more than once.
    """
    pattern = marker_pattern(name)
    found = len(pattern.findall(text))
    if found != 1:
        raise ValueError(f"{path}: {found} blocks named figures:{name}, expected 1")
    return pattern.sub(lambda m: m.group(1) + content + "\n" + m.group(3), text)


def outdated() -> list[str]:
    """The blocks (file: name) whose text differs from what the sources render."""
    stale = []
    for path, named in blocks().items():
        text = path.read_text()
        for name, content in named.items():
            if rendered(text, name, content, path) != text:
                stale.append(f"{path.relative_to(ROOT)}: figures:{name}")
    return stale


def write() -> list[Path]:
    """Rewrite every generated block; return the files that changed."""
    changed = []
    for path, named in blocks().items():
        text = original = path.read_text()
        for name, content in named.items():
            text = rendered(text, name, content, path)
        if text != original:
            path.write_text(text)
            changed.append(path)
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args()
    if args.check:
        stale = outdated()
        for block in stale:
            print(f"out of date: {block} (run: make figures)")
        return 1 if stale else 0
    for path in write():
        print(f"updated {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
