"""``python -m pipeline.check_configs [--config_dir=configs]``: checks a config directory as the pipeline does.

Reads the directory (local or ``gs://``) with the pipeline's own loader and checks it as strictly as the
pipeline does at start-up. A valid directory prints what it holds: how many tests, whether it has a
``default.json``, and when each dated version (``<test>@<UTC time>.json``) takes effect. A file that fails is
one line on stderr naming the file and the key, exit status 2: the error the pipeline would refuse to start
with, and that a running job would reject with a ``config_rejected`` alert. ``run_dataflow.sh`` runs it before
it uploads the directory, so that a bad file never reaches the running job. A local directory is read
without Beam (``core.config_versions``, the same rules), so the check takes a fraction of a second.
"""

from __future__ import annotations

import argparse
from typing import List, Optional

from core.config import DEFAULT_CONFIG_NAME, ConfigError
from core.config_versions import BEGINNING, LoadedConfigs, load_local_versions
from core.locations import CONFIG_DIR
from core.records import iso_utc
from trainguard.cli import DASHES_NOTE, USAGE_ERROR, HelpFormatter, StrictArgumentParser, fail

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


def build_parser() -> argparse.ArgumentParser:
    parser = StrictArgumentParser(prog=PROG, description=__doc__.split("\n\n", 1)[1].replace("``", ""),
                                  formatter_class=HelpFormatter, epilog=DASHES_NOTE)
    parser.add_argument("--config_dir", default=CONFIG_DIR,
                        help="directory of per-test JSON configs, local or gs://")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    loaded = read(args.config_dir)
    try:
        loaded.strict()
    except ConfigError as e:
        return fail(PROG, str(e), USAGE_ERROR)
    print(describe(loaded))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
