"""The catalog: which Raft group holds each queue (issue 24).

A cluster runs G Raft groups; group 0's state machine holds this catalog,
queue name -> group id.  A name is assigned once and kept until its queue
is deleted and its group lets it go (``release``, in three steps that fence
off fronts with an older view: release.py), so that a front with an old
cache can never send one queue's writes to two groups.

How a name is placed:

- names assigned together (one request: a transaction, a batch, a queue
  and the dead-letter queue its config names) go to one group, so that what
  one request writes stays in one log and a dead-letter queue lives in its
  queue's group;
- that group is the one of a name among them that already has one;
- otherwise the group with the fewest names assigned (ties: the lowest id),
  so one name at a time keeps every group within one of the mean.

Names already assigned to different groups cannot be assigned together:
the request spans groups and is refused ``cross_group``, naming them.

The catalog also records which nodes hold each group g > 0 (``Members``):
recorded once (``record``, the placement the cluster was made with), then
changed one replica at a time (``start_move``, ``end_move``) as the cluster
grows or shrinks (docs/architecture.md, "Growing the cluster"). Each change
names what it expects to find and is refused ``conflict`` otherwise, so a
deposed mover's late command changes nothing.
"""

from .results import CONFLICT, CROSS_GROUP, LIMIT_REACHED, NOT_FOUND, error


class Catalog:
    def __init__(self, group_count: int):
        self.group_count = group_count
        self.assigned: dict[str, int] = {}
        self.counts = [0] * group_count
        self.releases = 0     # entries that released names: a front drops what it cached when it rises
        # group -> (index, names) of the last release it took in turn: the next waits until the
        # group has finished this one (``release``)
        self.last_release: dict[int, tuple[int, list]] = {}

    def groups_of(self, names) -> dict:
        """name -> group id, or None for a name never assigned."""
        return {name: self.assigned.get(name) for name in names}

    def assign(self, names: list, max_names: int | None) -> dict:
        """Assign the unassigned of `names` together; every name's group, or a refusal."""
        wanted = list(dict.fromkeys(names))
        held = sorted({self.assigned[name] for name in wanted if name in self.assigned})
        if len(held) > 1:
            return error(CROSS_GROUP, f"these queues live in groups {held}: one request writes to one group",
                         groups=held)
        new = [name for name in wanted if name not in self.assigned]
        if new and max_names is not None and len(self.assigned) + len(new) > max_names:
            return error(LIMIT_REACHED, f"the catalog holds {len(self.assigned)} queue names and this would add "
                                        f"{len(new)} (limit {max_names}: --max-queues for each group; a "
                                        "deleted queue's name leaves it once its group released it)")
        group = held[0] if held else min(range(self.group_count), key=lambda g: (self.counts[g], g))
        for name in new:
            self.assigned[name] = group
            self.counts[group] += 1
        return {"groups": {name: self.assigned[name] for name in wanted}}

    def release(self, group: int, names: list, fence: int | None = None, index: int | None = None) -> dict:
        """Forget those of `names` placed in `group`, retiring there (release.py). A router's
        view tells its age by group 0's log index; this entry's `index` is the fence the group
        raises (``names_released``).

        With `fence`, the group's fence when its releaser read `names` as retiring, releases
        of a group are taken in turn: one whose reader had not seen the group finish the last
        release (``fence`` below that release's index) may be stale. Its names may have been
        released since, and made again in the group, so it releases nothing and answers with
        the last release, which the releaser finishes first. Without `fence` (a releaser of
        the release before, issue 24's first), every name is released as it comes."""
        wanted = list(dict.fromkeys(names))
        if fence is not None:
            last = self.last_release.get(group)
            if last is not None and fence < last[0]:
                return {"released": [], "unfinished": {"index": last[0], "names": last[1]}}
            self.last_release[group] = (index, wanted)
        released = [name for name in wanted if self.assigned.get(name) == group]
        for name in released:
            del self.assigned[name]
            self.counts[group] -= 1
        if released:
            self.releases += 1
        return {"released": released}

    def last_release_state(self) -> list:
        return [[group, index, names] for group, (index, names) in sorted(self.last_release.items())]

    def restore_last_release(self, state: list) -> None:
        self.last_release = {group: (index, names) for group, index, names in state}

    def to_state(self) -> list:
        return list(self.assigned.items())

    @classmethod
    def from_state(cls, group_count: int, state: list) -> "Catalog":
        catalog = cls(group_count)
        for name, group in state:
            catalog.assigned[name] = group
            catalog.counts[group] += 1
        return catalog


class Members:
    """Group g > 0 -> its members (node ids), the one move in progress, if any, and the nodes
    leaving the cluster (``raftq cluster remove``: their replicas move away before they leave
    group 0)."""

    def __init__(self, group_count: int):
        self.group_count = group_count
        self.groups: dict[int, list] = {}     # empty until recorded
        self.move: list | None = None         # [group, source, target] while one is in progress
        self.leaving: list[str] = []          # sorted

    def as_dict(self) -> dict:
        return {"members": {group: list(members) for group, members in self.groups.items()},
                "move": None if self.move is None else list(self.move), "leaving": list(self.leaving)}

    def start_leaving(self, node_id: str) -> dict:
        """Mark `node_id` as leaving: no move takes a replica to it, and its replicas move away."""
        if self.group_count == 1:
            return error(CONFLICT, "a cluster of one group has no replicas to move off a node")
        if node_id not in self.leaving:
            self.leaving = sorted([*self.leaving, node_id])
        return self.as_dict()

    def left(self, node_id: str) -> None:
        """`node_id` left group 0: it is no longer leaving."""
        if node_id in self.leaving:
            self.leaving = [other for other in self.leaving if other != node_id]

    def record(self, groups: list) -> dict:
        """Record every group's members (`groups[g - 1]` is group g's), once."""
        if self.group_count == 1:
            return error(CONFLICT, "a cluster of one group has no other group's members to record")
        if self.groups:
            return error(CONFLICT, "the groups' members are recorded already; they change by moves")
        if len(groups) != self.group_count - 1:
            return error(CONFLICT, f"give the members of the {self.group_count - 1} groups but group 0, "
                                   f"not of {len(groups)}")
        self.groups = {group: list(members) for group, members in enumerate(groups, start=1)}
        return self.as_dict()

    def start_move(self, group: int, source: str, target: str) -> dict:
        """Begin moving `group`'s replica from `source` to `target`: one move at a time."""
        problem = self._check_group(group)
        if problem:
            return problem
        if self.move is not None:
            return error(CONFLICT, f"group {self.move[0]}'s replica is moving from {self.move[1]} to "
                                   f"{self.move[2]}: one move at a time", move=list(self.move))
        members = self.groups[group]
        if source not in members or target in members:
            return error(CONFLICT, f"group {group}'s members are {', '.join(members)}: a move takes a member "
                                   "to a node that is not one", members=list(members))
        self.move = [group, source, target]
        return self.as_dict()

    def end_move(self, group: int, source: str, target: str, moved: bool) -> dict:
        """End the move in progress: `target` takes `source`'s place when `moved`,
        else the members stay as they were (the move was abandoned)."""
        if self.move != [group, source, target]:
            return error(CONFLICT, "that move is not the one in progress",
                         move=None if self.move is None else list(self.move))
        if moved:
            self.groups[group] = [target if member == source else member for member in self.groups[group]]
        self.move = None
        return self.as_dict()

    def _check_group(self, group: int) -> dict | None:
        if not self.groups:
            return error(CONFLICT, "the groups' members are not recorded yet")
        if group not in self.groups:
            return error(NOT_FOUND, f"group {group} is not one of groups 1 to {self.group_count - 1}")
        return None

    def to_state(self) -> list:
        return [[self.groups[group] for group in sorted(self.groups)], self.move, self.leaving]

    @classmethod
    def from_state(cls, group_count: int, state: list | None) -> "Members":
        members = cls(group_count)
        if state is not None:
            groups, members.move, members.leaving = state
            members.groups = {group: list(m) for group, m in enumerate(groups, start=1)}
        return members
