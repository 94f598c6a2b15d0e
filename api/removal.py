"""A node taken out of the cluster finds out, and stops.

`raftq cluster remove n4` takes n4 out of group 0's voters. The leader stops
sending to n4 the moment it proposes the change (Raft's rule: a
configuration counts as soon as it is in the log), so n4 never learns of its
own removal: it keeps the voters it had, shows itself following a leader it
no longer hears from, is never ready, and dials peers that refuse it, for as
long as it runs.

So, once this node's engine of group 0 has heard from no leader for
``QUIET_S``, its first front asks the voters it knows whom they count
(``GET /health/ready?groups=true``, each replica's ``voters``). When a
majority of them, each ready under a leader, no longer count this node, it
was removed: ``on_removed`` runs (the front tells the supervisor, which
stops the node with an exit status that says so). A node that never held an
entry of group 0 (started with ``--join`` before ``raftq cluster add``)
waits instead, as does one that a minority alone disowns.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from aiohttp import ClientError, ClientTimeout, web

from raftq.engine.background import Background
from raftq.engine.outcome import CommitError

from .keys import GROUPS, HTTP, NODE, SETTINGS

log = logging.getLogger(__name__)

CHECK_S = 2.0
QUIET_S = 5.0          # about ten election timeouts without a leader
ASK_TIMEOUT = ClientTimeout(total=3)


class RemovalWatch(Background):
    def __init__(self, app: web.Application, on_removed: Callable[[list[str]], None]):
        self._app = app
        self._on_removed = on_removed
        self._quiet_since: float | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(CHECK_S)
            if self._app[NODE].view()["quorum_ok"]:
                self._quiet_since = None
                continue
            now = loop.time()
            self._quiet_since = self._quiet_since or now
            if now - self._quiet_since < QUIET_S:
                continue
            try:
                disowned_by = await self.disowned_by()
            except (CommitError, asyncio.TimeoutError) as exc:
                log.info("removal check: this node's engine did not answer (%s)", exc)
                continue
            if disowned_by:
                self._on_removed(disowned_by)
                return

    async def disowned_by(self) -> list[str]:
        """The voters that no longer count this node, when they are a majority of those it
        counts; else nothing."""
        node = self._app[NODE]
        status = await node.status()
        if status["last_log_index"] <= 1:
            return []                     # never held an entry of group 0: not yet added, not removed
        peers = sorted(status["peers"])
        answers = await asyncio.gather(*(self._voters_counted_by(peer) for peer in peers))
        disowned_by = [peer for peer, voters in zip(peers, answers) if voters is not None and node.id not in voters]
        return disowned_by if len(disowned_by) > (len(peers) + 1) / 2 else []

    async def _voters_counted_by(self, peer: str) -> list[str] | None:
        """Group 0's voters as `peer` counts them while it is ready (hears from a leader)."""
        address = self._app[GROUPS].http_addr(peer)
        if address is None:
            return None
        url = f"{self._app[SETTINGS].scheme}://{address}/health/ready"
        try:
            async with self._app[HTTP].get(url, params={"groups": "true"}, timeout=ASK_TIMEOUT,
                                           allow_redirects=False) as reply:
                body = await reply.json()
        except (ClientError, asyncio.TimeoutError, ValueError):
            return None
        if reply.status != 200 or not body.get("ready"):
            return None
        return body.get("raft_groups", {}).get("0", {}).get("voters")
