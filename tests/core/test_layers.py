"""The rule of the layers (docs/architecture.md), checked over every package of the product.

Core at the bottom imports no Beam and nothing above it; the Beam layers import core; the entry points and the
tools sit on top and do not import each other; the trainer side imports nothing of the pipeline, which uses only
the trainer modules listed here; product code never imports the tests, benchmarks or scripts; each package uses
only the third-party packages the document's table lists; and modules import each other without cycles. Today's
exceptions are listed by name, each with why, so that a new one fails.
"""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys
from typing import Dict, Iterator, List, Set, Tuple

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
ARCHITECTURE = REPO / "docs" / "architecture.md"
PRODUCT = ("core", "transforms", "sinks", "pipeline", "notifier", "report", "dashboard", "trainguard")
PIPELINE_SIDE = ("core", "transforms", "sinks", "pipeline", "notifier", "report", "dashboard")
TOOLS = ("notifier", "report", "dashboard")
NOT_PRODUCT = ("tests", "bench", "scripts")
PROJECT = (*PRODUCT, *NOT_PRODUCT)

# What each package may import of the project's own packages (the standard library and third parties aside).
ALLOWED = {
    "core": {"core", "trainguard"},
    "transforms": {"core", "transforms", "trainguard"},
    "sinks": {"core", "sinks", "trainguard"},
    "pipeline": {"core", "transforms", "sinks", "pipeline", "trainguard"},
    "notifier": {"core", "sinks", "notifier", "trainguard"},
    "report": {"core", "sinks", "report", "trainguard"},
    "dashboard": {"core", "sinks", "dashboard", "trainguard"},
    "trainguard": {"trainguard"},
}
# Imports that break ALLOWED today, each a known debt: (importing file, imported package) -> why it is allowed.
KNOWN_LAYER_EXCEPTIONS = {
    ("pipeline/replay.py", "report"): "--report_dir draws the report after a replay; imported inside the function "
                                      "that draws it, so a replay without it needs no report extra (issue 33)",
    # The dashboard came after the report and reuses its read model and its curve maths (report/source.py's
    # rows, report/data.py's window replay), and writes triage through trainguard-triage's own function; both
    # belong below the tools (sinks/, core/): known debt.
    ("dashboard/charts.py", "report"): "the report's Curve record (report/data.py)",
    ("dashboard/pages.py", "report"): "the report's run curves and window bounds (report/data.py)",
    ("dashboard/queries.py", "report"): "the report's JobRow and MetricRow (report/source.py)",
    ("dashboard/app.py", "pipeline"): "trainguard-triage's time parser and error (pipeline/triage.py)",
    ("dashboard/triage.py", "pipeline"): "trainguard-triage's deliver(), so a form writes what the CLI writes",
}
# The trainer side's modules the pipeline side may import: the wire contract and its maths (core too), and the
# command-line conventions every command shares (above core only).
TRAINER_MODULES_CORE_MAY_USE = ("trainguard.wire", "trainguard.stats_math")
TRAINER_MODULES_PIPELINE_MAY_USE = (*TRAINER_MODULES_CORE_MAY_USE, "trainguard.cli")
# Import cycles there are today, as strongly connected sets of modules. A new cycle, or a module joining one,
# fails; a cycle broken must be removed from here.
KNOWN_CYCLES_AT_IMPORT_TIME = [
    # wire.py imports _columns at its end (after every name _columns uses is defined), and _columns imports wire:
    # the v1.1 column format lives in its own module but wire.py is its public face.
    {"trainguard._columns", "trainguard.wire"},
]
KNOWN_CYCLES_WITH_DEFERRED_IMPORTS = [
    *KNOWN_CYCLES_AT_IMPORT_TIME,
    # core.config.load_config_dir imports core.config_versions inside the function (config_versions builds on
    # config: config_versions -> records -> runs -> parse -> config); moving load_config_dir would change its
    # callers' import (known debt).
    {"core.config", "core.config_versions", "core.parse", "core.records", "core.runs"},
]


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def python_files(package: str) -> List[pathlib.Path]:
    return sorted((REPO / package).rglob("*.py"))


MODULES: Dict[str, pathlib.Path] = {module_name(p): p for package in PROJECT for p in python_files(package)}


def import_nodes(tree: ast.Module, deferred: bool) -> Iterator[ast.AST]:
    """The nodes that may import: all of them, or (not ``deferred``) those run when the module is imported."""
    if deferred:
        yield from ast.walk(tree)
        return
    pending: List[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending.extend(node.orelse)
            continue
        yield node
        pending.extend(ast.iter_child_nodes(node))


def imported_modules(path: pathlib.Path, deferred: bool = True) -> Iterator[str]:
    """Absolute names of what ``path`` imports; ``from package import module`` is ``package.module``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    own = module_name(path).split(".")
    for node in import_nodes(tree, deferred):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = own if path.name == "__init__.py" else own[:-1]
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            submodules = [f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in MODULES]
            yield from submodules if len(submodules) == len(node.names) else [module, *submodules]


def project_module(name: str) -> str:
    """The project module (a file) that an imported name is, or is in; "" for none."""
    parts = name.split(".")
    while parts and ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts)


def rel(path: pathlib.Path) -> str:
    return path.relative_to(REPO).as_posix()


def project_imports(package: str) -> Iterator[Tuple[pathlib.Path, str]]:
    for path in python_files(package):
        for module in imported_modules(path):
            if module.split(".")[0] in PROJECT:
                yield path, module


@pytest.mark.parametrize("package", PRODUCT)
def test_each_package_imports_only_the_layers_below_it(package):
    problems = []
    for path, module in project_imports(package):
        top = module.split(".")[0]
        if top not in ALLOWED[package] and (rel(path), top) not in KNOWN_LAYER_EXCEPTIONS:
            problems.append(f"{rel(path)} imports {module}")
    assert not problems, "\n".join(problems)


def test_the_known_layer_exceptions_still_exist():
    found = {(rel(path), module.split(".")[0]) for package in PRODUCT for path, module in project_imports(package)}
    assert set(KNOWN_LAYER_EXCEPTIONS) <= found, "a known exception is gone: remove it from KNOWN_LAYER_EXCEPTIONS"


@pytest.mark.parametrize("package", PRODUCT)
def test_product_code_never_imports_tests_benchmarks_or_scripts(package):
    bad = [f"{rel(path)} imports {module}" for path, module in project_imports(package)
           if module.split(".")[0] in NOT_PRODUCT]
    assert not bad, "\n".join(bad)


def test_the_tools_and_the_entry_points_do_not_import_each_other():
    top = ("pipeline", *TOOLS)
    bad = [f"{rel(path)} imports {module}" for package in top for path, module in project_imports(package)
           if module.split(".")[0] in top and module.split(".")[0] != package
           and (rel(path), module.split(".")[0]) not in KNOWN_LAYER_EXCEPTIONS]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("package", PIPELINE_SIDE)
def test_the_pipeline_side_uses_only_the_listed_trainer_modules(package):
    may_use = TRAINER_MODULES_CORE_MAY_USE if package == "core" else TRAINER_MODULES_PIPELINE_MAY_USE
    bad = []
    for path, module in project_imports(package):
        if module.split(".")[0] == "trainguard" and project_module(module) not in may_use:
            bad.append(f"{rel(path)} imports {module}")
    assert not bad, "\n".join(bad)


def test_every_listed_trainer_module_exists_and_is_used():
    used = {project_module(module) for package in PIPELINE_SIDE for _, module in project_imports(package)}
    assert set(TRAINER_MODULES_PIPELINE_MAY_USE) <= set(MODULES) & used


def third_party_imports(package: str) -> Set[str]:
    stdlib = set(sys.stdlib_module_names)
    return {module.split(".")[0] for path in python_files(package) for module in imported_modules(path)
            if module and module.split(".")[0] not in stdlib | set(PROJECT)}


def documented_third_parties() -> Dict[str, Set[str]]:
    """The table "Third-party packages each layer may use" of docs/architecture.md: package -> import names."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("## Third-party packages each layer may use", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)/` \| (.*) \|$", section, re.MULTILINE)
    return {package: set(re.findall(r"`(\w+)`", names)) for package, names in rows}


def test_the_documented_third_party_table_lists_every_product_package():
    assert sorted(documented_third_parties()) == sorted(PRODUCT)


@pytest.mark.parametrize("package", PRODUCT)
def test_each_package_uses_exactly_the_third_party_packages_the_document_lists(package):
    assert third_party_imports(package) == documented_third_parties()[package], (
        f"{package}/'s third-party imports differ from docs/architecture.md's table")


def import_graph(deferred: bool) -> Dict[str, Set[str]]:
    """Product module -> the product modules it imports (``deferred``: imports inside functions too)."""
    product = {name: path for name, path in MODULES.items() if name.split(".")[0] in PRODUCT}
    graph = {}
    for name, path in product.items():
        targets = {project_module(module) for module in imported_modules(path, deferred)}
        graph[name] = {target for target in targets if target in product and target != name}
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[Set[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[Set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            successor = next(successors, None)
            if successor is not None:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                elif successor in on_stack:
                    low[node] = min(low[node], index[successor])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert sorted(map(sorted, cycles(graph))) == [["a", "b", "c"], ["d", "e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_sees_imports_of_every_form():
    graph = import_graph(deferred=False)
    assert "trainguard.wire" in graph["trainguard._columns"]  # from . import wire
    assert "core.false_alert_calibration" in graph["core.bounds"]  # from core import false_alert_calibration
    assert "core.registry" in graph["core.records"]  # from core.registry import ...
    assert "core.config_versions" not in graph["core.config"]  # imported inside a function only
    assert "core.config_versions" in import_graph(deferred=True)["core.config"]


@pytest.mark.parametrize("deferred", [False, True], ids=["at_import_time", "with_deferred_imports"])
def test_no_import_cycles_but_the_known_ones(deferred):
    known = KNOWN_CYCLES_WITH_DEFERRED_IMPORTS if deferred else KNOWN_CYCLES_AT_IMPORT_TIME
    found = sorted(sorted(cycle) for cycle in cycles(import_graph(deferred)))
    expected = sorted(sorted(cycle) for cycle in known)
    new, gone = [c for c in found if c not in expected], [c for c in expected if c not in found]
    assert not new and not gone, f"import cycles changed: break the new {new}; remove the broken {gone} from the list"


def test_importing_every_core_module_loads_no_beam():
    modules = sorted(f"core.{p.stem}" for p in python_files("core") if p.stem != "__init__")
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "heavy = ('apache_beam', 'duckdb', 'grpc', 'pyarrow', 'numpy')\n"
            + "bad = sorted(m for m in sys.modules if m.split('.')[0] in heavy)\n"
            + "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_importing_every_tool_module_loads_no_beam_and_no_transform():
    modules = sorted(module_name(p) for tool in TOOLS for p in python_files(tool)
                     if p.stem not in ("__main__", "plots"))  # report/plots.py: matplotlib, an extra
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            # pipeline.triage: the dashboard's known exception (KNOWN_LAYER_EXCEPTIONS), itself free of Beam
            + "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('apache_beam', 'transforms', 'pipeline')\n"
            + "             and m not in ('pipeline', 'pipeline.triage'))\n"
            + "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
