"""benchmarks/peers/versus.py, the head to head, without serving anything: the rounds' orders,
how the service's answer is read, the medians and ratios, and the table."""

from __future__ import annotations

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
        "peer": [row(500, 400, steal=0.02), row(1000, 100), row(600, 200)],
    }
    medians = versus.summarize(readings)
    assert medians[versus.SERVICE]["requests_per_s"] == 2000
    assert "service_throughput_x" not in medians[versus.SERVICE]
    peer = medians["peer"]
    assert peer["requests_per_s"] == 600 and peer["p99_ms"] == 200
    # The medians' ratio, not a ratio of one round's readings.
    assert peer["service_throughput_x"] == pytest.approx(2000 / 600)
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


def test_a_saved_run_is_named_by_its_model(tmp_path):
    path = versus.save({"model": "tabular_classifier", "medians": {}}, tmp_path)
    assert path.name == "versus-tabular_classifier.json"


@pytest.mark.parametrize("argv", [["versus", "--rounds", "0"], ["versus", "--seconds", "0"]])
def test_the_command_line_refuses_no_rounds_or_no_time(argv, capsys):
    with pytest.raises(SystemExit):
        peers_main.main(argv)
    assert "at least 1" in capsys.readouterr().err


def test_another_checkout_must_be_one_of_this_project(tmp_path, capsys):
    with pytest.raises(SystemExit):
        peers_main.main(["versus", "--checkout", str(tmp_path)])
    assert "not a checkout of this project" in capsys.readouterr().err
