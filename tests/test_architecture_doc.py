"""docs/architecture.md is a true map: it names every product module, and every module it names exists."""

from __future__ import annotations

import pathlib
import re
from typing import List, Set

REPO = pathlib.Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "architecture.md"
# The product's packages. dashboard/ (issue 32) is named by the document as a whole, not checked module by module.
PRODUCT = ("core", "transforms", "sinks", "pipeline", "notifier", "report", "dashboard", "trainguard")
NOT_LISTED = ("__init__.py", "__main__.py")  # a package's __main__.py may be named, but need not be
MODULE_PATH = re.compile(r"`((?:" + "|".join(PRODUCT) + r")/[\w/]*\.py)`")


def product_modules() -> List[str]:
    """Every product module, as its path from the checkout's root (a package not in this checkout left out)."""
    return sorted(path.relative_to(REPO).as_posix() for package in PRODUCT if (REPO / package).is_dir()
                  for path in (REPO / package).rglob("*.py") if path.name not in NOT_LISTED)


def named_modules(text: str) -> Set[str]:
    """The module paths the document names, in backticks."""
    return set(MODULE_PATH.findall(text))


def test_the_document_names_every_product_module():
    named = named_modules(ARCHITECTURE.read_text(encoding="utf-8"))
    missing = [path for path in product_modules() if path not in named]
    assert not missing, "docs/architecture.md does not name (as `path`): " + ", ".join(missing)


def test_every_module_the_document_names_exists():
    stale = sorted(path for path in named_modules(ARCHITECTURE.read_text(encoding="utf-8"))
                   if not (REPO / path).is_file())
    assert not stale, "docs/architecture.md names modules that do not exist: " + ", ".join(stale)


def test_the_checks_read_paths_as_the_document_writes_them():
    text = "`core/encoding.py`: the encoding. See core/backtest.py and `sinks/nothing.py`, `bench/timing.py`."
    assert named_modules(text) == {"core/encoding.py", "sinks/nothing.py"}
    assert "core/encoding.py" in product_modules() and "trainguard/metrics/api.py" in product_modules()
    assert not any(path.endswith(NOT_LISTED) for path in product_modules())
