"""The README, the docs site, the generated figures and the shipped examples.

- the site builds with `mkdocs build --strict` (a broken link or anchor, a page missing from
  the navigation fails it), and a broken link does fail it;
- every relative link in the Markdown files outside docs/ names a file in the repository;
- the generated figures (docs/figures.py) match their sources, and go stale when one changes;
- examples/ holds what examples/make_examples.py writes: a 28x28 PNG and the same pixels as
  a one-instance :predict body.

Fast tier: no TensorFlow, no server; the site build is one subprocess of a few seconds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
README = ROOT / "README.md"
# Markdown outside the docs site, read on GitHub: their links are checked here, the site's
# by mkdocs.
LOOSE_MARKDOWN = ["README.md", "CHANGELOG.md", "deploy/kubernetes/README.md", "models/README.md"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def figures():
    return load_module(ROOT / "docs" / "figures.py", "docs_figures")


@pytest.fixture(scope="module")
def make_examples():
    return load_module(EXAMPLES / "make_examples.py", "make_examples")


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
         "--site-dir", str(site)],
        cwd=config.parent, capture_output=True, text=True, timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip


# ---- the site ---------------------------------------------------------------------------------


def test_the_site_builds_strictly_with_every_page_in_the_navigation(tmp_path):
    result = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stderr
    pages = sorted(p.stem for p in (ROOT / "docs").glob("*.md"))
    assert len(pages) >= 12
    for page in pages:
        built = tmp_path / "site" / ("index.html" if page == "index" else f"{page}/index.html")
        assert built.is_file(), f"docs/{page}.md was not built"


def test_broken_links_and_a_page_left_out_of_the_navigation_fail_the_build(tmp_path):
    # The real configuration (theme, extensions, validation) over two small pages, so the
    # build takes less time than the whole site's; each fault must be reported.
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["nav"] = [{"Home": "index.md"}, {"Other": "other.md"}]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    docs = tmp_path / config["docs_dir"]
    docs.mkdir()
    faults = {
        "[gone](no-such-page.md)": "'no-such-page.md', but the target is not found",
        "[gone](other.md#no-such-heading)": "does not contain an anchor '#no-such-heading'",
        "[source](../service/app.py)": "'../service/app.py', but the target is not found",
    }
    (docs / "index.md").write_text("# Home\n\n[fine](other.md#a-heading)\n" + "\n".join(faults))
    (docs / "other.md").write_text("# Other\n\n## A heading\n")
    (docs / "orphan.md").write_text("# Orphan\n")
    result = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    for message in faults.values():
        assert message in output
    assert "orphan.md" in output and 'not included in the "nav"' in output
    assert "Aborted with 4 warnings in strict mode" in output  # the fine link is not one


# ---- links and the README -------------------------------------------------------------------


def relative_links(markdown: str) -> list[str]:
    """Link targets that point into the repository (no scheme, no bare #anchor)."""
    targets = LINK.findall(markdown)
    return [t for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_the_link_reader_finds_links_and_images():
    text = "[a](docs/x.md#y) ![b](img.png) [c](https://example.org) [d](#top) <http://x>"
    assert relative_links(text) == ["docs/x.md#y", "img.png"]


@pytest.mark.parametrize("name", LOOSE_MARKDOWN)
def test_every_relative_link_names_a_file_in_the_repository(name):
    path = ROOT / name
    links = relative_links(path.read_text())
    if name == "README.md":
        assert len(links) >= 20  # the README links into the docs: a reader that finds none is wrong
    for target in links:
        resolved = (path.parent / target.split("#")[0]).resolve()
        assert resolved.exists(), f"{name}: {target} -> {resolved} does not exist"
        assert resolved.is_relative_to(ROOT), f"{name}: {target} leaves the repository"


def test_the_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert 100 <= len(lines) < 250
    for command in ("make serve", "make test", "-d @examples/predict.json", "examples/sneaker.png"):
        assert any(command in line for line in lines), command


def test_the_readme_quotes_no_benchmark_figure_outside_its_generated_block(figures):
    text = README.read_text()
    prose = figures.marker_pattern("commands").sub("", text)
    assert prose != text
    for unit in ("req/s", "images/s", "µs", " us ", "p99"):
        assert unit not in prose, f"README quotes a benchmark figure ({unit}): link docs/figures.md"


# A figure typed by hand: a rate, a time in microseconds, a ratio (1.2x), a percentile's ms.
HAND_TYPED = [
    re.compile(r"\b\d[\d,]*(?:\.\d+)?\s?(?:req/s|requests/s|images/s|img/s|µs)"),
    re.compile(r"\b\d+(?:\.\d+)?x\b"),
    re.compile(r"\bp(?:50|99)\b[^.\n]{0,20}?\b\d+(?:\.\d+)? ?ms\b"),
]
GENERATED = re.compile(r"<!-- BEGIN (\w+:\w+) -->.*?<!-- END \1 -->", re.DOTALL)
# Pages that keep the measurements that shaped a feature, each with the run and conditions it
# was taken in (docs/figures.md says so): how the benchmark works and what its past runs and
# micro-measurements found, not the current figures.
MEASUREMENT_RECORDS = {"benchmarks.md", "benchmark-peers.md", "protocols.md"}


def hand_typed_figures(text: str) -> list[str]:
    prose = GENERATED.sub("", text)
    return [m[0] for pattern in HAND_TYPED for m in pattern.finditer(prose)]


def test_the_figure_reader_finds_rates_ratios_and_times_outside_generated_blocks():
    text = (
        "It serves 1,330 req/s, 1.2x one process, p99 at 8.7 ms, 212 µs a call; TF 2.x.\n"
        "<!-- BEGIN figures:x -->\n900 req/s, 2x\n<!-- END figures:x -->\n"
    )
    assert hand_typed_figures(text) == ["1,330 req/s", "212 µs", "1.2x", "p99 at 8.7 ms"]


@pytest.mark.parametrize(
    "page",
    [
        README,
        *(p for p in sorted((ROOT / "docs").glob("*.md")) if p.name not in MEASUREMENT_RECORDS),
    ],
    ids=lambda p: p.name,
)
def test_no_page_types_a_figure_by_hand(page):
    found = hand_typed_figures(page.read_text())
    assert found == [], f"{page.name}: generate these from docs/measured.json or the results"


# Where a file of the repository points a reader: `docs/<page>.md, "<section>"` (a heading of the
# page, or a paragraph's bold label, `**Section.**`; the start of it is enough).
POINTER = re.compile(r'docs/([\w.-]+\.md),? "([^"]+)"')
# Build output, venvs and data: not the repository's own text.
NOT_SOURCE = {"build", "site", "runs", "secrets", "models", "node_modules"}
TEXT_SUFFIXES = {".py", ".md", ".in", ".yml", ".yaml", ".toml", ".lua", ".sh", ".js", ".html",
                 ".cfg", ".txt", ".config", ""}  # fmt: skip


def source_files() -> list[Path]:
    files = []
    for top in ROOT.iterdir():
        if top.name.startswith(".") or top.name in NOT_SOURCE:
            continue
        candidates = [top] if top.is_file() else top.rglob("*")
        files += [p for p in candidates if p.is_file() and p.suffix in TEXT_SUFFIXES
                  and "__pycache__" not in p.parts and ".peers" not in p.parts]  # fmt: skip
    return files + [ROOT / "models" / "README.md", ROOT / "models" / "models.config"]


def section_names(page: Path) -> list[str]:
    text = page.read_text()
    names = re.findall(r"^#{1,6} (.+)$", text, re.M) + re.findall(r"^\*\*([^*]+?)\*\*", text, re.M)
    return [name.replace("`", "").strip() for name in names]


def pointers(text: str) -> list[tuple[str, str]]:
    """(page, section) of every pointer, over line breaks and comment markers."""
    flat = re.sub(r"\s*\n\s*(?:#|//|\*|--)?\s*", " ", text)
    return POINTER.findall(flat)


def test_the_pointer_reader_reads_across_comment_lines():
    text = '# see (docs/architecture.md,\n# "Two TensorFlows") and docs/training.md "Commands"'
    assert pointers(text) == [("architecture.md", "Two TensorFlows"), ("training.md", "Commands")]


def test_every_pointer_to_a_docs_section_names_one_that_exists():
    found = 0
    for path in source_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for page, section in pointers(text):
            found += 1
            where = f'{path.relative_to(ROOT)}: docs/{page}, "{section}"'
            assert (ROOT / "docs" / page).is_file(), f"{where}: no such page"
            names = section_names(ROOT / "docs" / page)
            wanted = section.replace("`", "").rstrip(".")
            assert any(name.startswith(wanted) for name in names), f"{where}: no such section"
    assert found >= 30  # a reader that finds few is wrong


# ---- generated figures ----------------------------------------------------------------------


def test_the_generated_figures_are_up_to_date(figures):
    assert figures.outdated() == [], "run: make figures"


def test_the_figures_go_stale_when_the_benchmark_results_change(figures, tmp_path, monkeypatch):
    result = json.loads(figures.LATEST.read_text())
    result["servers"]["batched"]["c64x1"]["requests_per_s"] += 1234.0
    changed = tmp_path / "latest.json"
    changed.write_text(json.dumps(result))
    monkeypatch.setattr(figures, "LATEST", changed)
    assert figures.outdated() == [
        "docs/figures.md: figures:benchmark",
        "docs/operations.md: figures:workers",  # WORKERS=2 against one process, at c=64
    ]


@pytest.mark.parametrize(
    ("section", "key", "stale"),
    [
        pytest.param("setup", "rows", "docs/figures.md: figures:setup", id="a setup step"),
        pytest.param("training", "rows", "docs/figures.md: figures:training", id="accuracy"),
        pytest.param("setup", "readme", "README.md: figures:commands", id="the README's times"),
    ],
)
def test_the_figures_go_stale_when_a_measured_figure_changes(
    figures, tmp_path, monkeypatch, section, key, stale
):
    measured = json.loads(figures.MEASURED.read_text())
    entry = measured[section][key]
    first = entry[0] if isinstance(entry, list) else entry
    first[next(iter(first))] += " (changed)"
    changed = tmp_path / "measured.json"
    changed.write_text(json.dumps(measured))
    monkeypatch.setattr(figures, "MEASURED", changed)
    assert figures.outdated() == [stale]


def test_the_benchmark_block_shows_every_table_of_the_last_run(figures):
    result = json.loads(figures.LATEST.read_text())
    block = figures.benchmark_block(result)
    assert result["date"] in block
    c64 = result["servers"]["batched"]["c64x1"]
    assert f"{c64['requests_per_s']:,.0f}" in block
    for heading in ("Throughput by load", "Ratios to the ceiling", "By protocol", "Overload",
                    "Targets"):  # fmt: skip
        assert f"### {heading}" in block


def test_the_benchmark_block_says_what_the_hypervisor_took_when_the_run_read_it(figures):
    result = json.loads(figures.LATEST.read_text())
    result.pop("steal", None)
    assert "steal" not in figures.benchmark_block(result)  # a run from before it was read
    result["steal"] = {"run": 0.04, "highest_load": 0.37}
    assert "took 4% of the cores' time over the run (steal, from /proc/stat), and up to 37%" in (
        figures.benchmark_block(result)
    )


def benchmark_at(date: str) -> dict:
    result = json.loads((ROOT / "benchmarks" / "results" / "latest.json").read_text())
    return {**result, "date": date}


@pytest.mark.parametrize(
    ("benchmark", "changed", "flagged"),
    [
        pytest.param("2026-12-02 14:10", "2026-12-04", True, id="older-than-the-code"),
        pytest.param("2026-12-04 09:00", "2026-12-04", False, id="the-same-day"),
        pytest.param("2026-12-06 09:00", "2026-12-04", False, id="newer"),
    ],
)
def test_a_benchmark_older_than_the_request_path_is_flagged_beside_its_figures(
    figures, benchmark, changed, flagged
):
    measured = {"request_path": {"date": changed, "what": "the server changed"}}
    result = benchmark_at(benchmark)
    for block in (
        figures.benchmark_block(result, measured),
        figures.workers_block(result, measured),
    ):
        assert ("Older than the code" in block) is flagged
        assert ("the request path changed on 2026-12-04 (the server changed)" in block) is flagged


def test_the_published_figures_say_they_predate_the_request_path_when_they_do(figures):
    measured = json.loads(figures.MEASURED.read_text())
    result = json.loads(figures.LATEST.read_text())
    older = result["date"][:10] < measured["request_path"]["date"]
    for page in ("figures.md", "operations.md", "benchmarks.md"):
        assert ("Older than the code" in (ROOT / "docs" / page).read_text()) is older, page


def test_the_request_path_date_follows_the_code(figures):
    # The benchmark must not pass for the code's figures once the request path changed after
    # it: the newest commit on those files, by day, is after the benchmark only if
    # measured.json's request_path is too (which flags it).
    done = subprocess.run(
        ["git", "log", "-1", "--format=%cs", "--", *figures.REQUEST_PATH],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if done.returncode != 0 or not done.stdout.strip():
        pytest.skip(f"not a git checkout with history: {done.stderr.strip()}")
    last_change = done.stdout.strip()
    benchmark = json.loads(figures.LATEST.read_text())["date"][:10]
    noted = json.loads(figures.MEASURED.read_text())["request_path"]["date"]
    if last_change > benchmark:
        assert noted > benchmark, (
            f"the request path changed on {last_change}, after the benchmark ({benchmark}): "
            "set request_path in docs/measured.json to that date and what changed, then make "
            "figures (or run make bench)"
        )
    for path in figures.REQUEST_PATH:
        assert (ROOT / path).exists(), path


@pytest.mark.parametrize(
    ("factor", "verdict"),
    [
        pytest.param(0.9, "fewer requests than one process at every load", id="fewer"),
        pytest.param(1.1, "more requests than one process at every load", id="more"),
    ],
)
def test_the_workers_verdict_is_the_figures(figures, factor, verdict):
    result = benchmark_at("2026-12-09 10:00")
    one = result["servers"]["batched"]
    result["servers"]["workers"] = {
        key: {**one[key], "requests_per_s": one[key]["requests_per_s"] * factor} for key in one
    }
    block = figures.workers_block(result, {})
    assert verdict in block
    c64 = one["c64x1"]["requests_per_s"]
    assert f"| c=64, 1 img/req | {c64:,.0f} | {c64 * factor:,.0f} | {factor:.2f} |" in block


def test_a_missing_or_doubled_block_is_an_error(figures):
    with pytest.raises(ValueError, match="0 blocks named figures:x"):
        figures.rendered("no markers here", "x", "content", Path("page.md"))
    twice = "<!-- BEGIN figures:x -->\n<!-- END figures:x -->\n" * 2
    with pytest.raises(ValueError, match="2 blocks named figures:x"):
        figures.rendered(twice, "x", "content", Path("page.md"))


# ---- examples ---------------------------------------------------------------------------------


def shipped_pixels() -> np.ndarray:
    with Image.open(EXAMPLES / "sneaker.png") as image:
        assert image.format == "PNG"
        assert image.size == (28, 28)
        assert image.mode == "L"
        return np.asarray(image, dtype=np.uint8)


def test_the_sample_image_is_a_real_28x28_grayscale_image():
    pixels = shipped_pixels()
    # Not blank: a Fashion-MNIST item, light on a dark border.
    assert pixels.max() > 200 and (pixels > 0).mean() > 0.1
    assert pixels[0].max() == 0 and pixels[-1].max() == 0


def test_the_predict_body_is_the_same_image_as_one_instance_of_floats_in_0_1():
    body = json.loads((EXAMPLES / "predict.json").read_text())
    assert list(body) == ["instances"]
    assert len(body["instances"]) == 1
    image = np.asarray(body["instances"][0], dtype=np.float64)
    assert image.shape == (28, 28)
    assert image.min() >= 0.0 and image.max() <= 1.0
    # Exactly the float32 the service makes of the PNG's pixels (artifact.contract's scaling).
    expected = shipped_pixels().astype(np.float32) / np.float32(255.0)
    np.testing.assert_array_equal(image.astype(np.float32), expected)


def test_the_shipped_examples_are_what_the_script_writes(make_examples, real_data_dir, tmp_path):
    written = make_examples.write_examples(real_data_dir, tmp_path)
    assert [p.name for p in written] == ["sneaker.png", "predict.json"]
    assert (tmp_path / "predict.json").read_text() == (EXAMPLES / "predict.json").read_text()
    with Image.open(tmp_path / "sneaker.png") as image:
        np.testing.assert_array_equal(np.asarray(image), shipped_pixels())


def test_the_script_refuses_an_image_that_is_not_the_sneaker(make_examples, real_data_dir,
                                                             tmp_path, monkeypatch):  # fmt: skip
    monkeypatch.setattr(make_examples, "INDEX", 0)  # test image 0 is an ankle boot
    with pytest.raises(ValueError, match="is not a Sneaker"):
        make_examples.write_examples(real_data_dir, tmp_path)


# ---- make serve-examples ------------------------------------------------------------------------

EXAMPLE_MODELS = ("fashion_mnist", "tabular_classifier", "tabular_regressor")


def test_the_example_model_config_serves_the_three_examples_from_models():
    from artifact.model_config import parse_config

    config = EXAMPLES / "models.config"
    entries = parse_config(config.read_text(), config)
    assert [entry.name for entry in entries] == list(EXAMPLE_MODELS)
    for entry in entries:
        assert entry.base_path.resolve() == ROOT / "models" / entry.name
        assert entry.policy.describe() == "latest 1"


def test_make_serve_examples_trains_what_is_missing_then_serves_the_config():
    makefile = (ROOT / "Makefile").read_text()
    # From nothing, as `make serve` does: the runtimes and the data.
    assert re.search(r"^serve-examples: runtime data$", makefile, re.M)
    assert re.search(r"^\.PHONY:(.*\\\n)*.*\bserve-examples\b", makefile, re.M)
    # Under a make of its own (CI's `make test`), make says which directory it enters: read
    # this make's commands alone, as a user's shell would run them.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "-o", "runtime", "-o", "data", "serve-examples",
         "HOST=127.0.0.1", "PORT=8123"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # Each model's folder gets a first version only while it holds none: Fashion-MNIST the
    # shipped model (models/README.md), the tabular ones trained.
    (shipped,) = [line for line in lines if "cp -R models/shipped/fashion_mnist/1 " in line]
    assert shipped.startswith("if ! ls -d models/fashion_mnist/[0-9]* ")
    for name in EXAMPLE_MODELS[1:]:
        (line,) = [line for line in lines if f"--export-dir models/{name};" in line]
        assert line.startswith(f"if ! ls -d models/{name}/[0-9]* ")
    data = "runs/examples/data"
    assert any(f"-m training sample-data --out {data}" in line for line in lines)
    assert any(f"train --csv {data}/classification.csv --label label" in ln for ln in lines)
    assert any(f"train --csv {data}/regression.csv --label price" in ln for ln in lines)
    assert lines[-1].startswith("MODEL_CONFIG_FILE=examples/models.config MODEL_NAME=fashion_mnist")
    assert "HOST=127.0.0.1 PORT=8123 " in lines[-1] and lines[-1].endswith("-m service")


def test_the_readme_shows_an_example_served_in_one_command():
    text = README.read_text()
    first_screen = "\n".join(text.splitlines()[:70])
    assert "make serve-examples" in first_screen
    assert "/v1/models/tabular_classifier:predict" in first_screen
    assert '"signature_name": "predict"' in first_screen


# ---- accuracies quoted in prose ----------------------------------------------------------------

SHIPPED_EVALUATION = ROOT / "models" / "shipped" / "fashion_mnist" / "1" / "assets.extra"


def test_the_shipped_model_s_accuracy_is_quoted_as_its_evaluation_says():
    accuracy = json.loads((SHIPPED_EVALUATION / "evaluation.json").read_text())["accuracy"]
    quoted = []
    for name in ("README.md", "docs/training.md", "models/README.md"):
        for value in re.findall(r"test accuracy \**(0\.\d+)", (ROOT / name).read_text()):
            quoted.append(value)
            digits = len(value) - 2
            assert float(value) == round(accuracy, digits), f"{name}: {value}, not {accuracy}"
    assert len(quoted) >= 3


def test_make_train_s_accuracy_is_quoted_as_measured(figures):
    measured = json.loads(figures.MEASURED.read_text())
    runs = [float(v) for v in re.findall(r"0\.\d+", measured["training"]["rows"][0]["accuracy"])]
    assert measured["training"]["rows"][0]["command"].startswith("`make train`") and runs
    quoted = []
    for name in ("README.md", "models/README.md"):
        text = re.sub(r"\s+", " ", (ROOT / name).read_text())
        for value in re.findall(r"`make train`[^.;]*?about (0\.\d+)", text):
            quoted.append(value)
            digits = len(value) - 2
            assert all(round(run, digits) == float(value) for run in runs), (name, value, runs)
    assert len(quoted) >= 2
