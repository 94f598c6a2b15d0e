"""The name releaser (statemachine/release.py): lets the names of deleted queues leave the
catalog, so that with several Raft groups the catalog's limit bounds the queues there are,
not the names ever used.

It runs in every node's first front, for each group whose local engine leads, in three
steps, each a command through a log:
1. ``retire_names`` in the group: the deleted names it may let go (none it holds or names
   as a dead-letter queue or a stage's) retire, and from then on no command makes them there;
2. ``release_names`` in group 0 (the catalog's leader: here, or through its front, which
   first reads on a replica of the group that they are retiring at that fence,
   api/catalog_release.py): the catalog forgets them, in its log entry W;
3. ``names_released`` in the group, with W: its fence rises to W, so only a command routed
   by a view of the catalog that saw the release may make a queue there.
Group 0 takes a group's releases in turn (statemachine/catalog.py): step 2 sends the group's
fence read with the names, and a releaser that read them before the group finished the last
release (its lead moved away and back while it waited) is answered with that release, which
it finishes instead; its names, released since and perhaps made again, stay.
Deleted names go at the next step. A name the catalog placed but the group never made (a
creation it refused, a dead-letter queue never needed and no longer named) goes once two
sweeps, SWEEP_S apart, found it unmade (a creation on its way is not that slow; one that
was is refused by the fence and placed again).

A releaser that stops between steps (a lost lead, a crash) leaves names retiring, or a
release unfinished; the group's next leader's releaser finds them and carries out steps 2
and 3 (a release finishes once).

Every node must run a release that knows these commands before any is written (an older
replica would refuse, or apply as they came, what the others take in turn): the releaser
waits until every member of group 0 says so (``GET /health/live``'s ``features``), asked
again when a node joins (api/features.py's ``ClusterFeature``).
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import ClientError, web

from raftq.engine.background import Background
from raftq.engine.outcome import CommitError

from .errors import ApiError
from .features import ClusterFeature
from .group_calls import NotYet, call_group_leader
from .keys import GROUPS

log = logging.getLogger(__name__)

STEP_S = 1.0
SWEEP_S = 10.0
NAMES_PER_STEP = 1000


class NameReleaser(Background):
    def __init__(self, app: web.Application):
        self._app = app
        # api/features.py: "name_release", the three steps; "release_in_turn", group 0 taking
        # each group's releases in turn. This releaser needs the second.
        self._cluster_releases = ClusterFeature(app, "release_in_turn", "name releaser")
        self._unmade: dict[int, set] = {}    # group -> names placed there but unmade at the last sweep
        self._next_sweep = 0.0

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(STEP_S)
            try:
                await self.step()
            except (NotYet, CommitError, ApiError, ClientError, asyncio.TimeoutError) as exc:
                log.info("name releaser: %s; trying again", exc)

    async def step(self) -> None:
        if not await self._cluster_releases.everywhere():
            return
        sweep = asyncio.get_running_loop().time() >= self._next_sweep
        if sweep:
            self._next_sweep = asyncio.get_running_loop().time() + SWEEP_S
        for group, engine in list(self._app[GROUPS].engines.items()):
            if engine.view()["role"] != "leader":
                self._unmade.pop(group, None)
                continue
            pending = (await engine.read("names_deleted", NAMES_PER_STEP)).result
            if sweep and not pending["retiring"]:
                pending["names"] += await self._unmade_twice(group, engine)
            if pending["names"] or pending["retiring"]:
                await self.release(group, engine, pending)

    async def _unmade_twice(self, group: int, engine) -> list:
        """The names the catalog placed in `group` that the group did not hold or name at this sweep
        nor at the one before (SWEEP_S apart, so a creation on its way is not taken for one
        refused or never needed)."""
        placed = (await self._app[GROUPS].catalog.read("catalog_names_in", group)).result["names"]
        unmade = set((await engine.read("names_absent", placed)).result["names"]) if placed else set()
        before, self._unmade[group] = self._unmade.get(group, set()), unmade
        return sorted(unmade & before)[:NAMES_PER_STEP]

    async def release(self, group: int, engine, pending: dict) -> None:
        """Steps 2 and 3, of the names `pending` read as retiring, or retired now (step 1): each
        with the group's fence in the same state."""
        if not pending["retiring"]:
            pending = await _applied(engine, {"op": "retire_names", "names": pending["names"]})
        names, fence = pending["retiring"], pending["fence"]
        if not names:
            return
        answer = await self._release_in_catalog({"group": group, "names": names, "fence": fence})
        if "unfinished" in answer:
            names, index = answer["unfinished"]["names"], answer["unfinished"]["index"]
            log.info("group %d: finishing its last release (%d) before the next", group, index)
        else:
            index = answer["index"]
        finished = await _applied(engine, {"op": "names_released", "names": names, "index": index, "in_turn": True})
        if finished["finished"]:
            log.info("group %d: %d queue name(s) left the catalog (fence %d)", group, len(names), index)

    async def _release_in_catalog(self, release: dict) -> dict:
        """Step 2: group 0's answer, with the index of its log entry."""
        catalog = self._app[GROUPS].catalog
        if catalog.view()["role"] == "leader":
            committed = await catalog.apply({"op": "release_names", **release})
            if "error" in committed.result:
                raise NotYet(f"group 0 refused release_names: {committed.result['message']}")
            return {**committed.result, "index": committed.index}
        return await call_group_leader(self._app, "POST", "/v1/cluster/catalog/release", release)


async def _applied(engine, command: dict) -> dict:
    result = (await engine.apply(command)).result
    if "error" in result:
        raise NotYet(f"{command['op']} refused: {result['message']}")
    return result
