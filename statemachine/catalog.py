"""The catalog: which Raft group holds each queue (issue 24).

A cluster runs G Raft groups; group 0's state machine holds this catalog,
queue name -> group id.  A name is assigned once and kept forever, even
after its queue is deleted, so that a front with an old cache can never send
one queue's writes to two groups.

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
"""

from .results import CROSS_GROUP, LIMIT_REACHED, error


class Catalog:
    def __init__(self, group_count: int):
        self.group_count = group_count
        self.assigned: dict[str, int] = {}
        self.counts = [0] * group_count

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
                                        f"{len(new)} (limit {max_names}: --max-queues for each group)")
        group = held[0] if held else min(range(self.group_count), key=lambda g: (self.counts[g], g))
        for name in new:
            self.assigned[name] = group
            self.counts[group] += 1
        return {"groups": {name: self.assigned[name] for name in wanted}}

    def to_state(self) -> list:
        return list(self.assigned.items())

    @classmethod
    def from_state(cls, group_count: int, state: list) -> "Catalog":
        catalog = cls(group_count)
        for name, group in state:
            catalog.assigned[name] = group
            catalog.counts[group] += 1
        return catalog
