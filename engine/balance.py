"""Leader balancing: each group's leader hands its leadership to the first
member of the group's preference order (``engine.placement``) that is live,
once its log is close to the commit index, so that leaders spread over the
nodes after start, a failure or a node's return without any node knowing
how many groups the others lead (Kafka's preferred-leader election). Only
when a cluster has several groups.

``preferred_successor`` decides (pure); ``LeaderBalancer`` asks it every
``CHECK_S`` on the engine's loop, and at once when the group's order of
preference changes (a replica moved), and transfers at most once per
``INTERVAL_S``, so a member that keeps failing to take over costs a
leadership change every few seconds at most; a lead newly won is kept for
``SETTLE_S`` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Sequence

from .background import Background

logger = logging.getLogger(__name__)

CHECK_S = 1.0
INTERVAL_S = 5.0
TRANSFER_TIMEOUT_S = 2.0
SETTLE_S = 2.0
# a member's log this near the commit index catches up within a hand-over's hold: a follower one
# round of appends behind under load is close, one being sent a snapshot is not
CLOSE_ENTRIES = 100


def preferred_successor(preference: Sequence[str], status: dict, election_timeout_s: float) -> str | None:
    """Whom this node should hand its leadership to, or None to keep it.

    `status` is the node's ``Consensus.status()``. Only a leader hands over,
    and only to a member ahead of itself in `preference`: the first that the
    leader heard from within the election timeout (longer in a quiet group:
    ``contact_slack_ms``). That member takes it if
    its log is within CLOSE_ENTRIES of the commit index (the hand-over holds
    writes back until it has the rest). One further behind (replaying, or
    being sent a snapshot) is waited for, not passed over: a member after it
    would hand the lead on again once it caught up, two hand-overs where one
    does. A member not heard from (down, cut off) is passed over."""
    if status["role"] != "leader":
        return None
    for member in preference:
        if member == status["self_id"]:
            return None
        peer = status["peers"].get(member)
        window_ms = election_timeout_s * 1000 + status.get("contact_slack_ms", 0)
        if peer is None or peer["last_contact_ms"] is None or peer["last_contact_ms"] > window_ms:
            continue
        return member if peer["match_index"] >= status["commit_index"] - CLOSE_ENTRIES else None
    return None


class LeaderBalancer(Background):
    """Runs ``preferred_successor`` for one group's engine (an ``engine.node.Node``)."""

    def __init__(self, node, preference: Sequence[str]):
        self._node = node
        self._preference = tuple(preference)
        self._preference_changed = asyncio.Event()

    def prefer(self, preference: Sequence[str]) -> None:
        """The group's order of preference from now on (its members moved: api/mover.py),
        judged at once: a node a replica just moved to may be the group's first preference."""
        if tuple(preference) != self._preference:
            self._preference = tuple(preference)
            self._preference_changed.set()

    async def _run(self) -> None:
        last_transfer = -INTERVAL_S
        led_term, led_since = None, 0.0
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._preference_changed.wait(), CHECK_S)
            self._preference_changed.clear()
            term = self._node.consensus.term() if self._node.is_leader() else None
            if term != led_term:
                led_term, led_since = term, time.monotonic()
            # A lead just handed over stays for SETTLE_S: the replica mover (api/mover.py) hands a
            # leaving member's lead away to remove it, and the preferred member may be that one.
            if time.monotonic() - last_transfer < INTERVAL_S or time.monotonic() - led_since < SETTLE_S:
                continue
            if await self.balance_now() is not None:
                last_transfer = time.monotonic()

    async def balance_now(self) -> bool | None:
        """Hand leadership to the preferred successor now (``raftq cluster rebalance`` asks this
        of every group's leader): whether it moved; None when there was no one to hand it to."""
        if not self._node.is_leader():
            return None           # (a follower's status is not worth building every second)
        successor = preferred_successor(self._preference, self._node.status(), self._node.consensus.election_timeout)
        if successor is None:
            return None
        started = time.monotonic()
        moved = await self._node.transfer_leadership(TRANSFER_TIMEOUT_S, to=successor, step_down=False)
        # writes wait while a lead is handed over (engine/raft/consensus.py): say for how long
        logger.info("group %d: leadership %s %s, its preferred leader, in %.0f ms", self._node.group,
                    "handed to" if moved else "not taken by", successor, (time.monotonic() - started) * 1000)
        return moved
