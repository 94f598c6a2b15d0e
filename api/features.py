"""What this release adds that every node of the cluster must know before any uses it, and
asking a node which it knows (``GET /health/live``'s ``features``).

- ``name_release``, ``release_in_turn``: the name releaser's commands (api/releaser.py);
- ``sealed_receipts``: receipts with a MAC, which an older release refuses at its edge
  (api/receipt_mode.py);
- ``sqs_keys``: SQS keys kept in group 0's log, whose commands an older replica refuses
  (api/sqs/credentials.py);
- ``relocate``: live bodies copied forward out of mostly-dead log entries, a command an older
  replica refuses (engine/relocation.py, allowed by a ``FeatureGate``);
- ``wall_times``: a leader's ticks carry its wall clock (statemachine/wall.py), which an older
  replica ignores, so that it would lack the wall time of log time the others keep (engine/node.py,
  allowed by a ``FeatureGate``).

``ClusterFeature`` asks every voter of group 0 (every node is one) for one of them; the name
releaser and the feature gates wait on it.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import ClientError, ClientTimeout, web

from raftq.engine.background import Background
from raftq.engine.outcome import CommitError

from .keys import GROUPS, HTTP, SETTINGS

log = logging.getLogger(__name__)

FEATURES = ("name_release", "release_in_turn", "sealed_receipts", "sqs_keys", "relocate", "wall_times")
PEER_TIMEOUT = ClientTimeout(total=2)
GATE_S = 5.0


async def features_of(app: web.Application, address: str) -> list | None:
    """The features the node at HTTP `address` lists; None when it does not answer."""
    url = f"{app[SETTINGS].scheme}://{address}/health/live"
    try:
        async with app[HTTP].get(url, timeout=PEER_TIMEOUT) as reply:
            features = (await reply.json()).get("features", [])
            return features if isinstance(features, list) else []
    except (ClientError, asyncio.TimeoutError, ValueError):
        return None


class ClusterFeature:
    """Whether every node runs a release with one feature. Once they do, that holds until a node
    this node has not heard of joins (group 0's view's HTTP addresses), so asking again needs
    nothing of group 0's engine."""

    def __init__(self, app: web.Application, feature: str, who: str):
        self._app = app
        self._feature = feature
        self._who = who                                   # what waits for it, for the log
        self._every_node: frozenset | None = None         # the group-0 voters found to run it

    async def everywhere(self) -> bool:
        groups = self._app[GROUPS]
        known = frozenset(groups.catalog.view()["http"])
        if self._every_node is not None and known <= self._every_node:
            return True
        voters = await groups.catalog.members()
        for voter in voters:
            if voter["id"] != groups.catalog.id \
                    and self._feature not in (await features_of(self._app, voter["http_addr"]) or ()):
                log.info("%s: waiting for %s to run a release that knows it", self._who, voter["id"])
                return False
        # a node known but no voter (one removed) does not apply the groups' logs
        self._every_node = known | {voter["id"] for voter in voters}
        log.info("%s: every node runs a release that knows it (%s)", self._who,
                 ", ".join(sorted(voter["id"] for voter in voters)))
        return True


class FeatureGate(Background):
    """In a node's first front: tells each of the node's engines (its call `tell`: relocation's
    ``allow_relocation``, the wall clock's ``allow_wall_ticks``) whether every node runs a release
    with `feature`, each engine started since (a replica moved here) as it comes, and tells them
    again if a node of an older release joins."""

    def __init__(self, app: web.Application, feature: str, who: str, tell: str):
        self._app = app
        self._feature = ClusterFeature(app, feature, who)
        self._who = who
        self._tell = tell
        self._told: dict[int, tuple] = {}      # group -> (its engine, what it was told)

    async def _run(self) -> None:
        while True:
            try:
                allowed = await self._feature.everywhere()
                for group, engine in list(self._app[GROUPS].engines.items()):
                    told = self._told.get(group)
                    if told is None or told[0] is not engine or told[1] != allowed:
                        await getattr(engine, self._tell)(allowed)
                        self._told[group] = (engine, allowed)
            except (CommitError, ClientError, asyncio.TimeoutError) as exc:
                log.info("%s gate: %s; trying again", self._who, exc)
            await asyncio.sleep(GATE_S)


def feature_gates(app: web.Application) -> list[FeatureGate]:
    """The gates of what an engine may write only once every node applies it."""
    return [FeatureGate(app, "relocate", "relocation of live bodies", "allow_relocation"),
            FeatureGate(app, "wall_times", "the wall clock in ticks", "allow_wall_ticks")]
