"""``python -m sinks.bigquery_schema``: the schema files and table lines ``run_dataflow.sh`` creates tables from."""

import json
import subprocess
import sys

from core.schema import TABLES
from sinks.bigquery_schema import schema_json
from tests.support import REPO_ROOT, heavy_imports_of


def run(*args):
    return subprocess.run([sys.executable, "-m", "sinks.bigquery_schema", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)


def test_one_schema_file_and_one_line_per_table(tmp_path):
    done = run(f"--schema_dir={tmp_path / 'schemas'}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{t.name} {t.time_column} {','.join(t.cluster_by)}" for t in TABLES.values()]
    for table in TABLES.values():
        written = json.loads((tmp_path / "schemas" / f"{table.name}.json").read_text())
        assert written == schema_json(table)
        assert [field["name"] for field in written] == list(table.column_names)
    assert sorted(p.name for p in (tmp_path / "schemas").iterdir()) == sorted(f"{n}.json" for n in TABLES)


def test_an_unknown_option_exits_2_naming_it(tmp_path):
    done = run(f"--schema_dir={tmp_path}", "--schemadir=x")
    assert done.returncode == 2 and "unknown option --schemadir" in done.stderr and not list(tmp_path.iterdir())


def test_it_runs_without_beam():
    """The launch runs it before anything else: a second of Beam's import for a few JSON files was waste."""
    assert heavy_imports_of("sinks.bigquery_schema") == []
