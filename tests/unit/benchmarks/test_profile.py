"""benchmarks/profile.py without py-spy or a service: py-spy's stacks read, the time per request
by thread, component, frame and function, the summary in words and the Benchmarks page's
block, and the command line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess

import pytest

from benchmarks import profile

LOOP = (
    "thread (100): MainThread;_run_module_as_main (<frozen runpy>:198);main (service/__main__.py:9)"
    ";BaseEventLoop.run_forever (asyncio/base_events.py:607)"
)
STACKS = "\n".join(
    [
        f"{LOOP};Ingress._http (service/ingress.py:170);read_body (service/ingress.py:300) 30",
        f"{LOOP};Ingress._http (service/ingress.py:170);_answer (service/ingress.py:280) 10",
        f"{LOOP};EpollSelector.select (selectors.py:468) 20",
        "thread (101): batcher;run (/tmp/before/service/backends/batching.py:80);"
        "quick_execute (/venv/lib/python3.11/site-packages/tensorflow/python/eager/execute.py:53)"
        " 35",
        "thread (102) 5",
        "",
    ]
)


def test_pyspy_stacks_are_read_per_thread():
    stacks = profile.parse_collapsed(STACKS)
    assert len(stacks) == 5
    tid, name, frames, count = stacks[0]
    assert (tid, name, count) == ("100", "MainThread", 30)
    assert frames[0] == "_run_module_as_main (<frozen runpy>:198)"
    assert frames[-1] == "read_body (service/ingress.py:300)"
    assert stacks[-1] == ("102", "", [], 5)


@pytest.mark.parametrize(
    "frame, expected",
    [
        ("read_body (service/ingress.py:300)", "service/ingress.py"),
        ("run (/tmp/before/service/backends/batching.py:80)", "service/backends/batching.py"),
        ("quick_execute (/v/lib/python3.11/site-packages/tensorflow/python/x.py:5)", "tensorflow"),
        ("EpollSelector.select (selectors.py:468)", "selectors"),
        ("BaseEventLoop._run_once (asyncio/base_events.py:1884)", "asyncio"),
        ("_run_code (<frozen runpy>:88)", "runpy"),
        ("(native)", "(native)"),
    ],
)
def test_a_frame_is_named_by_the_projects_module_or_its_package(frame, expected):
    assert profile.component(frame) == expected


def test_the_time_per_request_by_thread_component_frame_and_function():
    # 100 samples at 100 Hz over 1,000 requests: each sample is 10 µs of a request.
    summary = profile.summarize(
        profile.parse_collapsed(STACKS), 100.0, 1000, {"100": 0.4, "101": 0.2, "103": 0.05}
    )
    assert summary["samples"] == 100 and summary["sampled_us_per_request"] == pytest.approx(1000)
    threads = {row["tid"]: row for row in summary["threads"]}
    assert threads["100"]["cpu_us_per_request"] == pytest.approx(400)
    assert threads["100"]["sampled_us_per_request"] == pytest.approx(600)
    assert (
        threads["102"]["name"] == "(no Python name)"
        and threads["102"]["cpu_us_per_request"] is None
    )
    # A thread py-spy never saw running still has its CPU.
    assert threads["103"]["cpu_us_per_request"] == pytest.approx(50)
    assert [row["tid"] for row in summary["threads"]][:2] == ["100", "101"]
    components = {row["name"]: row["us_per_request"] for row in summary["components"]}
    assert components == pytest.approx(
        {"service/ingress.py": 400, "tensorflow": 350, "selectors": 200, "(native)": 50}
    )
    (leaf,) = [row for row in summary["self"] if row["name"].startswith("quick_execute ")]
    assert leaf["name"].endswith("tensorflow/python/eager/execute.py)")
    assert leaf["share"] == pytest.approx(0.35) and summary["self"][0] == leaf
    assert summary["self"][0]["share"] == pytest.approx(0.35)
    totals = {row["name"]: row["us_per_request"] for row in summary["total"]}
    assert totals["Ingress._http (service/ingress.py)"] == pytest.approx(400)
    # Under which its threads spend all their time: left out of the ranking.
    assert "main (service/__main__.py)" not in totals
    assert "run (/tmp/before/service/backends/batching.py)" not in totals


def profile_of(label: str, date: str, requests_per_s: float, ingress_us: float) -> dict:
    summary = profile.summarize(profile.parse_collapsed(STACKS), 100.0, 1000, {"100": 0.4})
    for row in summary["components"]:
        if row["name"] == "service/ingress.py":
            row["us_per_request"] = ingress_us
    return {
        "label": label,
        "model": "tabular",
        "run": {
            "concurrency": 64,
            "seconds": 10,
            "rate": 100.0,
            "requests": 1000,
            "requests_per_s": requests_per_s,
            "cpu_us_per_request": 1234.5,
            "checkout": "/tmp/x",
            "commit": "abc1234",
            "date": date,
            "cores": 2,
            "loadavg_at_start": 0.2,
            "loadavg_before": 0.4,
            "loadavg_after": 1.3,
            "py_spy": "0.4.3",
            "native": False,
        },  # fmt: skip
        "summary": summary,
    }


def test_the_summary_in_words():
    text = profile.summary_text(profile_of("after", "2026-12-05 10:00", 1800.0, 400.0))
    assert (
        "Profile of one :predict (tabular, one instance a request, wrk c=64), label 'after'" in text
    )
    assert "1,000 requests, 1,800/s; the server's CPU (all its threads, /proc): 1,234 µs" in text
    assert "0.2 before the service started, 0.4 when the profile began and 1.3 at its end" in text
    assert "     400       600  thread 100 MainThread" in text
    assert "   350.0   35.0%  tensorflow" in text


def test_the_benchmarks_page_shows_each_label_side_by_side(tmp_path):
    assert "No profile is recorded yet" in profile.profiles_block(tmp_path / "none")
    for label, date, rps, ingress in (("before", "2026-12-05 09:00", 1500.0, 500.0),
                                      ("after", "2026-12-05 10:00", 1800.0, 400.0)):  # fmt: skip
        stem = f"{label}-tabular-c64"
        (tmp_path / f"{stem}.json").write_text(json.dumps(profile_of(label, date, rps, ingress)))
    block = profile.profiles_block(tmp_path)
    assert "**tabular, c=64**" in block
    # The older run first, whatever the files' names.
    assert "| | before (abc1234, 2026-12-05 09:00) | after (abc1234, 2026-12-05 10:00) |" in block
    assert "| requests/s | 1,500 | 1,800 |" in block
    assert "| load average before the run (cores) | 0.2 (2) | 0.2 (2) |" in block
    assert "| … of which `service/ingress.py` | 500 | 400 |" in block
    assert "`benchmarks/results/profiles/before-tabular-c64.txt`" in block


def test_the_figures_render_the_profiles_on_the_benchmarks_page():
    from support.helpers import REPO_ROOT

    text = (REPO_ROOT / "docs" / "benchmarks.md").read_text()
    assert "<!-- BEGIN figures:profiles -->" in text
    spec = importlib.util.spec_from_file_location("docs_figures", REPO_ROOT / "docs" / "figures.py")
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    assert figures.blocks()[figures.BENCHMARKS_PAGE]["profiles"] == profile.profiles_block()


def test_the_command_line(tmp_path):
    args = profile.parse_arguments(["--concurrency", "1,64", "--label", "before"])
    assert args.concurrency == [1, 64] and args.model == list(profile.MODELS)
    assert args.checkout == profile.ROOT and args.out == profile.PROFILES
    assert profile.parse_arguments(["--model", "tabular"]).model == ["tabular"]
    for argv in (["--concurrency", "x"], ["--label", "a b"], ["--checkout", str(tmp_path)]):
        with pytest.raises(SystemExit):
            profile.parse_arguments(argv)


def test_a_checkout_with_changes_says_so(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True,
                       env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})  # fmt: skip

    git("init", "-q")
    (tmp_path / "a.py").write_text("1\n")
    git("add", "a.py")
    git("commit", "-qm", "one")
    clean = profile.commit_of(tmp_path)
    assert len(clean) >= 7 and "+" not in clean
    (tmp_path / "a.py").write_text("2\n")
    assert profile.commit_of(tmp_path) == clean + "+changes"
