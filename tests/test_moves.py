"""engine/placement.py's move planner (`next_move`) against its promises:
walking its moves one at a time from any placement to any node set ends
with every group on the given nodes, R distinct members each, replicas
spread within one; growing, no node both gains and loses replicas (no move
is wasted), and any change takes at most twice the replicas that change
node; each step changes one member of one group; and the same question
gets the same answer. Growing 3 nodes to 5 and shrinking back, as
tests/test_growth.py does with real processes."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftq.engine.placement import Move, moved, next_move, ordered, place


def node_ids(count: int, first: int = 1) -> list[str]:
    return [f"n{i}" for i in range(first, first + count)]


def walk(nodes: list[str], members) -> tuple[list[tuple[str, ...]], list[Move]]:
    """Every move the planner asks for, done in turn: the final members and the moves."""
    members = [tuple(m) for m in members]
    moves = []
    while (move := next_move(nodes, members)) is not None:
        before = members
        members = moved(members, move)
        changed = [g for g in range(len(members)) if members[g] != before[g]]
        assert changed == [move.group] and move.group > 0
        assert move.source in before[move.group] and move.target not in before[move.group]
        assert move.target in nodes
        moves.append(move)
        assert len(moves) <= sum(len(m) for m in members), "the planner does not converge"
    return members, moves


def held(nodes, members) -> dict[str, int]:
    counts = {node_id: 0 for node_id in nodes}
    for group_members in members[1:]:
        for member in group_members:
            counts[member] = counts.get(member, 0) + 1
    return counts


def check_final(nodes, members, replicas):
    for group_members in members[1:]:
        assert len(group_members) == replicas == len(set(group_members)) and set(group_members) <= set(nodes)
    counts = held(nodes, members)
    assert set(counts) == set(nodes)
    assert max(counts.values()) - min(counts.values()) <= 1, counts


# (nodes before, nodes after, groups, replicas): replicas at most either node count
changes = st.tuples(st.integers(1, 8), st.integers(1, 8)).flatmap(
    lambda counts: st.tuples(st.just(counts[0]), st.just(counts[1]), st.integers(1, 32),
                             st.integers(1, min(counts))))


@settings(max_examples=300, deadline=None)
@given(changes, st.integers(0, 8))
def test_moves_end_on_the_new_nodes_spread_within_one_and_waste_none_growing(change, kept):
    before_count, after_count, groups, replicas = change
    before = node_ids(before_count)
    # the new node set keeps up to `kept` of the old nodes and adds new ones
    after = before[:min(kept, after_count)]
    after += node_ids(after_count - len(after), first=before_count + 1)
    start = place(before, groups, replicas).groups
    final, moves = walk(after, start)
    check_final(after, final, replicas)
    initial, ending = held(after, start), held(after, final)
    changed_node = sum(max(0, initial.get(n, 0) - ending.get(n, 0)) for n in set(initial) | set(ending))
    assert len(moves) <= 2 * changed_node
    if set(after) >= set(before):
        assert not {m.target for m in moves} & {m.source for m in moves}, "a node both gained and lost replicas"
        assert len(moves) == changed_node


def test_growing_3_nodes_to_5_and_shrinking_back():
    three, five = node_ids(3), node_ids(5)
    start = place(three, 4, 3).groups
    grown, moves = walk(five, start)
    check_final(five, grown, 3)
    # 9 replicas of groups 1..3 (3 on each old node) over 5 nodes: 2, 2, 2, 2, 1, so three move
    assert len(moves) == 3 and sorted(held(five, grown).values()) == [1, 2, 2, 2, 2]
    shrunk, moves = walk(three, grown)
    check_final(three, shrunk, 3)
    assert {m.source for m in moves} == {"n4", "n5"} and len(moves) == 3


def test_a_placed_cluster_needs_no_move():
    for count, groups, replicas in [(1, 1, 1), (3, 4, 3), (5, 8, 3), (5, 4, 3), (7, 64, 2)]:
        nodes = node_ids(count)
        assert next_move(nodes, place(nodes, groups, replicas).groups) is None


def test_the_same_question_gets_the_same_answer():
    start = place(node_ids(3), 8, 3).groups
    assert next_move(node_ids(5), start) == next_move(list(node_ids(5)), [list(m) for m in start])


def test_fewer_nodes_than_a_group_has_members_is_refused():
    start = place(node_ids(3), 4, 3).groups
    with pytest.raises(ValueError, match="cannot hold"):
        next_move(node_ids(2), start)
    with pytest.raises(ValueError, match="distinct"):
        next_move(["n1", "n1", "n2"], start)


@settings(max_examples=200, deadline=None)
@given(st.integers(3, 7), st.integers(1, 32))
def test_preferred_leaders_of_moved_groups_spread_ceil_or_floor(count, groups):
    """Once moves are done, ``ordered`` puts each group's members in an order
    of preference that spreads the groups' preferred leaders as ``place`` does."""
    final, _ = walk(node_ids(count), place(node_ids(3), groups, 3).groups)
    placement = ordered(node_ids(count), [node_ids(count)] + list(final[1:]))
    for group in range(groups):
        assert sorted(placement.members(group)) == sorted(node_ids(count) if group == 0 else final[group])
    leads = placement.leads(set(node_ids(count)))
    assert set(leads.values()) <= {groups // count, math.ceil(groups / count)}, leads


def test_a_node_holds_the_groups_the_record_names_it_in_and_a_moves_target_holds_its_group_too():
    """engine/members.py's `held_groups`: what a node's supervisor runs an engine of, by group 0's
    record; during a move both source and target run the group, the target with the members plus itself."""
    from raftq.engine.members import held_groups

    recorded = {"members": {1: ["n1", "n2", "n3"], 2: ["n2", "n3", "n4"], 3: ["n3", "n4", "n1"]}, "move": None,
                "leaving": []}
    assert held_groups(recorded, "n1") == {1: ["n1", "n2", "n3"], 3: ["n3", "n4", "n1"]}
    assert held_groups(recorded, "n5") == {}
    moving = {**recorded, "move": [2, "n2", "n5"]}
    assert held_groups(moving, "n5") == {2: ["n2", "n3", "n4", "n5"]}
    assert held_groups(moving, "n2") == {1: ["n1", "n2", "n3"], 2: ["n2", "n3", "n4", "n5"]}
    assert held_groups(moving, "n1") == held_groups(recorded, "n1")
    done = {"members": {**recorded["members"], 2: ["n5", "n3", "n4"]}, "move": None, "leaving": []}
    assert 2 not in held_groups(done, "n2") and held_groups(done, "n5") == {2: ["n5", "n3", "n4"]}


def test_each_groups_preference_is_the_placements_until_a_replica_moves_then_the_records():
    """api/mover.py's `preference_orders`: what every node gives its engines' leader balancing,
    from group 0's record alone, so that a group's replicas agree whom to hand leadership to."""
    from raftq.api.mover import preference_orders

    placement = place(node_ids(3), 4, 3)
    recorded = {"members": {g: list(reversed(placement.groups[g])) for g in (1, 2, 3)}, "move": None,
                "leaving": []}
    assert preference_orders(placement, recorded) == list(placement.groups)
    grown, _ = walk(node_ids(5), placement.groups)
    recorded = {"members": {g: list(grown[g]) for g in (1, 2, 3)}, "move": None, "leaving": []}
    orders = preference_orders(placement, recorded)
    assert orders == list(ordered(node_ids(5), [node_ids(5)] + [grown[g] for g in (1, 2, 3)]).groups)
    assert [set(order) for order in orders[1:]] == [set(grown[g]) for g in (1, 2, 3)]
    leads = [order[0] for order in orders]
    assert max(map(leads.count, node_ids(5))) == 1        # four groups over five nodes: one each at most
