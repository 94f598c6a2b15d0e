"""Which Raft group serves a request (issue 24).

A cluster runs G Raft groups; every queue lives in one, recorded in group
0's catalog (statemachine/catalog.py).  A front holds one engine per group
its node is a member of (``ENGINES``: group id -> ``RemoteNode``) and each
group's members' node ids, in order of preference for leadership (group 0's
record of them, else the placement; group 0 has every node, so its engine
knows every node's HTTP address).

``Groups`` answers "which group holds these queues":

- from its cache first: an assignment never changes, so a cached one is
  never wrong and is never dropped;
- then from the local replica of group 0 (a read, no round trip to the
  leader): a name found there is final too;
- a name still unknown is new, or the local replica lags: for a request
  that may create a queue it is assigned through group 0's leader (an
  ``assign`` command), otherwise group 0's leader confirms it is unknown.
  When the local group-0 engine does not lead, the request is sent there
  (307, like any write a follower gets).

With G = 1 none of this runs: every queue is group 0's, as before issue 24.
"""

from __future__ import annotations

from engine.link.remote import RemoteNode

from .errors import ApiError

# Names a request may assign at once: a transaction's or a batch's queues.
MAX_ASSIGNED_TOGETHER = 10_000


class Groups:
    def __init__(self, engines: dict[int, RemoteNode], placement=None):
        if 0 not in engines:
            raise ValueError("every node is a member of group 0, the catalog's")
        self.engines = engines
        self.placement = placement            # None: one group, of every node
        self.count = 1 if placement is None else len(placement.groups)
        self._assigned: dict[str, int] = {}

    @property
    def catalog(self) -> RemoteNode:
        """Group 0's local engine: the catalog, and every node's HTTP address."""
        return self.engines[0]

    def http_addr(self, node_id: str | None) -> str | None:
        return self.catalog.http_addr(node_id)

    def members(self, group: int) -> list[str]:
        """The node ids of `group`'s members, in its order of preference for leadership: group
        0's record of them (``engine.members``), pushed with its view; until the record is
        made, or for group 0, the placement."""
        if self.count == 1:   # every node: as the membership stands now (nodes may have been added)
            return sorted(self.catalog.view()["http"])
        recorded = self.recorded()
        if group > 0 and recorded is not None:
            return list(recorded["members"][group])
        return list(self.placement.groups[group])

    def recorded(self) -> dict | None:
        """Group 0's record of the other groups' members and the move in progress
        (``statemachine.catalog.Members.as_dict``); None until it is made, and with one group."""
        recorded = self.catalog.view().get("group_members")
        return recorded if recorded and recorded["members"] else None

    def cached(self, name: str) -> int | None:
        return 0 if self.count == 1 else self._assigned.get(name)

    def remember(self, assigned: dict) -> None:
        self._assigned.update((name, group) for name, group in assigned.items() if group is not None)

    async def local_lookup(self, names: list[str]) -> dict:
        """name -> group from the cache, then the local replica of the catalog (None: not there yet)."""
        found = {name: self.cached(name) for name in names}
        missing = [name for name, group in found.items() if group is None]
        if missing:
            looked_up = (await self.catalog.read("catalog_lookup", missing)).result["groups"]
            self.remember(looked_up)
            found.update(looked_up)
        return found

    def member_to_ask(self, group: int) -> str | None:
        """A node of `group` to send a request to when this node has no engine of it: its
        first preference that group 0's engine knows an address for."""
        for node_id in self.members(group):
            if self.http_addr(node_id) is not None:
                return node_id
        return None


def one_group(assigned: dict) -> int:
    """The one group of a request's queues; 409 cross_group naming them when they are several."""
    groups = sorted(set(assigned.values()))
    if len(groups) > 1:
        by_group = {g: sorted(name for name, held in assigned.items() if held == g) for g in groups}
        raise ApiError("cross_group", "one request writes to one Raft group; these queues live in groups "
                                      + ", ".join(f"{g} ({', '.join(names)})" for g, names in by_group.items()),
                       groups=groups)
    return groups[0]
