"""CSV schema inference (training/tabular_schema.py): pure Python, no TensorFlow."""

from __future__ import annotations

import pytest

from training.errors import DataError, UsageError
from training.tabular_schema import HOLDOUT_EVERY, infer_schema, is_holdout


def write(tmp_path, text: str):
    path = tmp_path / "t.csv"
    path.write_text(text, encoding="utf-8")
    return path


def table(header: str, rows: list[str]) -> str:
    return "\n".join([header, *rows]) + "\n"


def test_column_kinds_statistics_and_vocabulary_come_from_the_training_rows(tmp_path):
    # 10 rows: rows 4 and 9 (0-based) are held out; their values must not count.
    rows = [f"{i}.5,{i},{'ab'[i % 2]},{'xyz'[i % 3]}" for i in range(10)]
    rows[4] = "1000.5,1000,held,x"
    rows[9] = "-1000.5,-1000,out,y"
    schema = infer_schema(write(tmp_path, table("f,n,s,label", rows)), "label")
    f, n, s = schema.columns
    assert (f.name, f.kind, n.name, n.kind, s.name, s.kind) == (
        "f", "float", "n", "int", "s", "string",
    )  # fmt: skip
    train_ints = [0, 1, 2, 3, 5, 6, 7, 8]
    mean = sum(train_ints) / 8
    std = (sum((v - mean) ** 2 for v in train_ints) / 8) ** 0.5
    assert n.mean == pytest.approx(mean) and n.std == pytest.approx(std, abs=1e-6)
    assert f.mean == pytest.approx(mean + 0.5)
    assert s.vocabulary == ("a", "b") and s.hash_buckets is None
    assert (schema.train_rows, schema.holdout_rows) == (8, 2)
    assert schema.task == "classification" and schema.label_kind == "string"
    assert schema.classes == ("x", "y", "z")
    assert schema.kinds() == ["float", "int", "string", "string"]


def test_holdout_rule():
    assert [i for i in range(12) if is_holdout(i)] == [HOLDOUT_EVERY - 1, 2 * HOLDOUT_EVERY - 1]


def test_many_strings_are_hashed(tmp_path):
    rows = [f"{i},w{i},{i % 2}" for i in range(20)]
    schema = infer_schema(write(tmp_path, table("x,word,label", rows)), "label", max_vocabulary=5)
    word = schema.columns[1]
    assert word.vocabulary is None and word.hash_buckets == 2 * 16


def test_a_constant_column_divides_by_one(tmp_path):
    schema = infer_schema(
        write(tmp_path, table("c,label", [f"3,{i % 2}" for i in range(5)])), "label"
    )
    assert (schema.columns[0].mean, schema.columns[0].std) == (3.0, 1.0)


@pytest.mark.parametrize(
    "labels, task, kind, expected_task, classes",
    [
        pytest.param(
            ["low", "high", "mid"],
            None,
            "string",
            "classification",
            ("high", "low", "mid"),
            id="strings",
        ),
        pytest.param(
            ["0", "2", "1"], None, "int", "classification", ("0", "1", "2"), id="small_ints"
        ),
        pytest.param(["1.5", "2", "3.25"], None, "float", "regression", (), id="floats"),
        pytest.param(["100", "250", "999"], None, "float", "regression", (), id="large_ints"),
        pytest.param(["-1", "5", "3"], None, "float", "regression", (), id="negative_ints"),
        pytest.param(
            ["0", "2", "1"], "regression", "float", "regression", (), id="forced_regression"
        ),
        pytest.param(
            ["10", "-2", "3"],
            "classification",
            "string",
            "classification",
            ("-2", "3", "10"),
            id="forced_classes_by_number",
        ),
    ],
)
def test_task_from_the_label_column(tmp_path, labels, task, kind, expected_task, classes):
    rows = [f"{i},{labels[i % 3]}" for i in range(10)]
    schema = infer_schema(write(tmp_path, table("x,y", rows)), "y", task)
    assert (schema.label_kind, schema.task, schema.classes) == (kind, expected_task, classes)


@pytest.mark.parametrize(
    "labels, task, message",
    [
        pytest.param(
            ["a", "b", "c"],
            "regression",
            "--task regression: label column 'y' holds 'a'",
            id="regression_of_strings",
        ),
        pytest.param(
            ["0.5", "1", "2"], "classification", "holds non-integer numbers", id="classes_of_floats"
        ),
    ],
)
def test_a_forced_task_that_does_not_fit(tmp_path, labels, task, message):
    rows = [f"{i},{labels[i % 3]}" for i in range(10)]
    with pytest.raises(UsageError, match=message):
        infer_schema(write(tmp_path, table("x,y", rows)), "y", task)


ROWS = [f"{i},{'ab'[i % 2]},{i % 2}" for i in range(10)]


@pytest.mark.parametrize(
    "text, label, message",
    [
        pytest.param("", "label", "empty file", id="empty"),
        pytest.param("x,s,label\n", "label", "no data rows after the header", id="header_only"),
        pytest.param(
            table("x,s,label", ROWS),
            "target",
            "no label column 'target' (columns: x, s, label)",
            id="missing_label",
        ),
        pytest.param(
            table("x,s,label", [*ROWS[:3], "1,a", *ROWS[3:]]),
            "label",
            "line 5 has 2 fields, the header has 3",
            id="ragged_short",
        ),
        pytest.param(
            table("x,s,label", [*ROWS, "1,a,0,9"]),
            "label",
            "line 12 has 4 fields",
            id="ragged_long",
        ),
        pytest.param(
            table("x,s,label", [*ROWS[:6], "1e3x,a,0", *ROWS[6:]]),
            "label",
            "line 8, column 'x': '1e3x' is not a number",
            id="non_numeric",
        ),
        pytest.param(
            table("x,s,label", [*ROWS[:6], "nan,a,0", *ROWS[6:]]),
            "label",
            "'nan' is not a number",
            id="nan",
        ),
        pytest.param(
            table("x,s,label", [*ROWS[:6], "1_000,a,0", *ROWS[6:]]),
            "label",
            "'1_000' is not a number",
            id="underscore",
        ),
        pytest.param(
            table("x,x,label", ROWS), "label", "names a column twice: x", id="duplicate_column"
        ),
        pytest.param(
            table("x,s,label", ROWS[:4]), "label", "4 data rows; at least 5", id="too_few_rows"
        ),
        pytest.param(
            table("x,s,label", [r[:-1] + "1" for r in ROWS]),
            "label",
            "only one class: '1'",
            id="one_class",
        ),
        pytest.param(
            table("x,s,label", [*ROWS[:2], "1,a,", *ROWS[2:]]),
            "label",
            "line 4, label column 'label': empty label",
            id="empty_label",
        ),
        pytest.param(
            table("label", ["1", "2", "3", "4", "5"]),
            "label",
            "no feature to learn from",
            id="label_only",
        ),
    ],
)
def test_bad_csv_names_the_file_and_the_problem(tmp_path, text, label, message):
    path = write(tmp_path, text)
    with pytest.raises(DataError) as raised:
        infer_schema(path, label)
    assert str(raised.value).startswith(f"{path}: ")
    assert message in str(raised.value)


def test_a_byte_order_mark_is_not_part_of_the_first_name(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes(
        b"\xef\xbb\xbf" + table("label,x", [f"{i % 2},{i}" for i in range(5)]).encode()
    )
    assert infer_schema(path, "label").header == ("label", "x")


def test_quoted_fields_may_hold_commas_and_lines_and_messages_count_lines(tmp_path):
    # TensorFlow's CsvDataset, which reads the file for training, reads these too.
    rows = [*ROWS[:2], '1,"two\nlines, one field",0', *ROWS[2:]]
    schema = infer_schema(write(tmp_path, table("x,s,label", rows)), "label")
    assert "two\nlines, one field" in schema.columns[1].vocabulary
    rows[5] = "oops,a,0"  # on line 8: the quoted field took lines 4 and 5
    with pytest.raises(DataError, match="line 8, column 'x': 'oops' is not a number"):
        infer_schema(write(tmp_path, table("x,s,label", rows)), "label")


def test_a_missing_file(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        infer_schema(tmp_path / "none.csv", "label")


def test_the_schema_records_what_a_resumed_run_must_match(tmp_path):
    schema = infer_schema(write(tmp_path, table("x,s,label", ROWS)), "label")
    recorded = schema.to_json()
    assert recorded["label"] == "label" and recorded["task"] == "classification"
    assert [c["name"] for c in recorded["columns"]] == ["x", "s"]
    assert recorded["columns"][1]["vocabulary"] == ("a", "b")
