"""``python -m pipeline.check_configs [--config_dir=configs]``: checks a config directory as the pipeline does.

Reads the directory (local or ``gs://``) with the pipeline's own loader and checks it as strictly as the
pipeline does at start-up. A valid directory prints what it holds: how many tests, whether it has a
``default.json``, and when each dated version (``<test>@<UTC time>.json``) takes effect. A file that fails is
one line on stderr naming the file and the key, exit status 2: the error the pipeline would refuse to start
with, and that a running job would reject with a ``config_rejected`` alert. ``run_dataflow.sh`` runs it before
it uploads the directory, so that a bad file never reaches the running job. A local directory is read
without Beam (``core.config_versions``, the same rules), so the check takes a fraction of a second. With a
store (``--local_store``, or ``--bigquery_dataset``), it also warns about every test, metric and window tag the
configs check that no stored run has reported, with the nearest reported name: a misspelled metric name is a
valid config whose check never runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, Iterable, List, Mapping, Optional, Set

from core.config import DEFAULT_CONFIG_NAME, ConfigError, ConfigSet
from core.config_versions import BEGINNING, LoadedConfigs, load_local_versions
from core.locations import CONFIG_DIR
from core.records import iso_utc
from core.schema import METRIC_HISTORY
from sinks import seed
from sinks.seed import Query, SqlDialect
from sinks.stores import StoreReader, add_store_options, open_store
from trainguard.cli import (
    DASHES_NOTE,
    RUNTIME_ERROR,
    USAGE_ERROR,
    HelpFormatter,
    StrictArgumentParser,
    cloud_failure,
    fail,
    nearest_name,
)

PROG = "python -m pipeline.check_configs"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def describe(loaded: LoadedConfigs) -> str:
    """What a valid directory holds: one summary line, then one line per dated version, in time order."""
    files = sorted(loaded.files.values(), key=lambda f: (f.valid_from, f.name))
    tests = {f.test for f in files if f.test != DEFAULT_CONFIG_NAME}
    default = "a default.json" if any(f.test == DEFAULT_CONFIG_NAME for f in files) else \
        "no default.json (the built-in default)"
    dated = [f for f in files if f.valid_from != BEGINNING]
    lines = [f"{loaded.directory}: valid: {plural(len(tests), 'test')}, {default}, "
             f"{plural(len(dated), 'dated version')}"]
    lines += [f"  {f.test} from {iso_utc(f.valid_from)} ({f.name})" for f in dated]
    return "\n".join(lines)


def read(directory: str) -> LoadedConfigs:
    """The directory read as the pipeline reads it: through Beam's file systems for a URL such as gs://."""
    if "://" in directory:
        from transforms.config_versions import read_config_dir  # imports Beam: only where it is needed

        return read_config_dir(directory)
    return load_local_versions(directory)


def unreported(configs: ConfigSet, reported: Mapping[str, Set[str]]) -> List[str]:
    """Warnings, one per name a test's own config checks that none of its stored runs has reported: a metric
    of ``metric_success_conditions`` or a tag of ``window_config`` (each with the nearest reported name, the
    likely intended one), or the test itself, with no stored run. ``reported``: test -> its stored metric
    names (``<tag>_<aggregation>``)."""
    warnings = []
    for test, config in sorted(configs.by_test.items()):
        metrics = reported.get(test)
        if not metrics:
            warnings.append(f"{test}: no stored run of this test (a misspelled file name?)")
            continue
        tags = {metric.rsplit("_", 1)[0] for metric in metrics}
        checked = [("metric", name, metrics) for name in config.regression_test.metric_success_conditions
                   if name != DEFAULT_CONFIG_NAME]
        checked += [("tag", tag, tags) for tag in config.windows.tags]
        for kind, name, known in checked:
            if name not in known:
                nearest = nearest_name(name, known)
                hint = f" (did you mean {nearest}?)" if nearest else ""
                warnings.append(f"{test}: no stored run reported the {kind} {name}: its check never runs{hint}")
    return warnings


def reported_metrics(query: Query, dialect: SqlDialect, tests: Optional[Iterable[str]] = None) -> Dict[str, Set[str]]:
    """test -> the metric names its stored runs reported (of ``tests`` only, when named: what :func:`unreported`
    looks at is the tests with a config of their own, not a fleet's every test)."""
    q = dialect.quote
    named = None if tests is None else set(tests)
    where = "" if named is None or len(named) > seed.MAX_NAMED_TESTS else f" WHERE {seed.test_in(dialect, named)}"
    rows = query(f"SELECT DISTINCT {q('test_name')}, {q('metric_name')} FROM {dialect.table(METRIC_HISTORY)}{where}")
    reported: Dict[str, Set[str]] = {}
    for test, metric in rows:
        reported.setdefault(test, set()).add(metric)
    return reported


def unreported_in_store(configs: ConfigSet, store: StoreReader) -> List[str]:
    """:func:`unreported` for the names the runs in ``store`` reported; closes the store."""
    try:
        return unreported(configs, reported_metrics(store.query, store.dialect, configs.by_test))
    finally:
        store.close()


def print_warnings(warnings: List[str], prog: str) -> None:
    """Each warning a line on stderr (the pipeline's, at the start of a streaming job and at the end of a
    replay)."""
    for warning in warnings:
        print(f"{prog}: warning: {warning}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = StrictArgumentParser(prog=PROG, description=__doc__.split("\n\n", 1)[1].replace("``", ""),
                                  formatter_class=HelpFormatter, epilog=DASHES_NOTE)
    parser.add_argument("--config_dir", default=CONFIG_DIR,
                        help="directory of per-test JSON configs, local or gs://")
    stored = parser.add_argument_group("names to check against (optional): the store of past runs")
    add_store_options(stored)
    parser.set_defaults(local_store=None)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    loaded = read(args.config_dir)
    try:
        configs = loaded.strict().latest
    except ConfigError as e:
        return fail(PROG, str(e), USAGE_ERROR)
    print(describe(loaded))
    if args.local_store or args.bigquery_dataset:
        try:
            store = open_store(args)
        except FileNotFoundError as e:
            return fail(PROG, str(e), USAGE_ERROR)
        try:
            warnings = unreported_in_store(configs, store)
        except Exception as e:
            line = cloud_failure(e)
            if line is None:
                raise
            return fail(PROG, line, RUNTIME_ERROR)
        print("\n".join(f"warning: {w}" for w in warnings) if warnings
              else f"every configured test, metric and tag has stored runs in {store.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
