"""benchmarks/peers/versus.py, the head to head, without serving anything: the rounds' orders,
how the service's answer is read, the medians and ratios, and the table."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from benchmarks.peers import __main__ as peers_main
from benchmarks.peers import versus


def test_every_round_has_each_contender_once_and_the_order_moves():
    orders = versus.round_orders(["a", "b", "c"], 4)
    # Rotated by one a round, every other round reversed.
    assert orders == [["a", "b", "c"], ["a", "c", "b"], ["c", "a", "b"], ["c", "b", "a"]]
    assert all(sorted(order) == ["a", "b", "c"] for order in orders)
    # No contender holds the same place in every round.
    for key in "abc":
        assert len({order.index(key) for order in orders}) > 1


def test_the_services_probabilities_are_read_from_its_rows():
    answer = {"predictions": [{"classes": 1, "probabilities": [0.25, 0.75]}]}
    np.testing.assert_array_equal(versus.service_probabilities(answer, 2), [[0.25, 0.75]])


@pytest.mark.parametrize("answer, error", [
    ({"outputs": [0.5, 0.5]}, "'predictions'"),
    ({"predictions": [[0.5, 0.5]]}, "'predictions'"),
    ({"predictions": [{"probabilities": [0.2, 0.3, 0.5]}]}, r"got shape \[1, 3\]"),
    ({"predictions": [{"classes": 1}]}, "expected probabilities"),
])  # fmt: skip
def test_an_answer_without_the_probabilities_is_refused(answer, error):
    with pytest.raises(ValueError, match=error):
        versus.service_probabilities(answer, 2)


def row(rate: float, p99: float, cpu: float = 500.0, steal: float = 0.0) -> dict:
    return {"requests_per_s": rate, "p50_ms": p99 / 2, "p99_ms": p99,
            "cpu_us_per_request": cpu, "steal": steal, "others_cpu_s": {}}  # fmt: skip


def test_the_medians_of_the_rounds_give_the_ratios():
    readings = {
        versus.SERVICE: [row(3000, 40), row(1500, 80), row(2000, 50)],
        # The peer's medians fall in other rounds than the service's.
        "peer": [row(700, 200, steal=0.02), row(1000, 400), row(400, 100)],
    }
    medians = versus.summarize(readings)
    assert medians[versus.SERVICE]["requests_per_s"] == 2000
    assert "service_throughput_x" not in medians[versus.SERVICE]
    peer = medians["peer"]
    assert peer["requests_per_s"] == 700 and peer["p99_ms"] == 200
    # The ratio of the medians (2000 / 700), not the median of the rounds' ratios (4.29, 1.5
    # and 5: 4.29), nor one round's; the p99 share likewise (50 / 200, not 0.2).
    assert peer["service_throughput_x"] == pytest.approx(2000 / 700)
    assert peer["service_p99_share"] == pytest.approx(50 / 200)
    assert peer["steal_max"] == 0.02 and peer["rounds"] == 3


def test_the_table_gives_each_contender_its_medians_and_the_idle_ones_cpu():
    readings = {versus.SERVICE: [row(2000, 50)], "peer": [row(500, 200)]}
    readings[versus.SERVICE][0]["others_cpu_s"] = {"peer": 0.04}
    readings["peer"][0]["others_cpu_s"] = {versus.SERVICE: 0.125}
    result = {"model": "fashion_mnist", "rounds": 1, "seconds": 8, "date": "d", "commit": "c",
              "titles": {versus.SERVICE: versus.SERVICE, "peer": "A peer"},
              "readings": readings, "medians": versus.summarize(readings)}  # fmt: skip
    text = versus.table(result)
    assert "| this service | 2,000 | 25.0 | 50.0 | 500 | - | 0% |" in text
    assert "| A peer | 500 | 100.0 | 200.0 | 500 | 4.00x, 0.25 | 0% |" in text
    assert "A peer: 0.04 s" in text and "this service: 0.12 s" in text


def test_each_saved_run_is_kept_under_its_model_and_time(tmp_path):
    first = versus.save({"model": "tabular_classifier", "date": "2026-12-06 06:38 UTC"}, tmp_path)
    second = versus.save({"model": "tabular_classifier", "date": "2026-12-06 07:38 UTC"}, tmp_path)
    assert first.name == "versus-tabular_classifier-20261206-0638.json"
    assert second != first and first.exists()


def test_two_checkouts_at_one_commit_are_two_contenders(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    keys = versus.service_keys((tmp_path / "a", tmp_path / "b"))
    assert list(keys)[0] == versus.SERVICE and len(keys) == 3
    assert list(keys.values()) == [None, tmp_path / "a", tmp_path / "b"]


def sleeper(tmp_path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_contender_that_answers_wrongly_is_stopped_with_the_others(tmp_path, monkeypatch):
    started = []

    def start(version, workdir, path, body, key, checkout=None):
        process = sleeper(tmp_path)
        started.append(process)
        return versus.Contender(key, key, 1, path, body, process)

    def wrong(*args):
        raise RuntimeError("probabilities differ from the model's")

    import artifact.quiet

    monkeypatch.setattr(artifact.quiet, "quiet_tensorflow", lambda: None)  # no TensorFlow here
    monkeypatch.setattr(versus.run, "prepare", lambda variants, log: {})
    monkeypatch.setattr(versus.generic, "served_model", lambda model, workdir: versus.generic.Served(
        tmp_path / "m" / "fashion_mnist" / "1", tmp_path / "body.json", "/p"))  # fmt: skip
    monkeypatch.setattr(versus.spec, "instances_of", lambda text, model: [])
    (tmp_path / "body.json").write_text("{}")
    monkeypatch.setattr(versus.run, "reference_probabilities", lambda *a: np.zeros((1, 10)))
    monkeypatch.setattr(versus, "start_service", start)
    monkeypatch.setattr(versus, "check_service", wrong)
    with pytest.raises(RuntimeError, match="differ"):
        versus.head_to_head("fashion_mnist", 1, 1, checkouts=(tmp_path,), log=lambda *a, **k: None)
    # The first service was started, failed its check, and was stopped all the same.
    assert len(started) == 1 and started[0].poll() is not None


@pytest.mark.parametrize("argv", [["versus", "--rounds", "0"], ["versus", "--seconds", "0"]])
def test_the_command_line_refuses_no_rounds_or_no_time(argv, capsys):
    with pytest.raises(SystemExit):
        peers_main.main(argv)
    assert "at least 1" in capsys.readouterr().err


def test_another_checkout_must_be_one_of_this_project(tmp_path, capsys):
    with pytest.raises(SystemExit):
        peers_main.main(["versus", "--checkout", str(tmp_path)])
    assert "not a checkout of this project" in capsys.readouterr().err
