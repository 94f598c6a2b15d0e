"""engine/placement.py against its promises, for any cluster shape:
replicas spread within one, every group holds its members and group 0
every node, preferred leaders spread ⌈G/N⌉/⌊G/N⌋, and with any one node
down the first live preferences still spread within one (always where every
group has every node; in the shapes measured otherwise)."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.placement import place

shapes = st.integers(1, 9).flatmap(
    lambda nodes: st.tuples(st.just(nodes), st.integers(1, 64), st.integers(1, nodes)))


def node_ids(count: int) -> list[str]:
    return [f"n{i + 1}" for i in range(count)]


@settings(max_examples=300, deadline=None)
@given(shapes)
def test_each_group_has_its_members_and_group_0_every_node(shape):
    count, groups, replicas = shape
    nodes = node_ids(count)
    placement = place(nodes, groups, replicas)
    assert len(placement.groups) == groups
    assert sorted(placement.members(0)) == sorted(nodes)
    for group in range(1, groups):
        members = placement.members(group)
        assert len(members) == replicas == len(set(members)) and set(members) <= set(nodes)


@settings(max_examples=300, deadline=None)
@given(shapes)
def test_replicas_spread_within_one(shape):
    count, groups, replicas = shape
    nodes = node_ids(count)
    held = place(nodes, groups, replicas).held(nodes)
    assert max(held.values()) - min(held.values()) <= 1, held


@settings(max_examples=300, deadline=None)
@given(shapes)
def test_preferred_leaders_spread_ceil_or_floor_of_groups_per_node(shape):
    count, groups, replicas = shape
    nodes = node_ids(count)
    leads = place(nodes, groups, replicas).leads(set(nodes))
    assert set(leads.values()) <= {groups // count, math.ceil(groups / count)}, leads
    assert sum(leads.values()) == groups


def spread_with_one_down(placement, nodes: list[str]) -> int:
    """The widest spread of first live preferences over the live nodes, any one node down."""
    widest = 0
    for down in nodes:
        leads = placement.leads(set(nodes) - {down})
        widest = max(widest, max(leads.values()) - min(leads.values()))
    return widest


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 9).flatmap(lambda nodes: st.tuples(st.just(nodes), st.integers(1, 64))))
def test_with_one_node_down_first_live_preferences_spread_within_one_when_groups_span_every_node(shape):
    count, groups = shape
    nodes = node_ids(count)
    assert spread_with_one_down(place(nodes, groups, count), nodes) <= 1


def test_with_one_node_down_first_live_preferences_spread_within_one_in_the_usual_shapes():
    """3 nodes with any replicas, 5 nodes with 3 replicas, up to 64 groups.
    Not 5 nodes, 3 replicas, 4 groups: one node leads none, and to take
    over from whichever node is lost it would have to hold a replica of
    every group, twice its share; there the spread with a node down is 2."""
    for count, replicas in [(3, 1), (3, 2), (3, 3), (5, 3)]:
        nodes = node_ids(count)
        for groups in range(1, 65):
            if (count, replicas, groups) == (5, 3, 4):
                continue
            assert spread_with_one_down(place(nodes, groups, replicas), nodes) <= 1, (count, replicas, groups)


def test_placement_is_the_same_on_every_node():
    nodes = node_ids(5)
    assert place(nodes, 8, 3) == place(list(nodes), 8, 3)


def test_a_bad_shape_is_refused():
    import pytest
    for args in [([], 1, 1), (["a", "a"], 1, 1), (["a"], 0, 1), (["a", "b"], 2, 3), (["a"], 1, 0)]:
        with pytest.raises(ValueError):
            place(*args)
