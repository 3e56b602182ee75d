"""The package graph: training -> artifact <- service, no cycles, no TensorFlow where it is
not needed, and images that carry only their own side."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import REPO_ROOT as ROOT

PACKAGES = ("artifact", "service", "training")
# The cycle check covers the benchmarks too (not the peers' venvs under benchmarks/.peers/).
CYCLE_CHECKED = (*PACKAGES, "benchmarks")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache  # parsing every file costs most of a second; the tests read the same files
def imports_of(path: Path) -> frozenset[str]:
    """Every module a file imports, at the top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(found)


def project_graph(packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """module -> the project's modules it imports, over the packages' files."""
    files = {
        module_name(p): p
        for pkg in packages
        for p in (ROOT / pkg).rglob("*.py")
        if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
    }
    return {
        name: {m for m in imports_of(path) if m in files and m != name}
        for name, path in files.items()
    }


def test_the_graph_is_read_from_real_files():
    graph = project_graph()
    assert (
        "service.app" in graph
        and "training.kinds.idx_training" in graph
        and "artifact.contract" in graph
    )
    assert "artifact.contract" in graph["service.codecs.pixels"]


@pytest.mark.parametrize(
    "package, forbidden",
    [
        pytest.param("service", ("training",), id="service-imports-no-training"),
        pytest.param("training", ("service",), id="training-imports-no-service"),
        pytest.param("artifact", ("service", "training"), id="artifact-depends-on-neither"),
    ],
)
def test_dependencies_point_one_way(package, forbidden):
    offenders = [
        f"{module} imports {target}"
        for module, targets in project_graph().items()
        if module.split(".")[0] == package
        for target in targets
        if target.split(".")[0] in forbidden
    ]
    assert offenders == []


def test_the_module_graph_has_no_cycle():
    graph = project_graph(CYCLE_CHECKED)
    assert "benchmarks.common" in graph["benchmarks.peers.run"]  # the benchmarks are read
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "visiting"
        for target in sorted(graph[node]):
            if state.get(target) == "visiting":
                raise AssertionError("import cycle: " + " -> ".join([*path, node, target]))
            if target not in state:
                visit(target, [*path, node])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def loaded_after(statement: str) -> set[str]:
    """Top-level module names loaded by a fresh interpreter running `statement`."""
    code = f"import sys\n{statement}\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


def test_the_app_and_its_data_plane_load_without_tensorflow_or_training():
    loaded = loaded_after(
        "import service.app, service.dataplane, service.backends.registry, service.__main__, "
        "service.codecs.tfserving_json, service.codecs.tensor_proto, service.codecs.v2_grpc, "
        "service.codecs.simple_json"
    )
    assert "tensorflow" not in loaded
    assert "training" not in loaded


def dockerfile_stage(target: str) -> str:
    """The lines of one stage of the Dockerfile."""
    text = (ROOT / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)
    (stage,) = [s for s in stages if re.match(rf"\S+ AS {target}(?=\s)", s)]
    return stage


def copied_sources(stage: str) -> set[str]:
    return {
        word.rstrip("/")
        for line in stage.splitlines()
        if line.startswith("COPY") and "--from" not in line
        for word in line.split()[1:-1]
    }


def test_the_api_image_carries_no_training_code_and_the_trainer_no_service():
    api = copied_sources(dockerfile_stage("api")) | copied_sources(dockerfile_stage("api-deps"))
    trainer = copied_sources(dockerfile_stage("trainer")) | copied_sources(
        dockerfile_stage("trainer-deps")
    )
    assert {"artifact", "service"} <= api and "training" not in api
    assert {"artifact", "training"} <= trainer and "service" not in trainer
    service_lock = (ROOT / "requirements-service.lock").read_text()
    training_lock = (ROOT / "requirements-training.lock").read_text()
    assert "granian" in service_lock and "granian" not in training_lock
    assert "starlette" not in training_lock


# The service's floors, lowest first: a module imports only from its own floor or below, so
# no arrow runs back up (a module not listed is on the floor of its longest listed prefix).
SERVICE_FLOORS: tuple[tuple[str, ...], ...] = (
    ("service.types", "service.settings", "service.cli", "service.errors", "service.metrics",
     "service.metrics_tfserving",
     "service.budgets", "service.routes",
     "service.security",
     "service.v2_proto", "service.config_files", "service.healthcheck", "service.tracing"),
    ("service.codecs",),
    ("service.backends",),
    ("service.traffic", "service.dataplane", "service.config_watcher", "service.prediction_log"),
    ("service.protocols", "service.openapi"),
    ("service.ingress",),
    ("service.app",),
    ("service.server", "service.workers"),
    ("service.__main__",),
)  # fmt: skip


def floor_of(module: str) -> int:
    best, floor = -1, None
    for number, prefixes in enumerate(SERVICE_FLOORS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, floor = len(prefix), number
    assert floor is not None, f"{module} is on no floor: add it to SERVICE_FLOORS"
    return floor


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import in service/ that runs from a floor to a higher one."""
    return [
        f"{module} (floor {floor_of(module)}) imports {target} (floor {floor_of(target)})"
        for module in sorted(m for m in graph if m.startswith("service."))
        for target in sorted(graph[module])
        if target.startswith("service.") and floor_of(target) > floor_of(module)
    ]


def test_no_import_in_service_runs_back_up_a_floor():
    graph = project_graph()
    assert len([m for m in graph if m.startswith("service.")]) > 20
    assert upward_imports(graph) == []


def test_the_floor_rule_catches_an_arrow_up():
    # What the layout had before: the backends' factory importing the config watcher above.
    graph = {"service.backends.factory": {"service.config_watcher", "service.settings"}}
    assert upward_imports(graph) == [
        "service.backends.factory (floor 2) imports service.config_watcher (floor 3)"
    ]


def test_every_test_module_has_a_name_of_its_own():
    """pytest imports test modules by their basename (rootdir-relative, no packages): two
    test_x.py files in different folders stop the whole run at collection."""
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


SIDE_FORBIDDEN = {
    # the tests' folder (and the support modules its files import) -> the other side's
    "training": ("service", "benchmarks", "fastapi", "uvicorn", "starlette"),
    "service": ("training", "tensorflow_estimator"),
}


def side_of(test_file: Path) -> str:
    return (
        "training" if test_file.is_relative_to(ROOT / "tests" / "live" / "training") else "service"
    )


def side_files(side: str) -> set[Path]:
    """The live tier's test files of one side (tools/test_sides.py), with their conftests and
    every support module they import, directly or through another."""
    live = ROOT / "tests" / "live"
    found = {p for p in live.rglob("*.py") if "__pycache__" not in p.parts and side_of(p) == side}
    found.add(live / "conftest.py")
    found.add(ROOT / "tests" / "conftest.py")
    queue = list(found)
    while queue:
        for module in imports_of(queue.pop()):
            if module.startswith("support."):
                path = ROOT / "tests" / "support" / (module.split(".")[1] + ".py")
                if path.is_file() and path not in found:
                    found.add(path)
                    queue.append(path)
    return found


def side_violations(side: str) -> list[str]:
    forbidden = SIDE_FORBIDDEN[side]
    return sorted(
        f"{path.relative_to(ROOT)} imports {module}"
        for path in side_files(side)
        for module in imports_of(path)
        if module.split(".")[0] in forbidden
    )


@pytest.mark.parametrize("side", sorted(SIDE_FORBIDDEN))
def test_each_sides_tests_import_nothing_of_the_other_side(side):
    """Each side's tests run in their own venv (docs/architecture.md, "Two TensorFlows"): the
    training side's has no web stack and no service packages, the service side's no
    tf.estimator. A test reaches the other side through its command line (support/sides.py);
    source run there (a string) is not an import here."""
    assert side_violations(side) == []


def test_the_side_check_sees_an_import_across(tmp_path, monkeypatch):
    test_file = ROOT / "tests" / "live" / "service" / "test_x_across.py"
    monkeypatch.setattr(
        sys.modules[__name__],
        "side_files",
        lambda side: {test_file} if side == "service" else set(),
    )
    monkeypatch.setattr(
        sys.modules[__name__], "imports_of", lambda path: frozenset({"training.data", "numpy"})
    )
    assert side_violations("service") == [f"{test_file.relative_to(ROOT)} imports training.data"]
