"""tools/test_sides.py's flake hunt (`--repeat N`, `make test-repeat`): the failed tests read
from pytest's JUnit XML, and the table of every test that failed in any run."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# tools/test_sides.py is a script, not a package: loaded from its file.
_spec = importlib.util.spec_from_file_location("test_sides_tool", ROOT / "tools" / "test_sides.py")
sides_tool = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = sides_tool  # its dataclasses look their module up
_spec.loader.exec_module(sides_tool)
SideRun = sides_tool.SideRun

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="2" skipped="1" tests="6">
<testcase classname="tests.live.training.test_a" name="test_passes" time="1.0"/>
<testcase classname="tests.live.training.test_a" name="test_fails[x]" time="2.0">
  <failure message="assert 0.583 &gt; 0.667">...</failure></testcase>
<testcase classname="tests.live.training.test_b" name="test_skipped" time="0.0">
  <skipped message="no podman"/></testcase>
<testcase classname="tests.live.training.test_b" name="test_fixture_broke" time="0.1">
  <error message="failed on setup">...</error></testcase>
<testcase classname="tests.live.training.test_b" name="test_fixture_broke" time="0.1">
  <error message="failed on teardown">...</error></testcase>
<testcase classname="tests.live.training.test_b.TestGroup" name="test_also_fails" time="3">
  <failure message="boom">...</failure></testcase>
</testsuite></testsuites>
"""


def test_the_failed_and_errored_tests_are_read_from_junit_xml_each_once():
    assert sides_tool.failed_tests(JUNIT) == (
        "tests.live.training.test_a::test_fails[x]",
        "tests.live.training.test_b::test_fixture_broke",
        "tests.live.training.test_b.TestGroup::test_also_fails",
    )


def test_a_green_report_names_every_runs_time():
    results = [
        SideRun("training", 1, 0, 612.4, ()),
        SideRun("service", 1, 0, 401.0, ()),
        SideRun("training", 2, 0, 598.0, ()),
        SideRun("service", 2, 0, 420.6, ()),
    ]
    text, green = sides_tool.repeat_report(results, 2)
    assert green
    assert text.splitlines() == [
        "Repeated 2 time(s):",
        "  training: run 1 612 s (exit 0), run 2 598 s (exit 0)",
        "  service: run 1 401 s (exit 0), run 2 421 s (exit 0)",
        "No test failed in any of the 2 run(s).",
    ]


def test_every_test_that_failed_in_any_run_is_listed_with_its_count_and_runs_most_first():
    flaky = "tests.live.training.test_retrain_any::test_an_image_folder_model_is_blessed"
    once = "tests.live.service.test_x::test_y"
    results = [
        SideRun("training", 1, 1, 600.0, (flaky,)),
        SideRun("service", 1, 1, 400.0, (once,)),
        SideRun("training", 2, 0, 610.0, ()),
        SideRun("service", 2, 0, 410.0, ()),
        SideRun("training", 3, 1, 620.0, (flaky,)),
        SideRun("service", 3, 0, 405.0, ()),
    ]
    text, green = sides_tool.repeat_report(results, 3)
    assert not green
    table = text.splitlines()[3:]
    assert table[0].split() == ["failed", "test", "failed", "in", "runs"]
    assert table[1].split() == [f"training: {flaky}".split()[0], flaky, "2", "of", "3", "1,", "3"]
    assert table[2].split() == ["service:", once, "1", "of", "3", "1"]
    assert len(table) == 3


def test_a_session_that_exits_non_zero_without_a_failed_test_is_reported_not_hidden():
    results = [
        SideRun("training", 1, 0, 600.0, ()),
        SideRun("training", 2, 2, 30.0, ()),  # interrupted, or a collection error
    ]
    text, green = sides_tool.repeat_report(results, 2)
    assert not green
    assert text.splitlines()[-1] == (
        "training: run 2 exited 2 with no failed test recorded (its tests did not all run: "
        "see its output above)"
    )
    assert len(text.splitlines()) == 3  # the times, and no table of tests: none was recorded


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(["--repeat", "0"], "--repeat: must be 1 or more, got 0", id="no-run"),
        pytest.param(["--cpu-hog", "1"], "--cpu-hog: 0 or more, and only with --repeat", id="hog"),
    ],
)
def test_bad_options_are_refused_before_anything_runs(argv, message):
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "test_sides.py"), *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert message in done.stderr
