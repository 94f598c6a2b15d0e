"""Step 2 of the name release (api/releaser.py) as routes: group 0's leader releases names
from the catalog, and only those a group retired.

A releaser on another node than group 0's leader asks it through ``POST
/v1/cluster/catalog/release``. That leader does not take the caller's word for what the group
retired: it reads the group's retiring names and fence on a replica of the group (its own,
or through ``POST /v1/cluster/catalog/retiring`` on a member's front when it holds none) and
releases them only if they are the caller's (``statemachine.release.release_refusal``). A
release sent by hand for a live queue's name is refused, changing nothing.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from raftq.engine.outcome import CommitError
from raftq.statemachine.release import release_refusal

from .codec import read_body, respond
from .commands import validate, write
from .errors import ApiError, no_quorum
from .gather import group_param
from .group_calls import NotYet, call_group_leader
from .keys import GROUPS
from .leader import route_to_leader

RETIRED_WAIT_S = 2.0     # a replica that follows learns of a retirement at the group's next append
RETIRED_POLL_S = 0.05     # each look reads the names on the engine: up to 10 000 of them
RETIRING_PATH = "/v1/cluster/catalog/retiring"


async def release_names(request: web.Request) -> web.Response:
    """On group 0's leader: the catalog forgets `names`, placed in `group`, which that group's
    releaser read as retiring with the group's `fence`, once a replica of the group says they
    are; answered with the index of the log entry that did, the fence the group then raises,
    or with the group's last release, `unfinished` (statemachine/catalog.py)."""
    groups = request.app[GROUPS]
    _needs_a_catalog(groups)
    elsewhere = await route_to_leader(request, group=0)
    if elsewhere is not None:
        return elsewhere
    body = await read_body(request)
    if not isinstance(body, dict):
        raise ApiError("bad_request", "give group, names and fence")
    group = body.get("group")
    if not isinstance(group, int) or isinstance(group, bool) or not 0 <= group < groups.count:
        raise ApiError("bad_request", f"group must be a group id from 0 to {groups.count - 1}")
    release = {"group": group, **_retired(body)}
    try:
        seen = await _seen_retiring(request.app, release)
    except NotYet as exc:
        raise no_quorum(f"no replica of group {group} said what it retired: {exc}") from None
    refusal = release_refusal(group, release["names"], release["fence"], seen)
    if refusal is not None:
        raise ApiError("conflict", f"{refusal}: group 0 releases only the names a group retired, with its "
                                   "fence (a releaser reads its group again)", group=group, fence=seen["fence"])
    committed = await write(request, {"op": "release_names", **release})
    return respond(request, {**committed.result, "index": committed.index})


async def read_retiring(request: web.Request) -> web.Response:
    """On a replica of ``?group=``: those of `names` retiring there, and its fence, once it shows
    them retiring at `fence` (or RETIRED_WAIT_S passed, or its fence went past)."""
    groups = request.app[GROUPS]
    _needs_a_catalog(groups)
    group = group_param(request)
    if group is None:
        raise ApiError("bad_request", "give ?group=, the group whose replica is to answer")
    elsewhere = await route_to_leader(request, group=group, leader=False)
    if elsewhere is not None:
        return elsewhere
    body = await read_body(request)
    if not isinstance(body, dict):
        raise ApiError("bad_request", "give names and fence")
    return respond(request, await retiring_here(groups.engines[group], _retired(body)))


async def retiring_here(engine, retired: dict) -> dict:
    """This replica's ``names_retiring`` read of `retired`'s names, once it shows them retiring
    at `retired`'s fence: one that follows may not have applied the retirement yet."""
    deadline = asyncio.get_running_loop().time() + RETIRED_WAIT_S
    while True:
        try:
            seen = (await engine.read("names_retiring", retired["names"])).result
        except CommitError as exc:     # an engine stopping: its group moved away, or it restarts
            raise no_quorum(f"this node's replica of the group did not answer ({exc.code}); retry") from None
        as_said = seen["fence"] == retired["fence"] and len(seen["names"]) == len(set(retired["names"]))
        if as_said or seen["fence"] > retired["fence"] or asyncio.get_running_loop().time() >= deadline:
            return seen
        await asyncio.sleep(RETIRED_POLL_S)


async def _seen_retiring(app: web.Application, release: dict) -> dict:
    engine = app[GROUPS].engines.get(release["group"])
    if engine is not None:
        return await retiring_here(engine, release)
    group = release["group"]
    return await call_group_leader(app, "POST", f"{RETIRING_PATH}?group={group}",
                                   {"names": release["names"], "fence": release["fence"]}, group=group)


def _retired(body: dict) -> dict:
    """The names and fence a body gives, checked as the catalog would check them."""
    retired = {"names": body.get("names"), "fence": body.get("fence")}
    if retired["fence"] is None:
        raise ApiError("bad_request", "give fence: the group's fence, read with the names")
    validate({"op": "release_names", "group": 0, **retired})
    return retired


def _needs_a_catalog(groups) -> None:
    if groups.count == 1:
        raise ApiError("not_found", "this cluster has one Raft group, and so no catalog")
