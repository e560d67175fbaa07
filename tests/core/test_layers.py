"""The rule of the layers: core at the bottom imports no Beam and nothing above it; tools sit on top."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
ABOVE_CORE = ("pipeline", "transforms", "sinks", "notifier", "report", "dashboard", "apache_beam", "tests", "bench", "scripts")
TRAINER_MODULES_CORE_MAY_USE = ("trainguard.wire", "trainguard.stats_math")
# What each layer may import of the project's own packages (the standard library and third parties aside).
ALLOWED = {
    "transforms": {"core", "transforms", "trainguard"},
    "sinks": {"core", "sinks", "trainguard"},
}


def imported_modules(path: pathlib.Path):
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "trainguard":  # from trainguard import wire
                yield from (f"trainguard.{alias.name}" for alias in node.names)
            else:
                yield node.module


def python_files(package: str):
    return sorted((REPO / package).rglob("*.py"))


@pytest.mark.parametrize("path", python_files("core"), ids=lambda p: p.name)
def test_core_imports_only_the_standard_library_itself_and_the_wire_contract(path):
    for module in imported_modules(path):
        top = module.split(".")[0]
        assert top not in ABOVE_CORE, f"{path.name} imports {module}"
        if top == "trainguard":
            assert module in TRAINER_MODULES_CORE_MAY_USE, f"{path.name} imports {module}"


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_beam_layers_import_only_core_and_their_own_package(layer):
    project = {"core", "transforms", "sinks", "pipeline", "notifier", "report", "dashboard", "trainguard", "scripts",
               "tests"}
    for path in python_files(layer):
        for module in imported_modules(path):
            top = module.split(".")[0]
            if top in project:
                assert top in ALLOWED[layer], f"{path.relative_to(REPO)} imports {module}"


def test_importing_every_core_module_loads_no_beam():
    modules = sorted(f"core.{p.stem}" for p in python_files("core") if p.stem != "__init__")
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "heavy = ('apache_beam', 'duckdb', 'grpc', 'pyarrow', 'numpy')\n"
            + "bad = sorted(m for m in sys.modules if m.split('.')[0] in heavy)\n"
            + "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_the_dashboard_reads_through_core_sinks_and_report_and_writes_triage_as_the_cli_does():
    allowed = {"core", "sinks", "report", "dashboard", "trainguard", "pipeline.triage"}
    for path in python_files("dashboard"):
        for module in imported_modules(path):
            top = module.split(".")[0]
            if top in {"core", "transforms", "sinks", "pipeline", "notifier", "report", "scripts", "tests"}:
                assert top in allowed or module in allowed, f"{path.relative_to(REPO)} imports {module}"
    code = ("import sys, dashboard.app, dashboard.cli\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('apache_beam', 'matplotlib'))\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
