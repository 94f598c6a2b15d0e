"""Health, cluster status, membership and replica verification."""

import asyncio

from aiohttp import ClientError, ClientTimeout, web

from raftq.engine.config import DEFAULT_REPLICAS, ConfigError, check_addr
from raftq.engine.outcome import CommitError

from . import caps
from .buffering import BUFFER
from .codec import read_body, read_optional_body, respond
from .commands import settled_read, take_checkpoint, write
from .errors import ApiError, no_quorum
from .gather import group_param, per_group
from .keys import DISK, GROUPS, HTTP, NODE, SETTINGS
from .leader import route_to_leader
from .features import FEATURES
from .principals import PRINCIPAL, may_touch
from .routing import checked_name
from .routing import leader_only

PEER_TIMEOUT = ClientTimeout(total=0.7)
ENGINE_TIMEOUT_S = 1.0
LIVE_CONTACT_MS = 1000
LEADERSHIP_TRANSFER_S = 3.0


async def live(request: web.Request) -> web.Response:
    # features: what this release adds that the cluster may use only once every node has it
    # (api/features.py)
    return respond(request, {"status": "live", "id": request.app[NODE].id, "features": list(FEATURES)})


async def readiness(node, disk) -> tuple[bool, dict]:
    """Ready: this node follows or is a leader that hears from a majority. An
    engine that does not answer within ENGINE_TIMEOUT_S (stopped, overloaded)
    makes the node not ready. A node in disk alarm (`disk`, api/disk.py) stays
    ready and says so: it serves receives, acks and reads, which drain its disk,
    and a write refused for its disk is refused through every node alike."""
    try:
        async with asyncio.timeout(ENGINE_TIMEOUT_S):
            status = await node.status()
    except (CommitError, asyncio.TimeoutError):
        return False, {"id": node.id, "role": "unknown", "leader": None, "term": None, "commit_index": None,
                       "applied_index": None, "last_log_index": None, "fsync_policy": None,
                       "pid": node.node_pid, "ready": False, "disk": disk.own.as_dict()}
    # Ready as the front routes: from the view the engine pushed, so that a
    # node that answers ready does not then redirect to a leader it lost.
    view = node.view()
    ready = view["leader_id"] is not None and view["quorum_ok"]
    return ready, {
        "id": node.id, "role": view["role"], "leader": view["leader_id"], "term": view["term"],
        "commit_index": status["commit_index"], "applied_index": status["applied_index"],
        "last_log_index": status["last_log_index"], "fsync_policy": status["fsync_policy"],
        # so that whoever started the node can tell it from another process on its port
        "pid": node.node_pid, "ready": ready, "disk": disk.own.as_dict()}


async def group_states(app: web.Application) -> dict:
    """Each of this node's engines (by group id, a string) as its Raft group sees it: role,
    leader, term, indexes, voters."""
    async def state(group: int, engine) -> dict:
        try:
            async with asyncio.timeout(ENGINE_TIMEOUT_S):
                status = await engine.status()
        except (CommitError, asyncio.TimeoutError):
            status = {}
        view = engine.view()
        return {"role": view["role"] if status else "unknown", "leader": view["leader_id"],
                "term": view["term"], "commit_index": status.get("commit_index"),
                "applied_index": status.get("applied_index"),
                # the group's voters as this replica's Raft sees them: its snapshot's and its log's
                # membership, which every replica must agree on
                "voters": sorted([status["self_id"], *status["peers"]]) if status else None,
                # whether it logs what it proposes without pickle (engine/raft/node.py, item 19)
                "plain_entries": status.get("plain_entries")}
    groups = sorted(app[GROUPS].engines)
    states = await asyncio.gather(*(state(group, app[GROUPS].engines[group]) for group in groups))
    return {str(group): state for group, state in zip(groups, states)}


async def ready(request: web.Request) -> web.Response:
    is_ready, body = await readiness(request.app[NODE], request.app[DISK])
    if request.query.get("groups") == "true":
        body["raft_groups"] = await group_states(request.app)
    return respond(request, body, status=200 if is_ready else 503)


async def _peer_ready(request: web.Request, http_addr: str) -> dict | None:
    url = f"{request.scheme}://{http_addr}/health/ready?groups=true"
    headers = {"Accept": "application/json"}
    if "Authorization" in request.headers:
        headers["Authorization"] = request.headers["Authorization"]
    try:
        async with request.app[HTTP].get(url, headers=headers, timeout=PEER_TIMEOUT) as reply:
            return await reply.json()
    except (ClientError, asyncio.TimeoutError, ValueError):
        return None


async def view(request: web.Request) -> dict:
    """The cluster as this node sees it, each member asked for its own indexes."""
    node = request.app[NODE]
    buffer = request.app[BUFFER]
    status = await node.status()
    members = await node.members()

    async def own() -> dict:
        return {**(await readiness(node, request.app[DISK]))[1], "raft_groups": await group_states(request.app)}
    views = await asyncio.gather(*(
        _peer_ready(request, m["http_addr"]) if m["id"] != node.id else own() for m in members))
    nodes = []
    for member, seen in zip(members, views):
        peer = status["peers"].get(member["id"], {})
        nodes.append({
            "id": member["id"], "raft_addr": member["raft_addr"], "http_addr": member["http_addr"],
            "role": seen["role"] if seen else "unreachable",
            "term": seen["term"] if seen else None,
            "commit_index": seen["commit_index"] if seen else None,
            "applied_index": seen["applied_index"] if seen else None,
            "match_index": status["last_log_index"] if member["id"] == node.id else peer.get("match_index"),
            # how long ago this node last heard from that one (a node does not hear from itself)
            "last_contact_ms": None if member["id"] == node.id else peer.get("last_contact_ms"),
            "fsync_policy": seen["fsync_policy"] if seen else None,
            "pid": seen.get("pid") if seen else None,     # the node's (its supervisor's), as that node reports it
            "healthy": bool(seen and seen["ready"]),
            # free bytes, watermark and disk alarm (api/disk.py), as that node reports them
            "disk": seen.get("disk") if seen else None,
        })
    recorded = request.app[GROUPS].recorded()
    moving = {} if recorded is None else {
        "move": None if recorded["move"] is None else dict(zip(("group", "source", "target"), recorded["move"])),
        "leaving": recorded["leaving"]}
    return {"id": node.id, "leader": status["leader_id"], "term": status["term"],
            "commit_index": status["commit_index"], "nodes": nodes,
            "groups": _groups_seen(request.app[GROUPS], members, views), **moving,
            "limits": request.app[SETTINGS].limits.as_dict(),
            "catalog": await _catalog_usage(request.app),
            "staging": (await node.read("staging_usage")).result,
            "buffer": {"pending_bytes": buffer.pending_bytes, "dead_lettered": buffer.dead_lettered,
                       "dead_letter_file": str(buffer.dead_path)}}


async def _catalog_usage(app: web.Application) -> dict | None:
    """The names this node's replica of the catalog holds, against the most it may (None with one
    group: there is no catalog, and a deleted queue's name holds nothing)."""
    groups = app[GROUPS]
    if groups.count == 1:
        return None
    usage = (await groups.catalog.read("catalog_usage")).result
    return {**usage, "limit": caps.catalog_names_limit(app[SETTINGS].limits, groups.count)}


def _groups_seen(groups, members: list[dict], views: list) -> list[dict]:
    """Every Raft group as its members reported it (their /health/ready): members, leader,
    term, the leader's commit index, and each member's applied index, lag behind it and the
    voters it counts (which every replica should agree on: the leader's are the group's)."""
    reports = {}   # group id -> {node id: that node's state of it}
    for member, seen in zip(members, views):
        for group, state in (seen or {}).get("raft_groups", {}).items():
            reports.setdefault(int(group), {})[member["id"]] = state
    out = []
    for group in range(groups.count):
        states = reports.get(group, {})
        leader = next((node for node, state in states.items() if state["role"] == "leader"), None)
        commit = states[leader]["commit_index"] if leader else None
        out.append({"id": group, "members": groups.members(group), "leader": leader,
                    "term": max((state["term"] for state in states.values()), default=None),
                    "commit_index": commit,
                    "replicas": {node: {"applied_index": state["applied_index"],
                                        "lag": None if commit is None or state["applied_index"] is None
                                        else max(0, commit - state["applied_index"]),
                                        "voters": state.get("voters")}
                                 for node, state in states.items()}})
    return out


async def show(request: web.Request) -> web.Response:
    return respond(request, await view(request))


async def _keeps_quorum(request: web.Request, engine, voters_after: list[str]) -> None:
    """Refuse (409) a change of `engine`'s group after which its live voters would be no
    majority, unless ?force=true.

    Live: this leader, and each peer it heard from within LIVE_CONTACT_MS (and the quiet
    group's slack, engine.raft.quiet). A
    node being added counts as not live yet: it has not caught up.
    """
    if request.query.get("force") == "true":
        return
    status = await engine.status()
    peers, live_ms = status["peers"], LIVE_CONTACT_MS + status.get("contact_slack_ms", 0)
    live = [v for v in voters_after if v == engine.id or (
        peers.get(v, {}).get("last_contact_ms") is not None and peers[v]["last_contact_ms"] < live_ms)]
    if len(live) <= len(voters_after) / 2:
        raise ApiError("conflict", f"after this change {len(live)} of {len(voters_after)} voters would be live "
                                   f"({', '.join(live)}): no majority, so no leader. Bring nodes back first, "
                                   "or repeat with ?force=true (raftq cluster add/remove --force)", live=live,
                       voters=voters_after)


def _voter(voters: list[dict], node_id: str, raft_addr: str | None = None) -> dict | None:
    """The voter `node_id` among `voters` (``members()``), also when this replica knows it only
    by its Raft address (learned from the log, where another leader added it)."""
    return next((v for v in voters if v["id"] == node_id or raft_addr is not None and v["id"] == raft_addr), None)


async def _membership_group(request: web.Request) -> tuple[int, web.StreamResponse | None]:
    """The group a membership change is for (``?group=``, else group 0), and where to send it
    when this node's engine of it does not lead."""
    if request.query.get("force", "true") != "true":
        raise ApiError("bad_request", "force must be true, or left out")
    group = group_param(request) or 0
    return group, await route_to_leader(request, group=group)


async def add_node(request: web.Request) -> web.Response:
    """Add a voter to group 0 (``raftq cluster add``), or, with ``?group=`` g > 0, to group g
    (the replica mover: api/mover.py). An add of a voter the group has is taken as done (200:
    a retried call whose first answer was lost), unless group 0 has it at other addresses
    (409). A group g > 0 answers with the voter's match index and the leader's commit index,
    by which the mover sees it catch up."""
    group, elsewhere = await _membership_group(request)
    if elsewhere is not None:
        return elsewhere
    body = await read_body(request)
    fields = ("id", "raft_addr", "http_addr")
    if not isinstance(body, dict) or not all(isinstance(body.get(f), str) and body[f] for f in fields):
        raise ApiError("bad_request", "give id, raft_addr and http_addr as strings")
    for field in ("raft_addr", "http_addr"):
        try:
            check_addr(body[field], field)
        except ConfigError as exc:
            raise ApiError("bad_request", str(exc)) from None
    engine = request.app[GROUPS].engines[group]
    voters = await engine.members()
    status = 201
    existing = _voter(voters, body["id"], body["raft_addr"])
    if existing is not None:
        if group == 0 and (existing["raft_addr"], existing["http_addr"]) != (body["raft_addr"], body["http_addr"]):
            raise ApiError("conflict", f"node {body['id']!r} is already a member, at Raft address "
                                       f"{existing['raft_addr']} and HTTP address {existing['http_addr']}")
        status = 200
    else:
        await _keeps_quorum(request, engine, [v["id"] for v in voters] + [body["id"]])
        if group == 0:   # validated like any command before it reaches the log
            await write(request, {"op": "set_member", "id": body["id"], "raft_addr": body["raft_addr"],
                                  "http_addr": body["http_addr"]})
        try:
            await engine.add_node(body["id"], body["raft_addr"], body["http_addr"])
        except CommitError as exc:
            raise no_quorum(f"the membership change did not complete ({exc.code}); retry") from None
    answer = {k: body[k] for k in fields}
    groups = request.app[GROUPS]
    if group == 0 and groups.count > 1:
        answer.update(_replicas_kept(len(groups.members(1)), groups.count, len(voters) + 1))
    if group > 0:
        raft_status = await engine.status()
        if body["id"] == engine.id:       # it leads already
            match_index = raft_status["last_log_index"]
        else:
            peer = raft_status["peers"].get(body["id"]) or raft_status["peers"].get(body["raft_addr"], {})
            match_index = peer.get("match_index", 0)
        answer.update(group=group, match_index=match_index, commit_index=raft_status["commit_index"])
    return respond(request, answer, status=status)


def _replicas_kept(replicas: int, group_count: int, nodes: int) -> dict:
    """The replicas of each group but group 0 once a node is added, which a growth does not
    change (the mover moves replicas, it makes none): said as a warning when a cluster made
    with fewer nodes than the default holds fewer copies than it would be made with now."""
    kept = {"replicas": replicas}
    if replicas < min(DEFAULT_REPLICAS, nodes):
        kept["warning"] = (f"groups 1..{group_count - 1} keep {replicas} replica(s) each, as when the cluster "
                           f"was made: adding nodes spreads those replicas and adds none (a cluster of {nodes} "
                           f"nodes would be made with {min(DEFAULT_REPLICAS, nodes)})")
    return kept


async def remove_node(request: web.Request) -> web.Response:
    """Remove a voter from group 0 (``raftq cluster remove``), or, with ``?group=`` g > 0,
    from group g (the replica mover), where a voter it lacks is taken as removed. With several
    groups, a node that holds replicas of other groups by group 0's record is marked leaving
    (202): the mover moves them away, then removes it from group 0; refused (409) when fewer
    nodes than a group's replicas would remain."""
    group, elsewhere = await _membership_group(request)
    if elsewhere is not None:
        return elsewhere
    engine = request.app[GROUPS].engines[group]
    node_id = request.match_info["node"]
    voters = await engine.members()
    if _voter(voters, node_id) is None:
        if group > 0:
            return web.Response(status=204)
        raise ApiError("not_found", f"node {node_id!r} is not a member")
    if group == 0 and request.app[GROUPS].count > 1:
        leaving = await _leaving(request, node_id, [v["id"] for v in voters])
        if leaving is not None:
            return leaving
    await _keeps_quorum(request, engine, [v["id"] for v in voters if v["id"] != node_id])
    if node_id == engine.id:
        await engine.transfer_leadership(2.0)
        raise no_quorum("this node led the group and has handed leadership over; "
                        "send the removal to the new leader")
    try:
        await engine.remove_node(node_id)
    except CommitError as exc:
        raise no_quorum(f"the membership change did not complete ({exc.code}); retry") from None
    return web.Response(status=204)


async def _leaving(request: web.Request, node_id: str, voters: list[str]) -> web.Response | None:
    """On group 0's leader of a cluster of several groups: None when `node_id` holds no replica
    of another group (it leaves group 0 now); else it is marked leaving (202), or refused 409
    when fewer nodes than a group's replicas would remain."""
    # settled: read by a leader new to its term, the record could miss a committed move onto
    # the node, which would then leave group 0 still holding that replica. A lead lost meanwhile
    # (a balancing hand-over) serves the removal again where the lead went.
    recorded = (await settled_read(request.app, 0, "group_members")).result
    move = recorded["move"] or []
    held = sum(node_id in members for members in recorded["members"].values()) + (node_id in move[1:])
    if not held:
        return None
    replicas = max(len(members) for members in recorded["members"].values())
    remaining = [v for v in voters if v != node_id and v not in recorded["leaving"]]
    if len(remaining) < replicas:
        raise ApiError("conflict", f"each group has {replicas} replicas; without {node_id} "
                                   f"{len(remaining)} nodes would remain ({', '.join(remaining)})",
                       remaining=remaining, replicas=replicas)
    await write(request, {"op": "node_leaving", "id": node_id})
    return respond(request, {"id": node_id, "leaving": True, "replicas": held}, status=202)


@leader_only
async def transfer_leadership(request: web.Request) -> web.Response:
    """Hand group 0's leadership to another voter (`to`, or the most caught-up one). The other
    groups' leaders follow their order of preference (``raftq cluster rebalance``)."""
    if group_param(request):
        raise ApiError("bad_request", "this hands group 0's leadership; the other groups' leaders follow "
                                      "their order of preference (POST /v1/cluster/rebalance)")
    body = await read_optional_body(request)
    if not isinstance(body, dict) or set(body) - {"to"}:
        raise ApiError("bad_request", "the body is an object with an optional 'to' node id")
    node = request.app[NODE]
    target = body.get("to")
    if target is not None and not isinstance(target, str):
        raise ApiError("bad_request", "'to' must be a node id")
    if target is not None and not any(m["id"] == target for m in await node.members()):
        raise ApiError("not_found", f"node {target!r} is not a member")
    if target == node.id:
        return respond(request, {"moved": False, "previous": node.id, "leader": node.id})
    moved = await node.transfer_leadership(LEADERSHIP_TRANSFER_S, target)
    status = await node.status()
    return respond(request, {"moved": moved, "previous": node.id, "leader": status["leader_id"]})


# a verify's verdicts, the worst first: two replicas' digests differ (a bug); the replicas that
# answered agree but some gave no digest in time (down, or still applying: ask again); all agree
VERDICTS = ("differ", "incomplete", "agree")


async def verify(request: web.Request) -> web.Response:
    """Take a digest at one log position on every replica of a Raft group and compare: of
    the one group (``?group=``, or the only one), else of each group (gathered)."""
    groups = request.app[GROUPS]
    group = group_param(request)
    if group is not None or groups.count == 1:
        elsewhere = await route_to_leader(request, group=group or 0)
        if elsewhere is not None:
            return elsewhere
        return respond(request, await _verify_group(request, group or 0))
    answers = await per_group(request, lambda group: _verify_group(request, group))
    verdicts = {answer["verdict"] for answer in answers.values()}
    # token and digests of group 0 (every node holds it), as with one group; then every group's
    return respond(request, {**answers[0], "agree": verdicts == {"agree"},
                             "verdict": next(v for v in VERDICTS if v in verdicts),
                             "unanswered": sorted({node for answer in answers.values() for node in answer["unanswered"]}),
                             "groups": [{"group": group, **answers[group]} for group in sorted(answers)]})


async def _verify_group(request: web.Request, group: int) -> dict:
    """On the leader of `group`: its replicas' digests at one checkpoint, and whether they agree."""
    node = request.app[GROUPS].engines[group]
    token, digest = await take_checkpoint(request.app, group)
    members = [m for m in await node.members() if m["id"] != node.id]

    async def digest_of(member) -> str | None:
        url = f"{request.scheme}://{member['http_addr']}/v1/cluster/checkpoints/{token}?group={group}"
        headers = {"Authorization": request.headers["Authorization"]} if "Authorization" in request.headers else {}
        for _ in range(50):   # a lagging follower may still be applying up to the checkpoint
            try:
                async with request.app[HTTP].get(url, headers=headers, timeout=PEER_TIMEOUT) as reply:
                    if reply.status == 200:
                        return (await reply.json())["digest"]
            except (ClientError, asyncio.TimeoutError, ValueError):
                pass
            await asyncio.sleep(0.1)
        return None

    others = await asyncio.gather(*(digest_of(m) for m in members))
    digests = {node.id: digest, **{m["id"]: d for m, d in zip(members, others)}}
    unanswered = sorted(node_id for node_id, d in digests.items() if d is None)
    verdict = ("differ" if len({d for d in digests.values() if d is not None}) > 1
               else "incomplete" if unanswered else "agree")
    return {"token": token, "digests": digests, "agree": verdict == "agree", "verdict": verdict,
            "unanswered": unanswered}


async def checkpoint(request: web.Request) -> web.Response:
    token = request.match_info["token"]
    group = group_param(request) or 0
    engine = request.app[GROUPS].engines.get(group)
    if engine is None:
        raise ApiError("not_found", f"this node has no replica of group {group}")
    digest = await engine.checkpoint_digest(token)
    if digest is None:
        raise ApiError("not_found", "this node has not applied that checkpoint (yet)")
    return respond(request, {"token": token, "digest": digest})


async def routing(request: web.Request) -> web.Response:
    """Where each queue is served (issue 24): every Raft group's members and leader, and queue -> group.

    Assignments never change, so a client may keep them; a leader is as this
    node last heard it (a group it has no engine of: as one of its members
    heard it), so a client refreshes on a 307 or a lost connection. The queues listed are those the
    caller's principal has an action on.
    """
    groups = request.app[GROUPS]
    if "queue" in request.query:
        return await _confirmed_groups(request, [checked_name(name, "queue") for name in request.query.getall("queue")])
    group = group_param(request)

    async def here(group: int) -> dict:
        engine = groups.engines[group]
        view = engine.view()
        return {"groups": [{"id": group, "members": groups.members(group), "leader": view["leader_id"],
                            "leader_http_addr": engine.http_addr(view["leader_id"]), "term": view["term"]}]}
    if group is not None:
        # a node with no engine of the group (one a move just took it from, asked by a node whose
        # view of the record lags) sends the caller on to a member, as any request for the group
        elsewhere = await route_to_leader(request, group=group, leader=False)
        if elsewhere is not None:
            return elsewhere
        return respond(request, await here(group))
    answers = await per_group(request, here, leader=False)
    # with one group there is no catalog: every queue is group 0's
    queues = {} if groups.count == 1 else (await groups.catalog.read("list_catalog")).result["groups"]
    queues = {name: group for name, group in queues.items() if may_touch(request.get(PRINCIPAL), name)}
    recorded = groups.recorded()
    return respond(request, {"group_count": groups.count,
                             "groups": [answers[g]["groups"][0] for g in range(groups.count)],
                             "queues": queues, "members_recorded": recorded is not None,
                             "move": None if recorded is None or recorded["move"] is None
                             else dict(zip(("group", "source", "target"), recorded["move"]))})


async def _confirmed_groups(request: web.Request, names: list[str]) -> web.Response:
    """The groups of `names` as group 0's leader confirms them (None: never assigned): what a
    node asks when its own replica of the catalog lacks a name (leader.serving_group)."""
    groups = request.app[GROUPS]
    if groups.count == 1:
        return respond(request, {"group_count": 1, "queues": {name: 0 for name in names}})
    elsewhere = await route_to_leader(request, group=0)
    if elsewhere is not None:
        return elsewhere
    found, index = await settled_read(request.app, 0, "catalog_lookup", names)
    return respond(request, {"group_count": groups.count, "catalog_index": index,
                             "queues": {name: group for name, group in found["groups"].items()
                                        if may_touch(request.get(PRINCIPAL), name)}})


async def rebalance(request: web.Request) -> web.Response:
    """Ask the leader of every Raft group (or of ``?group=``) to run leader balancing now: move
    leadership to the group's first live, caught-up preference. One group has nothing to balance."""
    groups = request.app[GROUPS]
    if groups.count == 1:
        return respond(request, {"groups": [], "moved": 0})
    group = group_param(request)

    async def here(group: int) -> dict:
        try:
            moved = await groups.engines[group].rebalance()
        except CommitError as exc:
            raise no_quorum(f"group {group}'s engine did not balance ({exc.code}); retry") from None
        return {"groups": [{"group": group, "moved": moved}]}
    if group is None:
        answers = await per_group(request, here)
        moves = [answers[g]["groups"][0] for g in sorted(answers)]
    else:
        elsewhere = await route_to_leader(request, group=group)
        if elsewhere is not None:
            return elsewhere
        moves = (await here(group))["groups"]
    return respond(request, {"groups": moves, "moved": sum(bool(move["moved"]) for move in moves)})
