"""The argparse Namespace stops at the command line's edge: only the modules that parse the
command line (training/__main__.py, training/commands/,
training/configs.py's `from_args`, training/retrain/arguments.py) take it; the code below
reads the commands' typed configs (training/configs.py)."""

from __future__ import annotations

import ast
from pathlib import Path

from support.helpers import REPO_ROOT as ROOT

TRAINING = ROOT / "training"
EDGE = {
    TRAINING / "__main__.py",
    TRAINING / "configs.py",
    TRAINING / "retrain" / "arguments.py",
}


def below_the_edge() -> list[Path]:
    return [
        path
        for path in sorted(TRAINING.rglob("*.py"))
        if path not in EDGE and not path.is_relative_to(TRAINING / "commands")
    ]


def namespace_readers(path: Path) -> list[str]:
    """Where a module takes a parameter named `args`, or names argparse's Namespace."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.arg) and node.arg == "args":
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} takes args")
        elif isinstance(node, ast.Attribute) and node.attr == "Namespace":
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} names Namespace")
    return found


def test_the_modules_below_the_command_line_read_no_namespace():
    modules = below_the_edge()
    assert TRAINING / "kinds" / "csv.py" in modules and len(modules) > 40
    assert [found for path in modules for found in namespace_readers(path)] == []


def test_every_command_has_its_module_in_commands():
    main = (TRAINING / "__main__.py").read_text()
    tree = ast.parse(main)
    (table,) = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "COMMANDS" for t in node.targets)
    ]
    assert isinstance(table, ast.Dict)
    for value in table.values:
        assert isinstance(value, ast.Attribute) and value.attr == "run", ast.unparse(value)
        assert isinstance(value.value, ast.Name)
        assert (TRAINING / "commands" / f"{value.value.id}.py").is_file()
