"""A CSV file with a header and a label column: validated and described, without TensorFlow.

The file is read once here with Python's csv module, checked (a header, the label column,
rows as long as the header, numbers where a column is numeric) and described as a `Schema`:
each feature column's kind (float, int or string), the training split's mean and standard
deviation of each numeric column (the `normalizer_fn`'s constants), each string column's
vocabulary (or a hash bucket count past `max_vocabulary`), and the task the label column
implies. TensorFlow then reads the same file inside the graph (training/tabular.py), so the
data set never becomes a graph constant.

Rows are split by position: every HOLDOUT_EVERY-th data row (the 5th, 10th, ...) is held out
for evaluation, the rest train; statistics and vocabularies come from the training rows only.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import re
from pathlib import Path

from training.errors import DataError, UsageError

TASKS = ("classification", "regression")
HOLDOUT_EVERY = 5
# Integer labels 0..K-1 with K up to this are classes; more (or negative ones) are a quantity.
MAX_INTEGER_CLASSES = 20
# A string column with more distinct training values than this is hashed, not enumerated.
DEFAULT_MAX_VOCABULARY = 100
# What TensorFlow's CSV reader parses as a number: no spaces, no '1_000', no nan/inf.
_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


@dataclasses.dataclass(frozen=True)
class Column:
    """One feature column of the CSV.

    kind: 'float' or 'int' (numeric_column, normalized with mean and std) or 'string'
    (categorical: `vocabulary` when it has at most max_vocabulary values, else
    `hash_buckets` buckets).
    """

    name: str
    kind: str
    mean: float | None = None
    std: float | None = None
    vocabulary: tuple[str, ...] | None = None
    hash_buckets: int | None = None

    @property
    def numeric(self) -> bool:
        return self.kind in ("float", "int")


@dataclasses.dataclass(frozen=True)
class Schema:
    """A validated CSV: its feature columns (in file order), label column and task.

    label_kind is the dtype the label is read as: 'string' (classification with
    label_vocabulary), 'int' (classification with class ids 0..n_classes-1) or 'float'
    (regression). classes names the classes in class-id order (labels.txt).
    """

    path: str
    header: tuple[str, ...]
    label: str
    label_kind: str
    task: str
    columns: tuple[Column, ...]
    classes: tuple[str, ...]
    train_rows: int
    holdout_rows: int

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    def kinds(self) -> list[str]:
        """The dtype kind of every CSV column in file order, the label's included."""
        by_name = {c.name: c.kind for c in self.columns}
        return [self.label_kind if name == self.label else by_name[name] for name in self.header]

    def to_json(self) -> dict:
        """What params.json records (and a resumed run must match)."""
        return {
            "csv": self.path,
            "label": self.label,
            "label_kind": self.label_kind,
            "task": self.task,
            "classes": list(self.classes),
            "columns": [dataclasses.asdict(c) for c in self.columns],
        }


def is_holdout(index: int) -> bool:
    """Whether data row `index` (0-based, header excluded) is held out for evaluation."""
    return index % HOLDOUT_EVERY == HOLDOUT_EVERY - 1


def is_number(text: str) -> bool:
    """Whether TensorFlow's CSV reader reads the text as a number (no spaces, no nan/inf)."""
    return bool(_FLOAT.fullmatch(text))


def is_integer(text: str) -> bool:
    """Whether the text is an integer as the CSV reader reads an int64 column."""
    return bool(_INT.fullmatch(text))


def _records(f) -> tuple[list[list[str]], list[int]]:
    """The records of a CSV stream and the line each starts on (a quoted field may span
    lines; TensorFlow's CsvDataset reads those too)."""
    reader = csv.reader(f)
    records, lines, end = [], [], 0
    for record in reader:
        records.append(record)
        lines.append(end + 1)
        end = reader.line_num
    return records, lines


def read_rows(path: str | Path, with_lines: bool = False):
    """The header and the data rows of a CSV file; DataError when it is not a usable table.

    with_lines: also return the line number each data row starts on, for messages.
    """
    path = Path(path)
    try:
        # utf-8-sig: a byte order mark must not become part of the first column's name.
        with path.open(newline="", encoding="utf-8-sig") as f:
            rows, lines = _records(f)
    except FileNotFoundError as err:
        raise DataError(f"{path}: file not found") from err
    except OSError as err:
        raise DataError(f"{path}: cannot read: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text (byte {err.start})") from err
    except csv.Error as err:
        raise DataError(f"{path}: not valid CSV: {err}") from err
    if not rows:
        raise DataError(f"{path}: empty file (no header)")
    header = [name.strip() for name in rows[0]]
    if not all(header):
        raise DataError(f"{path}: header has an empty column name: {rows[0]}")
    duplicates = sorted({n for n in header if header.count(n) > 1})
    if duplicates:
        raise DataError(f"{path}: header names a column twice: {', '.join(duplicates)}")
    data, lines = rows[1:], lines[1:]
    for number, row in zip(lines, data, strict=True):
        if len(row) != len(header):
            raise DataError(
                f"{path}: line {number} has {len(row)} fields, the header has {len(header)}"
            )
    if not data:
        raise DataError(f"{path}: no data rows after the header")
    return (header, data, lines) if with_lines else (header, data)


def _numeric_kind(path, name, values: list[str], lines: list[int]) -> str | None:
    """'int' or 'float' when the column is numeric, None when it is a string column.

    Numeric when most values are numbers; then every value must be one (a stray word in a
    numeric column is a mistake in the data, not a category).
    """
    numbers = sum(map(is_number, values))
    if numbers * 2 <= len(values):
        return None
    for line, value in zip(lines, values, strict=True):
        if not is_number(value):
            shown = repr(value) if value else "an empty value"
            raise DataError(
                f"{path}: line {line}, column {name!r}: {shown} is not a number "
                "(the column is numeric)"
            )
    return "int" if all(map(is_integer, values)) else "float"


def _mean_std(values: list[float]) -> tuple[float, float]:
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
    # A constant column: divide by 1, not 0.
    return round(mean, 6), round(std, 6) if std > 1e-12 else 1.0


def _label_task(path, name, values: list[str], lines: list[int], task: str | None):
    """(label kind, task, classes) of the label column."""
    if not all(values):
        line = lines[values.index("")]
        raise DataError(f"{path}: line {line}, label column {name!r}: empty label")
    numeric = all(map(is_number, values))
    integers = numeric and all(map(is_integer, values))
    if task is None:
        if not numeric:
            task = "classification"
        elif integers:
            ids = {int(v) for v in values}
            small = min(ids) >= 0 and max(ids) < MAX_INTEGER_CLASSES
            task = "classification" if small else "regression"
        else:
            task = "regression"
    if task == "regression":
        if not numeric:
            bad = next(v for v in values if not is_number(v))
            raise UsageError(
                f"--task regression: label column {name!r} holds {bad!r}, not a number"
            )
        return "float", task, ()
    if integers:
        ids = {int(v) for v in values}
        if min(ids) >= 0 and max(ids) < MAX_INTEGER_CLASSES:
            return "int", task, tuple(str(k) for k in range(max(ids) + 1))
        # Other integers are names of classes, ordered as numbers.
        return "string", task, tuple(str(k) for k in sorted(ids))
    if numeric:
        raise UsageError(
            f"--task classification: label column {name!r} holds non-integer numbers; "
            "classes must be strings or integers"
        )
    return "string", task, tuple(sorted(set(values)))


def infer_schema(
    path: str | Path,
    label: str,
    task: str | None = None,
    max_vocabulary: int = DEFAULT_MAX_VOCABULARY,
    hash_buckets: int | None = None,
) -> Schema:
    """Read and validate a CSV file and describe it.

    Args:
        path: the CSV file (UTF-8, a header line, comma-separated).
        label: the label column's name.
        task: 'classification' or 'regression'; None infers it from the label column
            (strings or integers 0..MAX_INTEGER_CLASSES-1: classification; other numbers:
            regression).
        max_vocabulary: string columns with more distinct training values are hashed.
        hash_buckets: buckets of a hashed column (default: twice its distinct values).
    Raises:
        DataError: missing or unreadable file, no header, no data, a ragged row, a missing
            label column, a non-number in a numeric column, too few training rows.
        UsageError: the forced task does not fit the label column.
    """
    header, rows, lines = read_rows(path, with_lines=True)
    if label not in header:
        raise DataError(f"{path}: no label column {label!r} (columns: {', '.join(header)})")
    if len(header) < 2:
        raise DataError(f"{path}: only the label column {label!r}; no feature to learn from")
    train = [row for i, row in enumerate(rows) if not is_holdout(i)]
    holdout = len(rows) - len(train)
    if holdout == 0:
        raise DataError(
            f"{path}: {len(rows)} data rows; at least {HOLDOUT_EVERY} are needed (every "
            f"{HOLDOUT_EVERY}th row is held out for evaluation)"
        )
    label_index = header.index(label)
    labels = [r[label_index] for r in rows]
    label_kind, task, classes = _label_task(path, label, labels, lines, task)
    if task == "classification" and len(set(labels)) < 2:
        raise DataError(f"{path}: label column {label!r} has only one class: {labels[0]!r}")
    columns = []
    for index, name in enumerate(header):
        if index == label_index:
            continue
        kind = _numeric_kind(path, name, [r[index] for r in rows], lines)
        values = [r[index] for r in train]
        if kind is not None:
            mean, std = _mean_std([float(v) for v in values])
            columns.append(Column(name, kind, mean=mean, std=std))
            continue
        distinct = sorted(set(values))
        if len(distinct) <= max_vocabulary:
            columns.append(Column(name, "string", vocabulary=tuple(distinct)))
        else:
            buckets = hash_buckets or 2 * len(distinct)
            columns.append(Column(name, "string", hash_buckets=buckets))
    return Schema(
        path=str(path),
        header=tuple(header),
        label=label,
        label_kind=label_kind,
        task=task,
        columns=tuple(columns),
        classes=classes,
        train_rows=len(train),
        holdout_rows=holdout,
    )


def holdout_rows(path: str | Path) -> tuple[list[str], list[list[str]]]:
    """The header and the held-out rows (what the export's evaluation report is made of)."""
    header, rows = read_rows(path)
    return header, [row for i, row in enumerate(rows) if is_holdout(i)]
