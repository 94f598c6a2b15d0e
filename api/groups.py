"""Which Raft group serves a request (issue 24).

A cluster runs G Raft groups; every queue lives in one, recorded in group
0's catalog (statemachine/catalog.py).  A front holds one engine per group
its node is a member of (``ENGINES``: group id -> ``RemoteNode``) and each
group's members' node ids, in order of preference for leadership (group 0's
record of them, else the placement; group 0 has every node, so its engine
knows every node's HTTP address).

``Groups`` answers "which group holds these queues":

- from its cache first, each name with the index of group 0's log its view
  was read at (its age);
- then from the local replica of group 0 (a read, no round trip to the
  leader);
- a name still unknown is new, or the local replica lags: for a request
  that may create a queue it is assigned through group 0's leader (an
  ``assign`` command), otherwise group 0's leader confirms it is unknown.
  When the local group-0 engine does not lead, the request is sent there
  (307, like any write a follower gets).

A placement holds until the queue is deleted and its name released from the
catalog (statemachine/release.py). A command that may make a queue carries
the age of the view that placed it (``view_index``); a group that released
the name since refuses it ``wrong_group`` with its fence, and a group that
lacks a queue says 404 with its fence: either way the front forgets what it
cached before the fence (``forget_before``), reads its replica of group 0
once that has reached the fence (``refresh``), and the request is routed
again. A front also drops its whole cache whenever its replica of group 0
has released names (the view's ``catalog_releases``), so that a front that
only passes a request on does not send it to the group its name left.

With G = 1 none of this runs: every queue is group 0's, as before issue 24.
"""

from __future__ import annotations

import asyncio

from raftq.engine.link.remote import RemoteNode

from .errors import ApiError

# Names a request may assign at once: a transaction's or a batch's queues.
MAX_ASSIGNED_TOGETHER = 10_000
# How long a front waits for its replica of group 0 to reach a group's fence
# before it routes by what the replica holds (a retry then finds it caught up).
REFRESH_WAIT_S = 2.0
REFRESH_POLL_S = 0.02


class Groups:
    def __init__(self, engines: dict[int, RemoteNode], placement=None):
        if 0 not in engines:
            raise ValueError("every node is a member of group 0, the catalog's")
        self.engines = engines
        # Group 0's engine, held for good as the application holds it: while the supervisor starts
        # it again (after a failed sync) it is out of `engines` and its calls fail as CommitError
        # (a retryable 503), where a lookup in `engines` failed as a KeyError (a 500).
        self._catalog = engines[0]
        self.placement = placement            # None: one group, of every node
        self.count = 1 if placement is None else len(placement.groups)
        self._assigned: dict[str, tuple[int, int]] = {}   # name -> (group, the view's index of group 0's log)
        self._releases_seen = 0

    @property
    def catalog(self) -> RemoteNode:
        """Group 0's local engine: the catalog, and every node's HTTP address."""
        return self._catalog

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
        if self.count == 1:
            return 0
        releases = self.catalog.view().get("catalog_releases", 0)
        if releases != self._releases_seen:   # a name may have left its group: look again
            self._assigned.clear()
            self._releases_seen = releases
        held = self._assigned.get(name)
        return None if held is None else held[0]

    def remember(self, assigned: dict, index: int) -> None:
        """Keep the placements of `assigned` (name -> group, None: not placed) as a view of the
        catalog at group 0's `index` showed them; a newer view's stays."""
        for name, group in assigned.items():
            held = self._assigned.get(name)
            if group is not None and (held is None or held[1] < index):
                self._assigned[name] = (group, index)

    def view_index(self, group: int, names: list[str]) -> int:
        """The age of the view that places every one of `names` in `group`: the oldest of their
        cached indexes (0, older than any fence, for a name cached elsewhere or not at all)."""
        ages = [held[1] if held is not None and held[0] == group else 0
                for held in map(self._assigned.get, names)]
        return min(ages, default=0)

    def forget_before(self, group: int, fence: int) -> set[str]:
        """Drop the placements in `group` seen before its `fence`: their names may have left it."""
        stale = {name for name, (held, index) in self._assigned.items() if held == group and index < fence}
        for name in stale:
            del self._assigned[name]
        return stale

    async def refresh(self, names: list[str], fence: int) -> None:
        """Read `names` from the local replica of the catalog once it has applied `fence` (or
        after REFRESH_WAIT_S), and cache what it holds."""
        deadline = asyncio.get_running_loop().time() + REFRESH_WAIT_S
        while True:
            read = await self.catalog.read("catalog_lookup", names)
            if read.applied_index >= fence or asyncio.get_running_loop().time() >= deadline:
                self.remember(read.result["groups"], read.applied_index)
                return
            await asyncio.sleep(REFRESH_POLL_S)

    async def local_lookup(self, names: list[str]) -> dict:
        """name -> group from the cache, then the local replica of the catalog (None: not there yet)."""
        found = {name: self.cached(name) for name in names}
        missing = [name for name, group in found.items() if group is None]
        if missing:
            read = await self.catalog.read("catalog_lookup", missing)
            self.remember(read.result["groups"], read.applied_index)
            found.update(read.result["groups"])
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
