"""Small persistent shifts: a metric whose last few runs all sit a little on the bad side of its history.

One run 1–2σ worse than usual is noise; three to five of them in a row are a
regression a one-run cutoff cannot see at any sane false-alert rate. The
statistic (:func:`shift_statistic`) looks at the last ``k`` counted values for
k = 2 … 5, each as its deviation from the median of the values before the last
five, in robust scales (1.4826·MAD of those, ``core.stats.robust_scale``),
capped at ±``CAP`` so that one heavy-tailed value cannot carry it alone, signed
so that worse is positive. S = max over k of (the sum of the k deviations) / √k,
over the windows whose every value is worse than that median (a new level is
worse in each of its runs; two one-off faults with a healthy run between them
are not a level): the best-placed window's standardized mean, a CUSUM over the
last five runs restarted at each possible first run of the new level.

The threshold for a false-alert rate p and n values before the window is
calibrated by ``scripts/calibrate_false_alert_rate.py`` like the one-run
cutoff: Student-t noise with 3 degrees of freedom exceeds it with probability
p (``shift_threshold``). A shift is reported once, at the run where S first
exceeds it (:func:`find_shift`: not while the statistic of the same history one
to ``QUIET`` runs shorter already did, so a level that keeps crossing is one
alert), as a ``metric_shifted`` alert naming the
first run of the best window, its size and how far S went beyond the
threshold; not when the history already holds the new level as a mode of its own (runs on a slower
machine type: :func:`_known_mode`). It is a pure function of the counted values, so a seeded history
decides it exactly as the running one did. The history then restarts at the
new level's first run (``core.history.MetricHistory``), as after
``rebaseline_after`` runs out of bounds: a shift is one alert, and the runs
after it are judged against the new level (its scale bridged by the old one's
until it has values of its own); ``trainguard-triage accept`` from the named
run says the change was intended.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence, Tuple

from core import false_alert_calibration as calibration
from core.bounds import MODE_MIN_VALUES, MODE_SHARE, grid_bracket
from core.config import HEAVY_TAILED, NORMAL
from core.stats import MAD_TO_SIGMA, median, robust_scale, t3_upper_tail

WINDOWS = (2, 3, 4, 5)  # the last k runs a new level may have started at
RECENT = max(WINDOWS)  # the values compared with the ones before them
CAP = 3.0  # a value counts at most this many scales
MIN_BASE = 10  # values before the window, at least: fewer cannot place a level 1σ away
QUIET = 2 * RECENT  # a shift is reported when none of the histories up to this many runs shorter crossed
MODE_GAP = 2.0  # a shift this many scales or more may be a second mode of the history (``_known_mode``)
T3_UNITS_PER_SCALE = MAD_TO_SIGMA * 0.7649  # 1.4826·MAD of Student t(3) noise, in the units of its scale parameter


@dataclasses.dataclass(frozen=True)
class Shift:
    """A persistent shift found at the end of a history of counted values."""
    runs: int  #: how many of the last counted values are at the new level (the best window)
    size_in_scales: float  #: their mean deviation from the old median, in scales, worse positive (uncapped)
    centre: float  #: the old level: the median of the values before the last ``RECENT``
    scale: float  #: 1.4826·MAD of those
    statistic: float
    threshold: float


def shift_statistic(values: Sequence[float], worse: int) -> Optional[Tuple[float, int, float, float]]:
    """(S, best k, centre, scale) of the values' end (see the module), or None without ``MIN_BASE`` values
    before the last ``RECENT``, without spread, or when the last value is not worse than the centre (every
    window holds it, so S is 0; the scale, most of the cost, is then not computed: every stored value a seed
    steps asks this). ``worse`` is +1 when higher is worse, -1 when lower is."""
    base = values[:-RECENT]
    if len(base) < MIN_BASE:
        return None
    centre = median(base)
    if worse * (values[-1] - centre) <= 0:
        return None
    scale = robust_scale(base, centre)
    if not scale > 0 or not math.isfinite(scale):
        return None
    capped = [max(-CAP, min(CAP, worse * (value - centre) / scale)) for value in values[-RECENT:]]
    best, best_k = 0.0, 0
    for k in WINDOWS:
        if min(capped[-k:]) <= 0:
            break  # a new level is worse in every one of its runs; longer windows hold this run too
        statistic = math.fsum(capped[-k:]) / math.sqrt(k)
        if statistic > best:
            best, best_k = statistic, k
    return best, best_k, centre, scale


def find_shift(values: Sequence[float], worse: int, rate: float, noise: str = HEAVY_TAILED) -> Optional[Shift]:
    """The shift the end of ``values`` shows, when its statistic first crosses the threshold for ``rate``."""
    shift = level_at_end(values, worse, rate, noise)
    if shift is None:
        return None
    for shorter in range(1, QUIET + 1):
        earlier = shift_statistic(values[:-shorter], worse)
        if earlier is not None and earlier[0] > shift_threshold(len(values) - shorter - RECENT, rate, noise):
            return None  # already beyond a run ago: reported then
    return shift


def level_at_end(values: Sequence[float], worse: int, rate: float, noise: str = HEAVY_TAILED) -> Optional[Shift]:
    """The new level the end of ``values`` is at, while its statistic is beyond the threshold for ``rate``
    (``worse``: the direction looked for; ``noise``: the tails it is calibrated for), unless the history
    already holds it as a mode."""
    found = shift_statistic(values, worse)
    if found is None:
        return None
    statistic, runs, centre, scale = found
    threshold = shift_threshold(len(values) - RECENT, rate, noise)
    if statistic <= threshold:
        return None
    level = math.fsum(values[-runs:]) / runs
    size = worse * (level - centre) / scale
    if size >= MODE_GAP and _known_mode(values[:-RECENT], centre, level, worse, size):
        return None
    return Shift(runs, size, centre, scale, statistic, threshold)


def _known_mode(base: Sequence[float], centre: float, level: float, worse: int, size: float) -> bool:
    """Whether the history before the window already reached the window's ``level`` (``size`` scales from the
    ``centre``) often: runs that land on the slower of two machine types are a mode of the history, not a
    shift. Only asked of a shift of ``MODE_GAP`` scales or more. The base's values at least halfway from its
    centre to that level must be twice ``MODE_SHARE`` of it, and two standard deviations more than the
    heavy-tailed noise of one mode puts there (``_one_mode_share``): halfway to a level a few scales out, such
    noise alone reaches a fifth of a base often (2 scales: a healthy base of 30 values did in 32% of cases
    with normal noise and 38% with t3, and as many real 2σ shifts went unreported;
    ``tests/core/test_shifts.py``), while two machine types put far more there."""
    edge = (centre + level) / 2
    reached = sum(worse * (value - edge) >= 0 for value in base)
    n = len(base)
    tail = _one_mode_share(size / 2)
    return reached >= max(MODE_MIN_VALUES, 2 * MODE_SHARE * n, n * tail + 2 * math.sqrt(n * tail * (1 - tail)))


def _one_mode_share(scales: float) -> float:
    """The share of Student t(3) noise more than ``scales`` (1.4826·MAD) above its centre."""
    return t3_upper_tail(scales * T3_UNITS_PER_SCALE)


def shift_threshold(base: int, rate: float, noise: str = HEAVY_TAILED) -> float:
    """The statistic's threshold for ``base`` values before the window and a false-alert ``rate``, on t3 noise
    or, for ``noise`` ``"normal"``, on normal noise: linear in ln n and ln p between the calibrated cells, the
    nearest beyond them."""
    i0, i1, wn = grid_bracket(_LOG_BASE, math.log(base))
    j0, j1, wp = grid_bracket(_LOG_P, math.log(rate))
    table = calibration.NORMAL_SHIFT_THRESHOLDS if noise == NORMAL else calibration.SHIFT_THRESHOLDS
    low = table[i0][j0] * (1 - wp) + table[i0][j1] * wp
    high = table[i1][j0] * (1 - wp) + table[i1][j1] * wp
    return low * (1 - wn) + high * wn


_LOG_BASE = [math.log(n) for n in calibration.SHIFT_BASE_GRID]
_LOG_P = [math.log(p) for p in calibration.P_GRID]
