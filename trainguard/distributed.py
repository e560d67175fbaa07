"""Which worker of a distributed job this process is: rank, world size, elastic restarts.

torchrun and torchelastic's agent put the worker's global ``RANK``, the job's
``WORLD_SIZE`` and ``TORCHELASTIC_RESTART_COUNT`` (how often the agent has
restarted the workers) into every worker's environment. ``LOCAL_RANK`` and
``GROUP_RANK`` are per node and not used: the pipeline names a worker by its
global rank. Handlers and ``Run`` read these once, when they are created;
explicit ``rank``/``world_size`` arguments replace both variables.

Invalid environment values never stop training: they are logged once per
process and the messages go out without rank (as from a single process).
Invalid explicit arguments are a programming error and raise ``ValueError``.
"""

from __future__ import annotations

import logging
import operator
import os
import re
from typing import Any, List, Mapping, NamedTuple, Optional, Tuple

from . import wire

ENV_RANK = "RANK"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"

logger = logging.getLogger("trainguard")

_DIGITS = re.compile(r"\s*[0-9]+\s*")  # int() alone would also take "1_0", "+1" and other digit scripts
_warned: set = set()  # environment values already warned about (one warning per process each)


class Rank(NamedTuple):
    """A worker's place in its job; ``None``: not known (a single process)."""
    rank: Optional[int] = None
    world_size: Optional[int] = None

    @property
    def known(self) -> bool:
        return self.rank is not None


UNKNOWN = Rank()


def check_rank(rank: Any, world_size: Any) -> Rank:
    """``rank`` and ``world_size`` validated by the wire contract's own rule; raises ``ValueError``.

    Integer types other than ``int`` (numpy's, a 0-d tensor's ``__index__``) are taken as their value.
    """
    # wire._parse_rank is the one definition of what the pipeline accepts (InvalidMessage is a ValueError).
    return Rank(*wire._parse_rank({"rank": _as_int(rank), "world_size": _as_int(world_size)}))


def _as_int(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int)):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value  # refused by the contract's check, with its message


def resolve(rank: Any = None, world_size: Any = None,
            environ: Optional[Mapping[str, str]] = None) -> Rank:
    """Explicit arguments if either is given (validated, may raise), else the environment (never raises)."""
    if rank is not None or world_size is not None:
        return check_rank(rank, world_size)
    return from_environment(environ)


def from_environment(environ: Optional[Mapping[str, str]] = None) -> Rank:
    """``RANK``/``WORLD_SIZE``; unset or empty: unknown; invalid: unknown, with one warning."""
    env = os.environ if environ is None else environ
    raw_rank, raw_world_size = env.get(ENV_RANK) or None, env.get(ENV_WORLD_SIZE) or None
    if raw_rank is None and raw_world_size is None:
        return UNKNOWN
    try:
        return check_rank(_integer(ENV_RANK, raw_rank), _integer(ENV_WORLD_SIZE, raw_world_size))
    except ValueError as e:
        _warn_once((ENV_RANK, raw_rank, raw_world_size),
                   f"ignoring {ENV_RANK}={raw_rank!r} {ENV_WORLD_SIZE}={raw_world_size!r} from the environment "
                   f"({e}); messages are sent without rank and world_size")
        return UNKNOWN


def restart_count(environ: Optional[Mapping[str, str]] = None) -> int:
    """``TORCHELASTIC_RESTART_COUNT``: 0 when unset, empty or invalid (invalid is warned about once)."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_RESTART_COUNT) or None
    if raw is None:
        return 0
    try:
        return _integer(ENV_RESTART_COUNT, raw) or 0
    except ValueError as e:
        _warn_once((ENV_RESTART_COUNT, raw), f"ignoring {ENV_RESTART_COUNT}={raw!r} from the environment ({e})")
        return 0


def _integer(name: str, raw: Optional[str]) -> Optional[int]:
    if raw is None:
        return None
    if not _DIGITS.fullmatch(raw):
        raise ValueError(f"{name} must be a non-negative integer")
    return int(raw)


def _warn_once(key: object, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning("trainguard: %s", message)


# -- the TensorBoard shipper's run-directory layout ------------------------------

RANK_DIRECTORY = re.compile(r"rank[-_]?([0-9]+)")
"""A directory holding one rank's logs: ``rank3``, ``rank_3`` or ``rank-3``."""


def split_rank_directory(run_dir: str) -> Tuple[str, Optional[int]]:
    """A log subdirectory (``/``-separated, ``""`` for the log directory itself) as
    ``(tag prefix, rank)``: ``rank_2/train`` -> ``("train", 2)``, ``train`` -> ``("train", None)``.

    Every rank-named part is left out of the prefix; the innermost one gives the rank.
    """
    parts: List[str] = []
    rank: Optional[int] = None
    for part in run_dir.split("/") if run_dir else ():
        match = RANK_DIRECTORY.fullmatch(part)
        if match:
            rank = int(match.group(1))
        else:
            parts.append(part)
    return "/".join(parts), rank
