"""Where a request is served: redirects, forwarding, the request's Raft group.

Any node accepts any request.  A request for a queue is served by its Raft
group (``groups.py``: the catalog says which; the request's group is
``request[GROUP]``); writes and ``leader``/``strong`` reads by that group's
leader: a node whose engine of the group does not lead answers 307 with the
leader's address (or, on ``X-Raftq-Forward: 1``, forwards the call itself),
and a node with no engine of the group sends it to one of the group's
members.  A node that knows no
leader — or a leader that has not heard from a majority within the leader
lease — holds the request for up to ELECTION_HOLD_S in case an election
is under way, then answers 503 ``no_quorum`` with ``Retry-After``, so a node
cut off from the majority never serves a stale or doomed request.  A node
that knows it is cut off (it stepped down as leader for want of a majority,
and has heard from no majority since: the view's ``cut_off``) says so at
once: no election it could learn of is under way.  What the request then
does through its group's log is commands.py's.
"""

import asyncio

from aiohttp import ClientError, ClientTimeout, web

from raftq.wire_format import NAME_PATTERN, is_name

from . import caps
from .codec import read_raw, respond
from .commands import apply, consistency, read_here, settled_read
from .errors import ApiError, LeadLost, from_result, no_quorum
from .forwarding import forward
from .groups import one_group
from .keys import ENGINES, GROUP, GROUPS, HTTP, NODE, SETTINGS  # noqa: F401  (the handlers import them from here)
from .principals import PRINCIPAL, Principal


# Longer than an election takes (its timeout is 0.3-0.6 s, then a vote;
# a killed leader is replaced sooner, engine/raft/node.py).
ELECTION_HOLD_S = 0.8
FORWARD_HEADERS = ("Content-Type", "Accept", "Authorization")
PASSED_HEADERS = ("Location", "X-Raftq-Leader", "X-Raftq-Group", "Retry-After", "X-Raftq-Applied-Index")


def node_authorization(app: web.Application) -> str | None:
    """The Authorization of a node's own calls to other nodes (a buffered put, an SQS call's
    lookups): the admin token, or none when the cluster has no tokens."""
    token = app[SETTINGS].tokens.admin
    return f"Bearer {token}" if token else None


def _leader_known(view: dict) -> bool:
    return view["quorum_ok"] and (view["role"] == "leader" or view["leader_id"] is not None)


async def _view_after_election(node) -> dict:
    """The routing view, once a leader is known or ELECTION_HOLD_S has passed.

    During an election a request is held here rather than refused: it is sent
    on as soon as the engine reports the winner, where a refusal would leave
    the client to guess with its backoff when to try again.
    """
    return await _view_when(node, lambda view: _leader_known(view) or view["cut_off"])


async def after_lead_lost(lost: LeadLost) -> None:
    """Return once the engine's view no longer says it leads the term it lost (the engine pushes
    it a moment after the refusal came back), or after ELECTION_HOLD_S: only then does a route
    send the request where the lead went."""
    if lost.term is not None:
        await _view_when(lost.engine, lambda view: view["role"] != "leader" or view["term"] != lost.term)


async def _view_when(node, ready) -> dict:
    """`node`'s routing view once `ready(view)`, or as it is after ELECTION_HOLD_S."""
    view = node.view()
    deadline = asyncio.get_running_loop().time() + ELECTION_HOLD_S
    while not ready(view):
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            break
        try:
            view = await asyncio.wait_for(node.next_view(), remaining)
        except asyncio.TimeoutError:
            break
    return view


def _path_queues(request: web.Request) -> list[str]:
    queue = request.match_info.get("queue")
    if queue is None:
        return []
    if not is_name(queue):
        raise ApiError("bad_request", f"queue name must match {NAME_PATTERN}")
    return [queue]


class Elsewhere(Exception):
    """Another node serves this: node `node_id`, at HTTP `address`; the request's Raft group
    when it is known (not for a name only group 0's leader can place)."""

    def __init__(self, node_id: str, address: str, group: int | None = None):
        super().__init__(node_id)
        self.node_id, self.address, self.group = node_id, address, group


async def route_to_leader(request: web.Request, queues: list[str] | None = None, *, group: int | None = None,
                          creating: bool = False, leader: bool = True,
                          waits: bool = False) -> web.StreamResponse | None:
    """None when this node serves the request, ``request[GROUP]`` being `group`, or else the
    group of `queues` (by default the path's queue; none: group 0); else the response that sends
    the caller on (307, or the forwarded answer). `creating` and `leader`: as ``serving_group``'s;
    `waits`: a request that may wait for a message (forwarded apart: api/forwarding.py)."""
    try:
        if group is None:
            group = await serving_group(request.app, _path_queues(request) if queues is None else queues,
                                        creating=creating, leader=leader,
                                        authorization=request.headers.get("Authorization"),
                                        principal=request.get(PRINCIPAL))
        else:
            await serve_here(request.app, group, leader=leader)
        request[GROUP] = group
    except Elsewhere as there:
        url = f"{request.scheme}://{there.address}{request.path_qs}"
        if request.headers.get("X-Raftq-Forward") == "1":
            return await _forward(request, url, waits)
        headers = {"Location": url, "X-Raftq-Leader": there.node_id}
        if there.group is not None:   # a client that keeps the routing learns where the queue is now
            headers["X-Raftq-Group"] = str(there.group)
        raise ApiError("not_leader", f"node {there.node_id} leads; send the request there",
                       headers=headers, leader=there.node_id) from None
    return None


async def serving_group(app: web.Application, queues: list[str], *, creating: bool = False,
                        leader: bool = True, authorization: str | None = None,
                        principal: Principal | None = None) -> int:
    """The one Raft group of `queues` (group 0 for none), when this node's engine of it leads
    with a quorum (or, not `leader`, when it merely has one); else Elsewhere. A name the
    local catalog lacks is asked of group 0's leader (with the caller's `authorization`: the
    local replica may only lag), and if that one has not got it either, assigned through it
    when `creating` (with the others, to one group: `principal`'s, within its queues quota),
    else 404. 409 cross_group when they span groups; 503 no_quorum when no leader is known."""
    groups = app[GROUPS]
    group = 0
    if groups.count > 1 and queues:
        found = await groups.local_lookup(queues)
        if any(held is None for held in found.values()):
            try:
                await _check_leads(groups.catalog)
            except Elsewhere as catalog_leader:
                found.update(await _ask_catalog(app, catalog_leader.address, queues, authorization))
                if any(held is None for held in found.values()):
                    raise
            else:
                found = await _catalog_answer(app, queues, creating, principal)
        group = one_group(found)
    await serve_here(app, group, leader=leader)
    return group


async def serve_here(app: web.Application, group: int, *, leader: bool = True) -> None:
    """Return when this node serves `group`: its engine of it leads with a quorum (or, not
    `leader`, exists); else Elsewhere (that leader, or a member when this node has no engine of
    the group) or no_quorum."""
    groups = app[GROUPS]
    if not 0 <= group < groups.count:
        raise ApiError("not_found", f"group {group} is not one of this cluster's {groups.count}")
    if group not in groups.engines:
        member = groups.member_to_ask(group)
        if member is None:
            raise no_quorum(f"no member of group {group} is known to this node")
        raise Elsewhere(member, groups.http_addr(member), group)
    if leader:
        await _check_leads(groups.engines[group], group)


async def _ask_catalog(app: web.Application, address: str, queues: list[str], authorization: str | None) -> dict:
    """The groups of `queues` as group 0's leader at `address` confirms them (each None that it
    could not say). So a node whose replica of the catalog lags behind an assignment serves the
    request instead of sending the caller back to group 0's leader, which would send it here."""
    headers = {"Accept": "application/json", **({"Authorization": authorization} if authorization else {})}
    url = f"{app[SETTINGS].scheme}://{address}/v1/cluster/routing"
    try:
        async with app[HTTP].get(url, params=[("queue", name) for name in queues], headers=headers,
                                 allow_redirects=False, timeout=ClientTimeout(total=5)) as reply:
            if reply.status != 200:
                return {}
            body = await reply.json()
            answer = body["queues"]
    except (ClientError, asyncio.TimeoutError, ValueError, KeyError):
        return {}
    # an older release does not say the index its answer was read at: 0 is older than any fence
    app[GROUPS].remember(answer, body.get("catalog_index", 0))
    return {name: answer.get(name) for name in queues}


async def _catalog_answer(app: web.Application, queues: list[str], creating: bool,
                          principal: Principal | None) -> dict:
    """On group 0's leader: each queue's group, assigned now (together, as `principal`'s) if
    `creating`; 404 for a queue the catalog has never heard of otherwise."""
    groups = app[GROUPS]
    if creating:
        limit = caps.catalog_names_limit(app[SETTINGS].limits, groups.count)
        result, index = await apply(app, 0, {"op": "assign", "queues": queues, "max_names": limit}, principal)
        if "error" in result:
            raise from_result(result)
    else:
        result, index = await settled_read(app, 0, "catalog_lookup", queues)
        unknown = [name for name, group in result["groups"].items() if group is None]
        if unknown:
            raise ApiError("not_found", f"queue {unknown[0]!r} does not exist")
    groups.remember(result["groups"], index)
    return result["groups"]


async def _check_leads(node, group: int | None = None) -> None:
    """Return when `node` (a local engine, of `group` when the request's group is known) leads
    its group with a quorum; else Elsewhere (its leader) or no_quorum."""
    status = await _view_after_election(node)
    if status["role"] == "leader":
        if not status["quorum_ok"]:
            raise no_quorum("this node leads no majority right now")
        return
    leader = status["leader_id"]
    address = node.http_addr(leader)
    if status["cut_off"] and not status["quorum_ok"]:
        raise no_quorum("this node stopped leading: it has heard from no majority of the cluster since")
    if leader is None or address is None or not status["quorum_ok"]:
        raise no_quorum("no leader is known to this node")
    raise Elsewhere(leader, address, group)


async def _forward(request: web.Request, url: str, waits: bool) -> web.Response:
    headers = {h: request.headers[h] for h in FORWARD_HEADERS if h in request.headers}
    try:
        return await forward(request, url, body=await read_raw(request), headers=headers, waits=waits,
                             relayed=PASSED_HEADERS, timeout=ClientTimeout(total=35))
    except (ClientError, asyncio.TimeoutError) as exc:
        raise no_quorum(f"the leader did not answer the forwarded request: {exc}") from None


async def read(request: web.Request, query: str, *args, group: int | None = None) -> web.Response:
    """Answer a query of the path's queue (or of `group`) at the consistency the request asks for."""
    level = consistency(request)
    elsewhere = await route_to_leader(request, group=group, leader=level != "any")
    if elsewhere is not None:
        return elsewhere
    result, applied_index = await read_here(request, request[GROUP], query, *args)
    headers = {} if applied_index is None else {"X-Raftq-Applied-Index": str(applied_index)}
    if isinstance(result, dict) and "error" in result:
        refusal = from_result(result)
        refusal.headers.update(headers)   # a 404 from a stale replica says how stale it is
        raise refusal
    return respond(request, result, headers=headers)
