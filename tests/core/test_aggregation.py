"""A batch's aggregates are those of the definition, ties included, and do not depend on order or batching."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from core.aggregation import NO_STEP, TagAggregate
from core.parse import columns_by_tag
from core.stats import exact_units

# Few distinct values, times and steps, so that ties (and 0.0 against -0.0) are common.
points = st.lists(st.tuples(st.sampled_from([0.0, -0.0, 1.5, -2.0, 1e300, -1e-300, 7.25]),
                            st.sampled_from([1763596805.0, 1763596806.5, 1763596807.0]),
                            st.sampled_from([-1, 0, 3, 10])), min_size=1, max_size=30)


def by_definition(batch):
    """The aggregates exactly as TagAggregate's docstring defines them, one point at a time."""
    sign = lambda v: math.copysign(1.0, v)  # noqa: E731
    return TagAggregate(count=len(batch), units=sum(exact_units(v) for v, _, _ in batch),
                        min=min((v, sign(v), t, s) for v, t, s in batch),
                        max=max((v, sign(v), -t, -s) for v, t, s in batch),
                        final=max((t, s, v, sign(v)) for v, t, s in batch))


def of_batch(batch) -> TagAggregate:
    values, times, steps = (list(column) for column in zip(*batch))
    return TagAggregate.of_batch(values, times, steps)


@given(points)
def test_a_batch_gives_the_aggregates_of_the_definition(batch):
    assert repr(of_batch(batch)) == repr(by_definition(batch))


@given(points, st.randoms(use_true_random=False), st.integers(1, 5))
def test_any_order_and_batching_give_the_same_bits(batch, random, parts):
    shuffled = batch[:]
    random.shuffle(shuffled)
    cuts = sorted(random.randint(1, len(shuffled)) for _ in range(parts - 1))
    pieces = [shuffled[a:b] for a, b in zip([0, *cuts], [*cuts, len(shuffled)]) if shuffled[a:b]]
    merged = of_batch(pieces[0])
    for piece in pieces[1:]:
        merged.merge(of_batch(piece))
    assert repr(merged) == repr(of_batch(batch))


@given(points, points)
def test_a_merge_makes_a_new_aggregate_and_changes_neither(first, second):
    one, other = of_batch(first), of_batch(second)
    before = repr(one), repr(other)
    assert repr(one.merged(other)) == repr(of_batch(first + second))
    copy = one.copied()
    copy.merge(other)
    assert (repr(one), repr(other)) == before and repr(copy) == repr(of_batch(first + second))
    assert repr(one.copied()) == repr(one)


message_points = st.lists(st.tuples(st.sampled_from(["loss", "acc", "lr"]), st.sampled_from([0.5, -0.0, 2.0]),
                                    st.sampled_from([None, 0, 7]), st.sampled_from([1763596805.0, 1763596806.0])),
                          max_size=20).map(tuple)


@given(message_points, st.sets(st.sampled_from(["loss", "acc", "lr"])))
def test_a_message_splits_into_the_columns_of_each_tag_kept_in_order_of_appearance(points, ignored):
    expected = {}
    for tag, value, step, time in points:
        if tag not in ignored:
            columns = expected.setdefault(tag, ([], [], []))
            columns[0].append(value)
            columns[1].append(time)
            columns[2].append(NO_STEP if step is None else step)
    got = columns_by_tag(points, ignored)
    assert list(got) == list(expected) and repr(got) == repr(expected)
