"""Group 0's record of each other group's members (``statemachine.catalog.Members``),
as the engine of group 0's leader keeps it.

A cluster of several groups records once, through group 0's log, the
members the placement of its ``cluster.toml`` gives each group (the members
its engines started with, and that ``group-<g>/members`` holds on each of
them); from then on routing reads the record, and the record alone changes
as replicas move (docs/architecture.md, "Growing the cluster").
``MemberRecorder`` checks every ``CHECK_S`` while this engine leads group 0
and the record is empty, so a leader lost before its command committed is
followed by one that records it; a second record is refused ``conflict``
by the state machine, the same on every replica.
"""

from __future__ import annotations

import asyncio
import logging

from .background import Background
from .outcome import CommitError
from .placement import Placement

logger = logging.getLogger(__name__)

CHECK_S = 1.0


class MemberRecorder(Background):
    """Records `placement`'s members of groups 1..G-1 in group 0's catalog, once (`node`: group 0's engine)."""

    def __init__(self, node, placement: Placement):
        if node.group != 0 or len(placement.groups) < 2:
            raise ValueError("group 0's engine of a cluster of several groups records their members")
        self._node = node
        self._groups = [list(members) for members in placement.groups[1:]]

    async def _run(self) -> None:
        while not self._node.read("group_members")["members"]:
            if self._node.is_leader():
                try:
                    result = (await self._node.submit({"op": "record_members", "groups": self._groups})).result
                    if "error" in result:
                        logger.info("group members not recorded: %s", result["message"])
                except CommitError as exc:
                    logger.info("group members not recorded (%s); trying again", exc.code)
            await asyncio.sleep(CHECK_S)


def held_groups(recorded: dict, node_id: str) -> dict[int, list[str]]:
    """The groups g > 0 that `node_id` runs an engine of by group 0's record
    (``statemachine.catalog.Members.as_dict``), each with the members its
    engine starts with: its recorded members, and during a move the target
    too (it joins before the source leaves)."""
    held = {}
    move = recorded["move"]
    for group, members in recorded["members"].items():
        members = list(members)
        if move is not None and move[0] == group:
            members.append(move[2])
        if node_id in members:
            held[group] = members
    return held


class HeldGroupsReporter(Background):
    """Tells the node's supervisor (`report`) which groups g > 0 this node
    should run an engine of, by group 0's record, and their members'
    addresses, whenever that changes (`node`: group 0's engine).

    Only from a replica that has applied what it knows committed under a
    known leader: a replica still replaying or catching up holds an older
    record, and would stop an engine its node is about to need."""

    def __init__(self, node, report):
        if node.group != 0:
            raise ValueError("group 0's engine holds the record of which node runs which group")
        self._node = node
        self._report = report
        self._reported: dict | None = None

    async def _run(self) -> None:
        while True:
            self.check()
            await asyncio.sleep(CHECK_S)

    def check(self) -> None:
        status = self._node.status()
        if status["leader_id"] is None or status["cut_off"] or status["applied_index"] < status["commit_index"]:
            return
        recorded = self._node.read("group_members")
        if not recorded["members"]:
            return
        held = held_groups(recorded, self._node.id)
        named = {node_id for members in held.values() for node_id in members}
        # the members' addresses, for those that joined after this node's cluster.toml was written
        addresses = {voter["id"]: [voter["raft_addr"], voter["http_addr"]] for voter in self._node.members()
                     if voter["id"] in named}
        report = {"groups": held, "addresses": addresses}
        if report != self._reported:
            self._report(report)
            self._reported = report
