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
  allowed by a ``FeatureGate``);
- ``priority_backoff_pause_replay``: issue 51's priorities, back-off policies, paused and
  rate-limited groups, retention and group positions (``seek_group``, ``patch_group``,
  ``add_group``'s start at a seq or a time), which an older replica refuses or would apply
  unlike the others (``statemachine.feature_needed`` names the commands that use them);
- ``principals``: principals kept in group 0's log, and the names and quotas a principal's
  commands carry, which an older replica would apply without them (api/principals.py);
- ``cluster_connections``: a principal's connections counted by group 0's leader for the
  cluster (api/connections.py), whose route and engine calls an older leader lacks: until
  every node runs it, each counts its own connections as before;
- ``plain_entries``: log entries without pickle (engine/raft/node.py, item 19), which an older
  replica would apply as nothing (allowed by a ``FeatureGate``).

``ClusterFeature`` asks every voter of group 0 (every node is one) for one of them; the name
releaser and the feature gates wait on it. ``Admission`` refuses a request that uses
issue 51's feature 409 ``conflict``, changing nothing, until every node runs it (a node that
does not answer counts as not running it, and is asked again a second later).
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import ClientError, ClientTimeout, web

from raftq.engine.background import Background
from raftq.engine.outcome import CommitError
from raftq.statemachine.machine import PRIORITY_BACKOFF_PAUSE_REPLAY, feature_needed

from .errors import ApiError
from .keys import GROUPS, HTTP, SETTINGS

log = logging.getLogger(__name__)

FEATURES = ("name_release", "release_in_turn", "sealed_receipts", "sqs_keys", "relocate", "wall_times",
            PRIORITY_BACKOFF_PAUSE_REPLAY, "principals", "cluster_connections", "plain_entries")
ASK_AGAIN_S = 1.0
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
        # the node the last question found silent (its release unknown), not one found to lack it
        self.unanswered: str | None = None

    def known_everywhere(self) -> bool:
        """Whether every node this front knows of was found to run the feature (no question asked)."""
        known = frozenset(self._app[GROUPS].catalog.view()["http"])
        return self._every_node is not None and known <= self._every_node

    async def everywhere(self) -> bool:
        groups = self._app[GROUPS]
        known = frozenset(groups.catalog.view()["http"])
        if self._every_node is not None and known <= self._every_node:
            return True
        voters = await groups.catalog.members()
        self.unanswered = None
        for voter in voters:
            if voter["id"] == groups.catalog.id:
                continue
            features = await features_of(self._app, voter["http_addr"])
            if features is None:
                self.unanswered = voter["id"]
            if self._feature not in (features or ()):
                log.info("%s: waiting for %s to run a release that knows it", self._who, voter["id"])
                return False
        # a node known but no voter (one removed) does not apply the groups' logs
        self._every_node = known | {voter["id"] for voter in voters}
        log.info("%s: every node runs a release that knows it (%s)", self._who,
                 ", ".join(sorted(voter["id"] for voter in voters)))
        return True


class FeatureGate(Background):
    """In a node's first front: tells each of the node's engines (its call `tell`: relocation's
    ``allow_relocation``, the wall clock's ``allow_wall_ticks``, the log's ``allow_plain_entries``)
    whether every node runs a release with `feature`, each engine started since (a replica moved
    here) as it comes, and tells them again if a node of an older release joins."""

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
            FeatureGate(app, "wall_times", "the wall clock in ticks", "allow_wall_ticks"),
            FeatureGate(app, "plain_entries", "log entries without pickle", "allow_plain_entries")]


class AskedFeature:
    """A ``ClusterFeature`` that requests wait on: asked at most once a second while a node lacks
    it, one question at a time however many requests ask; once every node has it, asked no more."""

    def __init__(self, app: web.Application, feature: str, who: str):
        self.feature = ClusterFeature(app, feature, who)
        self._missing_until = 0.0
        self._asking: asyncio.Future | None = None

    async def everywhere(self) -> bool:
        if self.feature.known_everywhere():
            return True
        if time.monotonic() < self._missing_until:
            return False
        if self._asking is None:
            self._asking = asyncio.ensure_future(self._ask())
            self._asking.add_done_callback(self._asked)
        return await asyncio.shield(self._asking)

    async def _ask(self) -> bool:
        if await self.feature.everywhere():
            return True
        self._missing_until = time.monotonic() + ASK_AGAIN_S
        return False

    def _asked(self, _) -> None:
        self._asking = None


class Admission:
    """In each front: a request's command that uses issue 51's feature waits for every node to
    run it; once every node does, no command is looked at."""

    def __init__(self, app: web.Application):
        self._asked = AskedFeature(app, PRIORITY_BACKOFF_PAUSE_REPLAY, "issue 51's writes")
        self._feature = self._asked.feature

    async def admit(self, command: dict) -> None:
        """ApiError 409 conflict, before anything is written, unless every node runs a release
        that knows what the valid `command` needs of the state machine."""
        if self._feature.known_everywhere():
            return
        feature = feature_needed(command)
        if feature is not None and not await self._asked.everywhere():
            if self._feature.unanswered is not None:
                # a node not up yet (a cluster's birth) or down: its release is unknown, not old
                raise ApiError("release_unknown", f"this {command['op']} uses {feature}, and node "
                                                  f"{self._feature.unanswered} has not said whether its release "
                                                  "knows it (GET /health/live): retry once it answers",
                               headers={"Retry-After": "1"}, feature=feature)
            raise ApiError("conflict", f"this {command['op']} uses what not every node's release knows yet "
                                       f"({feature}: priorities, back-off, paused or limited groups, retention, "
                                       "a group's position; GET /health/live lists each node's features): "
                                       "finish the upgrade first (docs/operations.md, \"Upgrading\")",
                           feature=feature)


ADMISSION = web.AppKey("admission", Admission)
