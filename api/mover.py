"""The replica mover (issue 24, docs/architecture.md "Growing the cluster"): on the node
whose engine of group 0 leads, in its first front, it moves replicas of groups g > 0 one
at a time until they spread within one over group 0's voters that are not leaving
(``engine.placement.next_move``), and then lets leaving nodes leave group 0.

It runs in a front, not in group 0's engine, because a move is carried out by other
groups' leaders, anywhere in the cluster: the front has the HTTP client (with the
cluster's CA and the admin token) and a link to each local engine.

Group 0's record is the truth. Each step reads it and does what the record says is next,
checking the group's actual Raft membership, so a mover that stops anywhere (a crash, a
lost lead) is finished by the next group-0 leader's:
1. no move recorded: ask ``next_move``; record it (``replica_move``, a compare-and-set);
2. a move recorded (carried out in the step that records it): add its target to the group
   through the group's leader (a voter it has already counts as added; a group of one
   replica is added to by force, its one live voter of two being the only way its copy can
   move); the target's node starts the group's engine because the record names it
   (``engine.members.HeldGroupsReporter``);
3. wait until the target's match index reaches the commit index the leader had when the
   target was first seen a voter (snapshot install, then the log);
4. remove the source through the group's leader (a leader that is the source hands its
   lead over first; the removal is asked again of the next one; a source that is down is
   removed before the target is added), then ``replica_moved``;
   the source's node stops the group's engine because the record no longer names it.
A move whose target left group 0 meanwhile is undone: the target is removed from the
group and the move recorded ended without it.

``LeaderPreferences``, in every node's first front, gives the local engines' leader
balancing each group's order of preference as the record implies, the same on every node.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import ClientError, web

from raftq.engine.background import Background
from raftq.engine.outcome import CommitError
from raftq.engine.placement import Placement, next_move, ordered

from .group_calls import NotYet, call_group_leader
from .keys import GROUPS

log = logging.getLogger(__name__)

STEP_S = 0.5
# Between looks while nothing is to move: a move waits this long at most to begin, and an idle
# cluster's group-0 engine is asked for its voters this seldom.
IDLE_STEP_S = 2.0
LIVE_CONTACT_MS = 1000


class LeaderPreferences(Background):
    """Gives each local engine's leader balancing its group's order of preference for
    leadership as group 0's record stands: the placement's while every group keeps the
    members the cluster was made with, else ``engine.placement.ordered`` over the record's
    nodes. Every node derives it from the same record, so the replicas of a group agree on
    whom to hand leadership to (each keeping the members it started with would hand it back
    and forth). Runs on every node, in its first front."""

    def __init__(self, app: web.Application):
        self._app = app
        self._given: dict[int, tuple] = {}

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(STEP_S)
            try:
                await self.give()
            except CommitError as exc:    # an engine stopping as its group moved away
                log.info("leader preferences: %s; trying again", exc)

    async def give(self) -> None:
        groups = self._app[GROUPS]
        recorded = groups.recorded()
        if recorded is None:
            return
        preferences = preference_orders(groups.placement, recorded)
        for group, engine in list(groups.engines.items()):
            if self._given.get(group) != (engine, preferences[group]):   # an engine started anew is told too
                await engine.prefer(list(preferences[group]))
                self._given[group] = (engine, preferences[group])


def preference_orders(placement: Placement, recorded: dict) -> list[tuple[str, ...]]:
    """Each group's order of preference for leadership by group 0's `recorded` members."""
    members = {int(group): held for group, held in recorded["members"].items()}
    if all(set(members[group]) == set(placement.groups[group]) for group in members):
        return list(placement.groups)
    nodes = sorted({node_id for held in members.values() for node_id in held})
    return list(ordered(nodes, [nodes] + [members[group] for group in sorted(members)]).groups)


class ReplicaMover(Background):
    def __init__(self, app: web.Application):
        self._app = app
        self._caught_up_at: dict[tuple, int] = {}   # move -> the commit index its target must reach
        self._idle = False          # the last look found nothing to move

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(IDLE_STEP_S if self._idle else STEP_S)
            try:
                await self.step()
            except (NotYet, CommitError, ClientError, asyncio.TimeoutError) as exc:
                log.info("replica mover: %s; trying again", exc)
            except ValueError as exc:     # the record names more members than the nodes can hold
                log.error("replica mover: %s", exc)

    async def step(self) -> None:
        catalog = self._app[GROUPS].catalog
        self._idle = catalog.view()["role"] != "leader" or not await self._work_in_sight()
        if self._idle:
            return
        # settled: a leader new to its term may not yet have applied every committed move,
        # while the voters it reads below are already its log's
        recorded = (await catalog.read("group_members", settled=True)).result
        if not recorded["members"]:
            return
        voters = {voter["id"]: voter for voter in await catalog.members()}
        status = await catalog.status()
        live_ms = LIVE_CONTACT_MS + status.get("contact_slack_ms", 0)     # a quiet group's answers come further apart
        live = {catalog.id} | {node_id for node_id, peer in status["peers"].items()
                               if peer["last_contact_ms"] is not None and peer["last_contact_ms"] <= live_ms}
        members = {int(group): list(held) for group, held in recorded["members"].items()}
        if recorded["move"] is not None:
            await self._carry_out(tuple(recorded["move"]), members, voters, live)
            return
        if any(node_id not in live for node_id in voters if node_id not in recorded["leaving"]):
            return                        # a node that stays and is not heard from is neither a target nor emptied
        nodes = sorted(node_id for node_id in voters if node_id not in recorded["leaving"])
        move = next_move(nodes, [[]] + [members[group] for group in sorted(members)])
        if move is not None:
            await self._record({"op": "replica_move", "group": move.group, "source": move.source,
                                "target": move.target})
            log.info("group %d: moving its replica on %s to %s", move.group, move.source, move.target)
            await self._carry_out((move.group, move.source, move.target), members, voters, live)
            return
        for node_id in recorded["leaving"]:
            if node_id in voters:
                await call_group_leader(self._app, "DELETE", f"/v1/cluster/nodes/{node_id}")
                log.info("%s left group 0, its replicas moved away", node_id)

    async def _work_in_sight(self) -> bool:
        """Whether the record as group 0's engine last pushed it shows a move to make or carry on,
        or a node leaving. Each step's own read is confirmed by a majority (a round of appends);
        asked every STEP_S of a cluster with nothing to move, it kept group 0 from going quiet
        (engine.raft.quiet)."""
        groups = self._app[GROUPS]
        recorded = groups.recorded()
        if recorded is None:
            return False
        if recorded["move"] is not None or recorded["leaving"]:
            return True
        members = {int(group): list(held) for group, held in recorded["members"].items()}
        voters = sorted(voter["id"] for voter in await groups.catalog.members())
        return next_move(voters, [[]] + [members[group] for group in sorted(members)]) is not None

    async def _carry_out(self, move: tuple, members: dict, voters: dict, live: set) -> None:
        group, source, target = move
        if target not in voters:         # it left the cluster before the move ended
            await call_group_leader(self._app, "DELETE", f"/v1/cluster/nodes/{target}?group={group}", group=group)
            await self._record({"op": "replica_moved", "group": group, "source": source, "target": target,
                                "moved": False})
            return
        if source not in live:
            # A source that is down (a dead node being removed) leaves first: added first, the
            # target would be a fourth voter the group needs for its majority before it caught up.
            await call_group_leader(self._app, "DELETE", f"/v1/cluster/nodes/{source}?group={group}", group=group)
        voter = voters[target]
        # A group of one replica is one live voter of two until its target's engine answers: a
        # change a person is asked to force (api/cluster.py), and the only way to move its one copy.
        forced = "&force=true" if len(members[group]) == 1 else ""
        added = await call_group_leader(self._app, "POST", f"/v1/cluster/nodes?group={group}{forced}",
                                  {"id": target, "raft_addr": voter["raft_addr"], "http_addr": voter["http_addr"]},
                                  group=group)
        goal = self._caught_up_at.setdefault(move, added["commit_index"])
        if added["match_index"] < goal:
            raise NotYet(f"group {group}: {target} has caught up to {added['match_index']} of {goal}")
        await call_group_leader(self._app, "DELETE", f"/v1/cluster/nodes/{source}?group={group}", group=group)
        await self._record({"op": "replica_moved", "group": group, "source": source, "target": target,
                            "moved": True})
        self._caught_up_at.pop(move, None)
        log.info("group %d: its replica moved from %s to %s", group, source, target)

    async def _record(self, command: dict) -> None:
        result = (await self._app[GROUPS].catalog.apply(command)).result
        if "error" in result:
            raise NotYet(f"group 0 refused {command['op']}: {result['message']}")
