"""The names of deleted queues leaving the catalog (statemachine/release.py), against a model
of routers with views of every age: however the releaser's three steps interleave with them,
no name is ever a queue in two groups, and every queue is where the catalog places it."""

import cbor2
from hypothesis import given, settings, strategies as st

from raftq.statemachine import StateMachine, is_error
from raftq.statemachine.release import release_refusal
from tests.older_snapshots import downgraded

T0 = 1_000_000
GROUPS = 2
NAMES = ["a", "b", "c"]


def apply(machine, op, **fields):
    return machine.apply({"op": op, "now_ms": T0, **fields})


class Cluster:
    """G machines; group 0's log index counted; the catalog as it stood at every index; and for
    each group RELEASERS releasers, each keeping what its last step learnt. In the cluster a
    group's releaser runs where its leader is, and a lead that moves away and back lets one
    carry out a step on what it learnt long before: here any releaser takes any step at any
    time."""

    def __init__(self):
        self.machines = [StateMachine(g, GROUPS) for g in range(GROUPS)]
        self.index0 = 0
        self.history = [{}]                    # the catalog after group 0's entry i
        self.to_release: dict[tuple, tuple] = {}    # (group, releaser) -> (names, fence) read as retiring
        self.to_finish: dict[tuple, tuple] = {}     # (group, releaser) -> (names, index) group 0 released
        self.states = [[self.retiring_state(g)] for g in range(GROUPS)]   # each group's, after each action

    def in_group0(self, op, **fields):
        self.index0 += 1
        result = self.machines[0].apply({"op": op, "now_ms": T0, **fields}, index=self.index0)
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

    def retire(self, group: int, releaser: int = 0, sweep: bool = False) -> None:
        """The releaser's first step: the names retiring in `group` (a releaser stopped between
        steps), or else those deleted there, or (a sweep) every name the catalog places there,
        made or not, of which the group retires those it neither holds nor names."""
        pending = self.machines[group].read("names_deleted", 10)
        if not pending["retiring"]:
            names = self.machines[0].read("catalog_names_in", group)["names"] if sweep else pending["names"]
            if not names:
                return
            pending = apply(self.machines[group], "retire_names", names=names)
        if pending["retiring"]:
            self.to_release[group, releaser] = (pending["retiring"], pending["fence"])

    def release(self, group: int, releaser: int = 0) -> None:
        """Step 2: group 0 releases them, or answers with its last release for the group, unfinished."""
        pending = self.to_release.pop((group, releaser), None)
        if pending is not None:
            answer = self.in_group0("release_names", group=group, names=pending[0], fence=pending[1])
            unfinished = answer.get("unfinished")
            self.to_finish[group, releaser] = \
                (unfinished["names"], unfinished["index"]) if unfinished else (pending[0], self.index0)

    def finish(self, group: int, releaser: int = 0) -> None:
        done = self.to_finish.pop((group, releaser), None)
        if done is not None:
            apply(self.machines[group], "names_released", names=done[0], index=done[1], in_turn=True)

    def retiring_state(self, group: int) -> tuple:
        release = self.machines[group].release
        return frozenset(release.retiring), release.fence

    def remember(self) -> None:
        for group in range(GROUPS):
            self.states[group].append(self.retiring_state(group))

    def forge(self, group: int, names: list, fence: int | None, age: int) -> None:
        """A release sent by hand (or by a releaser of any age) to group 0's leader, which checks
        it against a replica of the group `age` actions behind (api/catalog_release.py); `fence`
        None: that replica's. Nobody finishes it: the group's releasers are answered with it."""
        retiring, replica_fence = self.states[group][max(0, len(self.states[group]) - 1 - age)]
        fence = replica_fence if fence is None else fence
        seen = {"names": [name for name in names if name in retiring], "fence": replica_fence}
        if release_refusal(group, names, fence, seen) is None:
            self.in_group0("release_names", group=group, names=names, fence=fence)

    def cycle(self, group: int, releaser: int = 0) -> None:
        """The releaser's three steps in a row."""
        self.retire(group, releaser)
        self.release(group, releaser)
        self.finish(group, releaser)

    def step(self, group: int, releaser: int, sweep: bool) -> None:
        """The releaser's next step: it finishes what group 0 answered, or releases what it read,
        or reads (retires) afresh."""
        if (group, releaser) in self.to_finish:
            self.finish(group, releaser)
        elif (group, releaser) in self.to_release:
            self.release(group, releaser)
        else:
            self.retire(group, releaser, sweep)

    def check(self) -> None:
        catalog = self.machines[0].catalog.assigned
        for name in NAMES:
            holders = [g for g, machine in enumerate(self.machines) if name in machine.queues]
            assert len(holders) <= 1, (name, holders)
            assert not holders or catalog.get(name) == holders[0], (name, holders, catalog.get(name))


RELEASERS = 2
steps = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(NAMES), st.integers(0, 12)),
    st.tuples(st.just("delete"), st.sampled_from(NAMES)),
    st.tuples(st.just("step"), st.integers(0, GROUPS - 1), st.integers(0, RELEASERS - 1), st.booleans()),
    st.tuples(st.just("forge"), st.integers(0, GROUPS - 1), st.lists(st.sampled_from(NAMES), min_size=1, max_size=2),
              st.one_of(st.none(), st.integers(0, 30)), st.integers(0, 12)),
)


# At least 25 actions: a stale release needs a name made, deleted, retired, released by another
# releaser and made again before the stalled one takes its step, which short runs rarely hold.
@settings(max_examples=1000, deadline=None)
@given(st.lists(steps, min_size=25, max_size=60))
def test_no_router_however_stale_makes_a_released_name_a_queue_in_two_groups(actions):
    cluster = Cluster()
    for action in actions:
        getattr(cluster, action[0])(*action[1:])
        cluster.check()
        cluster.remember()


def test_a_releaser_that_stalled_between_its_steps_releases_nothing_made_again_since():
    """A lead that moved away and back: releaser 0 read `a` retiring, releaser 1 released it, and
    `a` was made again in the same group before releaser 0's release reached group 0."""
    cluster = Cluster()
    cluster.create("a", age=0)
    cluster.delete("a")
    cluster.retire(0, releaser=0)
    cluster.cycle(0, releaser=1)
    assert not is_error(cluster.create("a", age=0)) and "a" in cluster.machines[0].queues
    last = cluster.index0 - 1                               # releaser 1's release (then a's assign)
    cluster.release(0, releaser=0)                          # read before that release was finished
    assert cluster.machines[0].catalog.assigned["a"] == 0
    assert cluster.to_finish[0, 0] == (["a"], last)         # told to finish the last one instead
    cluster.finish(0, releaser=0)
    assert cluster.machines[0].release.fence == last and "a" in cluster.machines[0].queues
    cluster.check()


def test_a_late_finish_lets_no_name_retiring_again_go_while_the_catalog_still_places_it():
    cluster = Cluster()
    cluster.create("a", age=0)
    cluster.delete("a")
    cluster.cycle(0, releaser=0)
    stale = (["a"], cluster.machines[0].release.fence)
    cluster.create("a", age=0)
    cluster.delete("a")
    cluster.retire(0, releaser=1)                           # a retires again, placed here
    finished = apply(cluster.machines[0], "names_released", names=stale[0], index=stale[1], in_turn=True)
    assert finished == {"fence": stale[1], "finished": False}
    assert cluster.machines[0].release.retiring == {"a"}
    refused = cluster.create("a", age=0)
    assert refused["error"] == "wrong_group", refused


def test_a_release_of_the_release_before_is_taken_as_it_comes():
    """A releaser of the release before this one (issue 24's first) sends no fence: a cluster
    that still runs one applies its entries as that release did, on every replica."""
    machine = StateMachine(0, GROUPS)
    apply(machine, "assign", queues=["a", "b"])
    machine.apply({"op": "release_names", "now_ms": T0, "group": 0, "names": ["a"], "fence": 0}, index=5)
    assert machine.apply({"op": "release_names", "now_ms": T0, "group": 0, "names": ["b"]}) == {"released": ["b"]}
    assert machine.catalog.last_release == {0: (5, ["a"])}
    in_turn_without_index = apply(machine, "release_names", group=0, names=["c"], fence=9)
    assert in_turn_without_index["error"] == "bad_request"


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
    assert machine.read("names_deleted", 10) == {"names": [], "retiring": [], "fence": 0}   # dlq is still named
    # a name never made here may go: the catalog placed it for a creation this group refused
    assert apply(machine, "retire_names", names=["dlq", "gone", "never"]) == {"retiring": ["never"], "fence": 0}
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
    del version_12["name_release"], version_12["catalog_releases"], version_12["catalog_last_release"]
    older = StateMachine(1, GROUPS)
    older.restore(cbor2.dumps(version_12))
    assert older.release.to_state() == [[], [], 0] and older.catalog.releases == 0
    assert "x" not in older.queues


def test_a_snapshot_of_version_13_restores_with_no_release_taken_in_turn():
    catalog = StateMachine(0, GROUPS)
    apply(catalog, "assign", queues=["a"])
    catalog.apply({"op": "release_names", "now_ms": T0, "group": 0, "names": ["a"], "fence": 0}, index=4)
    restored = StateMachine(0, GROUPS)
    restored.restore(catalog.snapshot())
    assert restored.catalog.last_release == {0: (4, ["a"])} and restored.snapshot() == catalog.snapshot()
    version_13 = downgraded(catalog.snapshot(), 13)
    del version_13["catalog_last_release"]
    older = StateMachine(0, GROUPS)
    older.restore(cbor2.dumps(version_13))
    assert older.catalog.last_release == {} and older.catalog.releases == 1
