"""The windows of a distributed run's ranks: combined per index, and stragglers found among them."""

import itertools
import random

import pytest

from core.config import RankCheck, SuccessCondition, TagWindowConfig
from core.rank_windows import RankWindows, add_rank_window, close_rank_windows
from core.windows import WindowResult, WindowSpec
from tests.support import T0

STEP_TIME = SuccessCondition("less", mads_from_median=5, min_effect_rel=0.1)
CHECKED = TagWindowConfig(WindowSpec(count=10), rank_check=RankCheck("mean", STEP_TIME, 3, 2))
PLAIN = TagWindowConfig(WindowSpec(count=10))


def window(rank, index, mean, world_size=4, host=None):
    return WindowResult("t", "r", "step_time", "count", index, T0 + 10 * index + rank * 0.1,
                        T0 + 10 * index + 9 + rank * 0.1, 10 * index, 10 * index + 9, 10, False,
                        {"mean": mean, "max": mean * 1.1}, rank, world_size, host or f"host-{rank}")


def feed(windows, config=CHECKED, reduction="mean", state=None):
    state = state or RankWindows()
    combined, alerts = [], []
    for w in sorted(windows, key=lambda w: w.order):
        more, raised = add_rank_window(state, w, config, reduction)
        combined += more
        alerts += raised
    more, raised = close_rank_windows(state, config, reduction, T0 + 3600)
    assert state.ended_at == T0 + 3600
    return combined + more, alerts + raised


def steady(rank, index):
    return 1.0 + 0.01 * ((rank * 3 + index) % 4)


def test_each_index_combines_once_every_rank_has_its_window():
    state = RankWindows()
    assert add_rank_window(state, window(0, 0, 1.0), PLAIN, "mean") == ([], [])
    for rank in (1, 2):
        add_rank_window(state, window(rank, 0, 1.0 + rank), PLAIN, "mean")
    [run_window], _ = add_rank_window(state, window(3, 0, 4.0), PLAIN, "mean")
    assert run_window.rank is None and run_window.values["mean"] == 2.5 and run_window.values["max"] == pytest.approx(2.75)
    assert run_window.n == 40 and run_window.start_time == T0 and run_window.end_time == T0 + 9.3


@pytest.mark.parametrize("reduction, expected", [("rank0", 1.0), ("min", 1.0), ("max", 4.0), ("mean", 2.5)])
def test_aggregations_are_reduced_as_the_tag_says(reduction, expected):
    combined, _ = feed([window(rank, 0, 1.0 + rank) for rank in range(4)], PLAIN, reduction)
    assert combined[0].values["mean"] == expected


def test_a_slow_rank_is_a_straggler_once_two_of_its_last_three_windows_are_out_of_line():
    windows = [window(rank, i, steady(rank, i) * (1.5 if rank == 2 and i in (3, 5, 6, 7) else 1.0))
               for rank, i in itertools.product(range(4), range(10))]
    combined, alerts = feed(windows)
    assert len(combined) == 10
    [alert] = alerts
    assert alert.kind == "rank_straggler" and alert.details["rank"] == 2 and alert.details["host"] == "host-2"
    assert alert.details["window"]["index"] == 5 and "rank 2 on host-2 is a straggler" in alert.message
    assert alert.metric == "step_time_mean" and alert.upper_bound < alert.value


def test_healthy_ranks_and_a_single_slow_window_raise_nothing():
    windows = [window(rank, i, steady(rank, i) * (1.5 if (rank, i) == (1, 4) else 1.0))
               for rank, i in itertools.product(range(4), range(10))]
    assert feed(windows)[1] == []


def test_a_rank_that_never_sends_a_window_is_combined_without_at_the_run_s_end():
    windows = [window(rank, i, 1.0) for rank, i in itertools.product(range(3), range(2))]
    combined, _ = feed(windows)
    assert [w.index for w in combined] == [0, 1] and all(w.n == 30 for w in combined)


def test_the_outcome_does_not_depend_on_the_order_ranks_report_in():
    windows = [window(rank, i, steady(rank, i) * (1.5 if rank == 3 and i > 4 else 1.0))
               for rank, i in itertools.product(range(4), range(10))]
    expected = feed(windows)
    for seed in range(5):
        shuffled = list(windows)
        random.Random(seed).shuffle(shuffled)
        assert feed(shuffled) == expected
