"""Strict reading of hand-written JSON configuration files: one reader for every config trainguard loads.

A typo in an alerting config otherwise shows up as silence on the day a
regression lands, so every problem is a :class:`ConfigError` that names the
file and the key: an unknown key, a value of the wrong type, a number out of
range. Keys named ``"//"`` are comments and may appear in any object.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, Iterable, List, NoReturn, Optional

COMMENT_KEY = "//"


class ConfigError(ValueError):
    """A problem in a configuration file, with the file and the key it is about."""

    def __init__(self, source: str, key: str, problem: str):
        super().__init__(f"{source}: {key}: {problem}")
        self.source, self.key, self.problem = source, key, problem


def read_json_file(path: str) -> Any:
    """The JSON value in ``path``; a missing file or bad JSON is a ``ConfigError``."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(path, "-", f"cannot read JSON: {e}") from None


class StrictReader:
    """Typed accessors over raw JSON that raise ``ConfigError`` naming the file and the key."""

    def __init__(self, source: str):
        self.source = source

    def error(self, key: str, problem: str) -> ConfigError:
        return ConfigError(self.source, key or "<top level>", problem)

    def fail(self, key: str, problem: str) -> NoReturn:
        raise self.error(key, problem)

    def object(self, value: Any, key: str, allowed: Optional[Iterable[str]] = None,
               required: Iterable[str] = ()) -> Dict[str, Any]:
        """An object without its comment keys; with ``allowed``, any other key is an error."""
        if not isinstance(value, dict):
            self.fail(key, f"must be an object, got {type(value).__name__}")
        obj = {k: v for k, v in value.items() if k != COMMENT_KEY}
        if allowed is not None:
            allowed_set = set(allowed)
            for name in obj:
                if name not in allowed_set:
                    self.fail(f"{key}.{name}" if key else name, f"unknown key (allowed: {sorted(allowed_set)})")
        for name in required:
            if name not in obj:
                self.fail(f"{key}.{name}" if key else name, "is required")
        return obj

    def string(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or not value.strip():
            self.fail(key, f"must be a non-empty string, got {value!r}")
        return value

    def strings(self, value: Any, key: str) -> List[str]:
        if not isinstance(value, list):
            self.fail(key, f"must be a list of strings, got {type(value).__name__}")
        return [self.string(item, key) for item in value]

    def number(self, value: Any, key: str, minimum: Optional[float] = None) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.fail(key, f"must be a finite number, got {value!r}")
        if minimum is not None and value < minimum:
            self.fail(key, f"must be a number >= {minimum:g}, got {value!r}")
        return float(value)

    def positive(self, value: float, key: str, allow_zero: bool = False) -> float:
        if value < 0 or (value == 0 and not allow_zero):
            self.fail(key, f"must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
        return value

    def integer(self, value: Any, key: str, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(key, f"must be an integer >= {minimum}, got {value!r}")
        return value

    def boolean(self, value: Any, key: str) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        self.fail(key, f"must be true/false or the strings \"True\"/\"False\", got {value!r}")
