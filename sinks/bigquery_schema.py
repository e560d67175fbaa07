"""The BigQuery schemas of trainguard's tables, without Beam.

``python -m sinks.bigquery_schema --schema_dir DIR`` writes one ``bq``-style JSON schema file per table of
``core/schema.py`` (``DIR/<table>.json``) and prints a ``name time_column cluster,columns`` line per table:
``run_dataflow.sh`` creates the tables from them. It imports no Beam, so the launch does not wait a second
for it.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Dict, List, Optional, Sequence

from core.schema import TABLES, Table
from trainguard.cli import DASHES_NOTE, HelpFormatter, StrictArgumentParser

PROG = "python -m sinks.bigquery_schema"


def schema_json(table: Table) -> List[Dict[str, str]]:
    """The table's schema as BigQuery JSON (``bq mk --schema`` files, Beam's dict schemas)."""
    return [{"name": c.name, "type": c.type, "mode": "REQUIRED" if c.required else "NULLABLE",
             "description": c.description} for c in table.columns]


def write_schemas(schema_dir: str) -> List[str]:
    """Writes ``<table>.json`` per table into ``schema_dir``; returns the ``name time_column cluster`` lines."""
    os.makedirs(schema_dir, exist_ok=True)
    lines = []
    for table in TABLES.values():
        with open(os.path.join(schema_dir, f"{table.name}.json"), "w", encoding="utf-8") as f:
            json.dump(schema_json(table), f, indent=1)
        lines.append(f"{table.name} {table.time_column} {','.join(table.cluster_by)}")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = StrictArgumentParser(prog=PROG, description=__doc__.split("\n\n", 1)[1].replace("``", ""),
                                  formatter_class=HelpFormatter, epilog=DASHES_NOTE)
    parser.add_argument("--schema_dir", required=True, help="directory to write the schema files into")
    args = parser.parse_args(argv)
    for line in write_schemas(args.schema_dir):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
