"""Raft groups in the state machine (issue 24): the catalog of queue -> group
that group 0 holds, and the refusal of a command routed to the wrong group.

The rules, one per test, then a property (Hypothesis): routing is total
(every valid name gets exactly one group, the same one forever), the
ownership refusal is the same on every replica and changes nothing, and one
name at a time keeps every group within one name of the mean.
"""

import cbor2
import pytest
from hypothesis import given, settings, strategies as st

from raftq.statemachine import StateMachine, is_error
from raftq.statemachine.machine import OPS

from tests.older_snapshots import downgraded

T0 = 1_000_000
CREATING = {   # one command of each op that may create a queue, now or (a dead-letter queue) later
    "create_queue": {"queue": "q", "config": {}},
    "patch_queue": {"queue": "q", "config": {"dead_letter": "dlq"}},
    "put": {"queue": "q", "messages": [{"body": "x"}]},
    "tx": {"put": [{"queue": "q", "messages": [{"body": "x"}]}]},
    "stage": {"producer": "p", "token": "t", "chunk": 0, "queue": "q", "messages": [{"body": "x"}]},
    "stage_commit": {"producer": "p", "batch": 0, "parts": [{"token": "t", "chunks": 1}]},
}


def apply(machine, op, **fields):
    return machine.apply({"op": op, "now_ms": T0, **fields})


def assign(machine, *names, max_names=None):
    result = apply(machine, "assign", queues=list(names), max_names=max_names)
    return result if is_error(result) else result["groups"]


# ---- the catalog ------------------------------------------------------------------------------

def test_names_go_to_the_group_with_fewest_names_ties_to_the_lowest_id():
    catalog = StateMachine(0, 3)
    assert [assign(catalog, name)[name] for name in ("a", "b", "c", "d", "e")] == [0, 1, 2, 0, 1]


def test_an_assignment_is_sticky_even_after_the_queue_is_deleted():
    catalog = StateMachine(0, 3)
    assert assign(catalog, "a") == {"a": 0}
    apply(catalog, "create_queue", queue="a", config={}, raft_group=0)
    assert apply(catalog, "delete_queue", queue="a") == {"deleted": True}
    assign(catalog, "b")
    assign(catalog, "c")
    assert assign(catalog, "a") == {"a": 0}
    assert catalog.read("catalog_lookup", ["a", "z"]) == {"groups": {"a": 0, "z": None}}


def test_a_dead_letter_queue_assigned_with_its_queue_joins_its_group():
    catalog = StateMachine(0, 4)
    assign(catalog, "x")
    assert assign(catalog, "q") == {"q": 1}
    assert assign(catalog, "dlq", "q") == {"dlq": 1, "q": 1}


def test_names_assigned_together_share_one_group_and_join_one_already_placed():
    catalog = StateMachine(0, 4)
    assert assign(catalog, "a") == {"a": 0}
    assert assign(catalog, "b", "c") == {"b": 1, "c": 1}
    assert assign(catalog, "d", "a") == {"d": 0, "a": 0}


def test_names_of_two_groups_cannot_be_assigned_together_and_nothing_changes():
    catalog = StateMachine(0, 4)
    assign(catalog, "a")
    assign(catalog, "b")
    before = catalog.snapshot()
    refused = assign(catalog, "a", "b", "new")
    assert refused["error"] == "cross_group" and refused["groups"] == [0, 1]
    assert catalog.snapshot() == before


def test_the_catalog_is_capped_and_a_refused_assignment_changes_nothing():
    catalog = StateMachine(0, 2)
    assign(catalog, "a", "b", max_names=3)
    before = catalog.snapshot()
    assert assign(catalog, "c", "d", max_names=3)["error"] == "limit_reached"
    assert catalog.snapshot() == before
    assert assign(catalog, "a", max_names=2) == {"a": 0}   # names already held need no room


def test_the_catalogs_usage_counts_every_name_placed_a_deleted_queues_too_per_group_and_in_all():
    catalog = StateMachine(0, 3)
    assert catalog.read("catalog_usage") == {"names": 0, "by_group": [0, 0, 0]}
    assign(catalog, "a")
    assign(catalog, "b", "c")
    apply(catalog, "create_queue", queue="a", config={}, raft_group=0)
    assert apply(catalog, "delete_queue", queue="a") == {"deleted": True}
    assign(catalog, "a")
    assert catalog.read("catalog_usage") == {"names": 3, "by_group": [1, 2, 0]}


def test_only_group_0_holds_the_catalog():
    assert assign(StateMachine(2, 4), "a")["error"] == "wrong_group"


def test_the_catalog_survives_a_snapshot():
    catalog = StateMachine(0, 4)
    assign(catalog, "a")
    assign(catalog, "b", "c")
    restored = StateMachine()
    restored.restore(catalog.snapshot())
    assert (restored.group_id, restored.group_count) == (0, 4)
    assert restored.read("list_catalog") == {"group_count": 4, "groups": {"a": 0, "b": 1, "c": 1}}
    assert assign(restored, "d") == {"d": 2}


@pytest.mark.parametrize("bad", [{"queues": []}, {"queues": ["a b"]}, {"queues": "a"}, {"queues": ["a"], "max_names": -1}, {"queues": ["a"] * 10_001}])
def test_a_malformed_assignment_is_refused(bad):
    assert apply(StateMachine(0, 2), "assign", **bad)["error"] == "bad_request"


# ---- each group's members (growing the cluster) -----------------------------------------------

PLACED = [["n1", "n2", "n3"], ["n2", "n3", "n1"], ["n3", "n1", "n2"]]   # groups 1..3 of 4


def members_of(machine) -> dict:
    return machine.read("group_members")


def test_members_are_recorded_once_then_change_one_move_at_a_time():
    catalog = StateMachine(0, 4)
    assert members_of(catalog) == {"members": {}, "move": None, "leaving": []}
    assert apply(catalog, "record_members", groups=PLACED)["members"][2] == ["n2", "n3", "n1"]
    assert apply(catalog, "record_members", groups=PLACED)["error"] == "conflict"
    assert apply(catalog, "replica_move", group=2, source="n1", target="n4")["move"] == [2, "n1", "n4"]
    refused = apply(catalog, "replica_move", group=3, source="n1", target="n5")
    assert refused["error"] == "conflict" and refused["move"] == [2, "n1", "n4"]
    assert apply(catalog, "replica_moved", group=2, source="n1", target="n5", moved=True)["error"] == "conflict"
    after = apply(catalog, "replica_moved", group=2, source="n1", target="n4", moved=True)
    assert after == {"members": {1: PLACED[0], 2: ["n2", "n3", "n4"], 3: PLACED[2]}, "move": None, "leaving": []}
    assert members_of(catalog) == after


def test_an_abandoned_move_leaves_the_members_as_they_were():
    catalog = StateMachine(0, 4)
    apply(catalog, "record_members", groups=PLACED)
    apply(catalog, "replica_move", group=1, source="n1", target="n4")
    assert apply(catalog, "replica_moved", group=1, source="n1", target="n4", moved=False) == \
        {"members": {1: PLACED[0], 2: PLACED[1], 3: PLACED[2]}, "move": None, "leaving": []}


def test_a_node_leaving_is_recorded_once_survives_a_snapshot_and_is_no_longer_once_it_left():
    catalog = StateMachine(0, 4)
    apply(catalog, "record_members", groups=PLACED)
    apply(catalog, "set_member", id="n4", raft_addr="127.0.0.1:7004", http_addr="127.0.0.1:8004")
    assert apply(catalog, "node_leaving", id="n4")["leaving"] == ["n4"]
    assert apply(catalog, "node_leaving", id="n1")["leaving"] == ["n1", "n4"]
    assert apply(catalog, "node_leaving", id="n4")["leaving"] == ["n1", "n4"]
    restored = StateMachine()
    restored.restore(catalog.snapshot())
    assert members_of(restored) == members_of(catalog)
    apply(catalog, "remove_member", id="n4")
    assert members_of(catalog)["leaving"] == ["n1"]
    apply(catalog, "remove_member", id="n1")            # a node of cluster.toml: no addresses recorded
    assert members_of(catalog)["leaving"] == []


def test_a_node_leaving_with_one_group_elsewhere_than_group_0_or_without_an_id_is_refused():
    assert apply(StateMachine(0, 1), "node_leaving", id="n1")["error"] == "conflict"
    assert apply(StateMachine(1, 4), "node_leaving", id="n1")["error"] == "wrong_group"
    assert apply(StateMachine(0, 4), "node_leaving", id="a b")["error"] == "bad_request"
    assert apply(StateMachine(0, 4), "node_leaving")["error"] == "bad_request"


@pytest.mark.parametrize("op, fields", [
    ("record_members", {"groups": PLACED[:2]}),                                  # three groups to record
    ("replica_move", {"group": 4, "source": "n1", "target": "n4"}),              # no group 4 of 4
    ("replica_move", {"group": 1, "source": "n4", "target": "n5"}),              # n4 is not a member
    ("replica_move", {"group": 1, "source": "n1", "target": "n2"}),              # n2 already is
    ("replica_moved", {"group": 1, "source": "n1", "target": "n4", "moved": True}),   # no move in progress
])
def test_a_change_that_does_not_fit_the_record_is_refused_and_changes_nothing(op, fields):
    catalog = StateMachine(0, 4)
    apply(catalog, "tick")    # the log time the refused command carries, so that only it could differ
    if op != "record_members":
        apply(catalog, "record_members", groups=PLACED)
    before = catalog.snapshot()
    assert apply(catalog, op, **fields)["error"] in ("conflict", "not_found")
    assert catalog.snapshot() == before


def test_a_move_before_the_members_are_recorded_or_with_one_group_is_refused():
    assert apply(StateMachine(0, 4), "replica_move", group=1, source="n1", target="n4")["error"] == "conflict"
    assert apply(StateMachine(0, 1), "record_members", groups=[["n1"]])["error"] == "conflict"


def test_only_group_0_records_members():
    assert apply(StateMachine(1, 4), "record_members", groups=PLACED)["error"] == "wrong_group"
    assert apply(StateMachine(1, 4), "replica_move", group=1, source="n1", target="n4")["error"] == "wrong_group"


@pytest.mark.parametrize("op, fields", [
    ("record_members", {"groups": []}), ("record_members", {"groups": [["n1", "n1"]]}),
    ("record_members", {"groups": [[]]}), ("record_members", {"groups": [["a b"]]}),
    ("replica_move", {"group": 0, "source": "n1", "target": "n4"}),
    ("replica_move", {"group": "1", "source": "n1", "target": "n4"}),
    ("replica_move", {"group": 1, "source": "n1", "target": "n1"}),
    ("replica_move", {"group": 1, "source": "n1"}),
    ("replica_moved", {"group": 1, "source": "n1", "target": "n4"}),
])
def test_a_malformed_change_of_members_is_refused(op, fields):
    assert apply(StateMachine(0, 4), op, **fields)["error"] == "bad_request"


def test_the_members_and_the_move_survive_a_snapshot_and_a_version_10_one_has_none():
    catalog = StateMachine(0, 4)
    apply(catalog, "record_members", groups=PLACED)
    apply(catalog, "replica_move", group=3, source="n2", target="n5")
    restored = StateMachine()
    restored.restore(catalog.snapshot())
    assert members_of(restored) == members_of(catalog)
    state = downgraded(catalog.snapshot(), 10)
    del state["group_members"]
    restored.restore(cbor2.dumps(state))
    assert members_of(restored) == {"members": {}, "move": None, "leaving": []}


# ---- ownership -------------------------------------------------------------------------------

@pytest.mark.parametrize("op", sorted(CREATING))
def test_with_several_groups_a_command_that_may_create_a_queue_must_name_this_group(op):
    machine = StateMachine(1, 4)
    for routed_for in (None, 0, 2):
        before = machine.snapshot()
        refused = apply(machine, op, **CREATING[op], **({} if routed_for is None else {"raft_group": routed_for}))
        assert refused["error"] == "wrong_group" and refused["group"] == 1
        assert machine.snapshot() == before
    assert apply(machine, op, **CREATING[op], raft_group=1).get("error") != "wrong_group"


def test_the_ops_that_must_name_their_group_are_those_that_may_create_a_queue():
    assert {name for name, op in OPS.items() if op.creates_queues} == set(CREATING)


def test_a_command_for_a_queue_this_group_does_not_hold_is_not_found_as_before():
    machine = StateMachine(1, 4)
    assert apply(machine, "receive", queue="elsewhere", group="default", max=1)["error"] == "not_found"
    assert apply(machine, "delete_queue", queue="elsewhere")["error"] == "not_found"


def test_one_group_needs_no_stamp_as_before():
    machine = StateMachine()
    assert apply(machine, "put", queue="q", messages=[{"body": 1}])["messages"][0]["seq"] == 1


def test_a_raft_group_that_is_not_a_group_id_is_malformed():
    assert apply(StateMachine(0, 2), "put", queue="q", messages=[{"body": 1}], raft_group="0")["error"] == \
        "bad_request"


def test_a_version_8_snapshot_restores_as_group_0_of_1():
    machine = StateMachine()
    apply(machine, "put", queue="q", messages=[{"body": 1}])
    state = downgraded(machine.snapshot(), 8)
    for field in ("group_id", "group_count", "catalog", "group_members"):
        del state[field]
    restored = StateMachine(3, 4)
    restored.restore(cbor2.dumps(state))
    assert (restored.group_id, restored.group_count) == (0, 1)
    assert restored.snapshot() == machine.snapshot()


def test_a_machine_is_one_of_its_groups():
    with pytest.raises(ValueError):
        StateMachine(4, 4)


# ---- properties -------------------------------------------------------------------------------

names = st.from_regex(r"[a-z][a-z0-9_.-]{0,8}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(group_count=st.integers(1, 9), requests=st.lists(st.lists(names, min_size=1, max_size=3), max_size=40))
def test_routing_is_total_and_an_assignment_never_changes(group_count, requests):
    catalog = StateMachine(0, group_count)
    seen = {}
    for request in requests:
        result = assign(catalog, *request)
        if is_error(result):   # a request across groups: refused, every name kept where it was
            assert result["error"] == "cross_group"
            assert len({seen[name] for name in request if name in seen}) > 1
            continue
        assert set(result) == set(request) and len(set(result.values())) == 1
        for name, group in result.items():
            assert 0 <= group < group_count and seen.setdefault(name, group) == group
    assert catalog.read("list_catalog")["groups"] == seen


@settings(max_examples=200, deadline=None)
@given(group_count=st.integers(1, 9), requests=st.lists(names, max_size=60))
def test_one_name_at_a_time_keeps_every_group_within_one_of_the_mean(group_count, requests):
    catalog = StateMachine(0, group_count)
    for name in requests:
        assign(catalog, name)
        counts = [list(catalog.read("list_catalog")["groups"].values()).count(g) for g in range(group_count)]
        assert max(counts) - min(counts) <= 1


@settings(max_examples=200, deadline=None)
@given(group_count=st.integers(2, 6), data=st.data())
def test_the_ownership_refusal_is_the_same_on_every_replica(group_count, data):
    group_id = data.draw(st.integers(0, group_count - 1))
    replicas = [StateMachine(group_id, group_count) for _ in range(2)]
    for _ in range(data.draw(st.integers(1, 12))):
        op = data.draw(st.sampled_from(sorted(CREATING)))
        routed_for = data.draw(st.one_of(st.none(), st.integers(0, group_count)))
        cmd = {"op": op, "now_ms": T0, **CREATING[op], **({} if routed_for is None else {"raft_group": routed_for})}
        before = replicas[0].snapshot()
        results = [replica.apply(dict(cmd)) for replica in replicas]
        assert results[0] == results[1]
        assert (results[0].get("error") == "wrong_group") == (routed_for != group_id)
        if routed_for != group_id:
            assert replicas[0].snapshot() == before
        assert replicas[0].snapshot() == replicas[1].snapshot()
