"""The names of deleted queues leaving the catalog (statemachine/release.py), against a model
of routers with views of every age: however the releaser's three steps interleave with them,
no name is ever a queue in two groups, and every queue is where the catalog places it."""

import cbor2
from hypothesis import given, settings, strategies as st

from statemachine import StateMachine, is_error
from tests.older_snapshots import downgraded

T0 = 1_000_000
GROUPS = 2
NAMES = ["a", "b", "c"]


def apply(machine, op, **fields):
    return machine.apply({"op": op, "now_ms": T0, **fields})


class Cluster:
    """G machines; group 0's log index counted; the catalog as it stood at every index."""

    def __init__(self):
        self.machines = [StateMachine(g, GROUPS) for g in range(GROUPS)]
        self.index0 = 0
        self.history = [{}]                    # the catalog after group 0's entry i
        self.retiring: dict[int, list] = {}    # group -> names its last retire took
        self.released: dict[int, tuple] = {}   # group -> (names, index) group 0 released

    def in_group0(self, op, **fields):
        result = apply(self.machines[0], op, **fields)
        self.index0 += 1
        self.history.append(dict(self.machines[0].catalog.assigned))
        return result

    def view(self, age: int) -> tuple[dict, int]:
        """The catalog as a replica `age` entries behind group 0's leader read it, and its index."""
        index = max(0, self.index0 - age)
        return self.history[index], index

    def create(self, name: str, age: int) -> dict:
        placed, index = self.view(age)
        group = placed.get(name)
        if group is None:       # unknown to the view: assigned through group 0's leader
            group = self.in_group0("assign", queues=[name])["groups"][name]
            index = self.index0
        return apply(self.machines[group], "create_queue", queue=name, config={}, raft_group=group,
                     catalog_index=index)

    def delete(self, name: str) -> None:
        for machine in self.machines:
            if name in machine.queues:
                apply(machine, "delete_queue", queue=name)

    def retire(self, group: int, sweep: bool = False) -> None:
        """The releaser's first step: the names deleted in `group`, or (a sweep) every name the
        catalog places there, made or not; the group retires those it neither holds nor names."""
        names = self.machines[0].read("catalog_names_in", group)["names"] if sweep \
            else self.machines[group].read("names_deleted", 10)["names"]
        if names and group not in self.retiring:
            self.retiring[group] = apply(self.machines[group], "retire_names", names=names)["retiring"]

    def release(self, group: int) -> None:
        names = self.retiring.pop(group, None)
        if names:
            self.in_group0("release_names", group=group, names=names)
            self.released[group] = (names, self.index0)

    def finish(self, group: int) -> None:
        done = self.released.pop(group, None)
        if done is not None:
            apply(self.machines[group], "names_released", names=done[0], index=done[1])

    def sweep(self, group: int) -> None:
        self.retire(group, sweep=True)

    def cycle(self, group: int) -> None:
        """The releaser's three steps in a row."""
        self.retire(group)
        self.release(group)
        self.finish(group)

    def check(self) -> None:
        catalog = self.machines[0].catalog.assigned
        for name in NAMES:
            holders = [g for g, machine in enumerate(self.machines) if name in machine.queues]
            assert len(holders) <= 1, (name, holders)
            assert not holders or catalog.get(name) == holders[0], (name, holders, catalog.get(name))


steps = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(NAMES), st.integers(0, 12)),
    st.tuples(st.just("delete"), st.sampled_from(NAMES)),
    st.tuples(st.sampled_from(["retire", "sweep", "release", "finish", "cycle"]), st.integers(0, GROUPS - 1)),
)


@settings(max_examples=1000, deadline=None)
@given(st.lists(steps, max_size=60))
def test_no_router_however_stale_makes_a_released_name_a_queue_in_two_groups(actions):
    cluster = Cluster()
    for action in actions:
        getattr(cluster, action[0])(*action[1:])
        cluster.check()


def test_a_name_released_from_its_group_is_placed_afresh_and_a_stale_router_is_sent_back():
    cluster = Cluster()
    apply_to = cluster.machines
    assert not is_error(cluster.create("a", age=0))               # a: group 0, the fewest names
    for name in ("b", "c"):
        cluster.create(name, age=0)                                # b: group 1, c: group 2
    cluster.delete("a")
    stale_index = cluster.index0
    cluster.retire(0)
    assert apply_to[0].release.retiring == {"a"}
    refused = cluster.create("a", age=0)                           # its group still places it: retiring
    assert refused["error"] == "wrong_group" and "leaving" in refused["message"]
    cluster.release(0)
    cluster.finish(0)
    assert "a" not in apply_to[0].catalog.assigned and apply_to[0].release.fence == cluster.index0
    old = apply(apply_to[0], "create_queue", queue="a", config={}, raft_group=0, catalog_index=stale_index)
    assert old["error"] == "wrong_group" and old["fence"] == cluster.index0
    cluster.create("b", age=0)
    assert apply(apply_to[1], "delete_queue", queue="b") == {"deleted": True}
    assert not is_error(cluster.create("a", age=0))                # placed again where fewest names are
    cluster.check()


def test_a_queue_made_again_while_its_name_retires_is_refused_so_the_catalog_never_loses_it():
    cluster = Cluster()
    cluster.create("a", age=0)
    cluster.delete("a")
    cluster.retire(0)
    refused = cluster.create("a", age=0)          # a fresh view still places it here
    assert refused["error"] == "wrong_group", refused
    cluster.release(0)
    cluster.check()


def test_a_name_still_named_as_a_dead_letter_queue_or_made_again_does_not_retire():
    machine = StateMachine(1, GROUPS)
    for name in ("q", "dlq", "gone"):
        apply(machine, "create_queue", queue=name, config={}, raft_group=1)
    assert "error" not in apply(machine, "patch_queue", queue="q", config={"dead_letter": "dlq"}, raft_group=1)
    for name in ("dlq", "gone"):
        apply(machine, "delete_queue", queue=name)
    apply(machine, "create_queue", queue="gone", config={}, raft_group=1)
    assert machine.read("names_deleted", 10) == {"names": [], "retiring": []}   # dlq is still named
    # a name never made here may go: the catalog placed it for a creation this group refused
    assert apply(machine, "retire_names", names=["dlq", "gone", "never"]) == {"retiring": ["never"]}
    assert machine.read("names_absent", ["q", "dlq", "gone", "never", "other"]) == {"names": ["never", "other"]}


def test_the_release_survives_a_snapshot():
    machine = StateMachine(1, GROUPS)
    for name in ("x", "y"):
        apply(machine, "create_queue", queue=name, config={}, raft_group=1)
        apply(machine, "delete_queue", queue=name)
    apply(machine, "retire_names", names=["x"])
    apply(machine, "names_released", names=["z"], index=7)
    restored = StateMachine(1, GROUPS)
    restored.restore(machine.snapshot())
    assert restored.release.to_state() == [["y"], ["x"], 7]
    assert restored.snapshot() == machine.snapshot()


def test_a_snapshot_of_version_12_restores_with_nothing_deleted_retiring_fenced_or_released():
    machine = StateMachine(1, GROUPS)
    apply(machine, "create_queue", queue="x", config={}, raft_group=1)
    apply(machine, "delete_queue", queue="x")
    apply(machine, "names_released", names=["y"], index=9)
    version_12 = downgraded(machine.snapshot(), 12)
    del version_12["name_release"], version_12["catalog_releases"]
    older = StateMachine(1, GROUPS)
    older.restore(cbor2.dumps(version_12))
    assert older.release.to_state() == [[], [], 0] and older.catalog.releases == 0
    assert "x" not in older.queues
