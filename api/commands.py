"""Commands and queries through a Raft group's log, for a request already routed there (leader.py).

A write is validated before it goes anywhere, checked against the node's
caps, stamped with what its principal's quotas need (principals.py), applied
through the log of the request's group (``request[GROUP]``) and answered once
committed; its failures are HTTP errors (an unknown
outcome is 503 ``no_quorum``: retried with the same ids, it is stored once).
A read is answered at the consistency the request asks for: ``leader``
(confirmed by a majority once the leader's barrier is applied), ``strong``
(through the log) or ``any`` (the local replica, with its applied index).
"""

import asyncio

from aiohttp import web

from raftq.engine.link.remote import Read
from raftq.engine.outcome import INSUFFICIENT_STORAGE, Committed, CommitError
from raftq.statemachine import check_command
from raftq.statemachine.machine import OPS, queues_it_may_make

from . import caps
from .errors import ApiError, LeadLost, Rerouted, damaged, from_result, no_quorum
from .features import ADMISSION
from .keys import DISK, GROUP, GROUPS, SETTINGS
from .principals import PRINCIPAL, QUOTA_CODES, RATE_REFUSAL_HELD_S, Principal, acting, charge, long_poll_cap, quota_refusal
from .receipt_mode import MODE

CONSISTENCY_LEVELS = ("leader", "strong", "any")
DAMAGED = ("this node's copy of a stored body is damaged on disk and no replica's intact copy reached it in "
           "time (engine 'damaged')")


def validate(command: dict) -> None:
    """Refuse a malformed command before it goes anywhere (the log, a buffer)."""
    problem = check_command({**command, "now_ms": 0})
    if problem:
        raise from_result(problem)


async def write(request: web.Request, command: dict) -> Committed:
    """Validate, apply through the log of the request's group; the command's successful result
    and its entry's index."""
    validate(command)
    committed = await apply(request.app, request[GROUP], command, request.get(PRINCIPAL))
    if "error" in committed.result:
        raise from_result(committed.result)
    return committed


async def apply(app: web.Application, group: int, command: dict, principal: Principal | None = None) -> Committed:
    """Check the node's caps, apply a validated command of `principal` through the log of
    `group` (this node's engine of it); its result (refusals included) and its
    entry's index.  A command that may create a queue says which group it was
    routed for, which the state machine checks (``wrong_group``).  One that uses
    what not every node's release knows is refused 409 (features.py).

    A write whose fate is unknown (lost leadership, no majority in time) is
    ApiError no_quorum: retried with the same ids, it is stored once. One that
    would bring new data to a group a member of which is in disk alarm is
    refused before the log (insufficient_storage, api/disk.py).
    """
    app[DISK].check(group, command)
    groups = app[GROUPS]
    node = groups.engines[group]
    await app[ADMISSION].admit(command)
    if groups.count > 1 and OPS[command["op"]].creates_queues:
        command["raft_group"] = group
        command["catalog_index"] = groups.view_index(group, queues_it_may_make(command))
    caps.prepare(app[SETTINGS].limits, command, groups.count)
    acting(app, principal, command)
    call = node.apply(command, charge(app, principal, group, command))
    committed = await _committed(app, node, call, 0.0, refusal=lambda code: quota_refusal(principal, code, group, app))
    await _check_placement(app, group, committed.result)
    return committed


async def receive_waiting(app: web.Application, group: int, command: dict, wait_s: float, *,
                          client: str | None, last_try: bool = True, encoded: bool = False,
                          principal: Principal | None = None) -> Committed | None:
    """A validated receive that waits up to `wait_s` for a message (None at
    the end of the wait unless `last_try`); 429 when this node has too many
    receives waiting, or `client` (the caller's address) its share of them, or `principal` its
    long_polls quota. `encoded`: the messages as the engine encoded them (``RemoteNode.receive``)."""
    node = app[GROUPS].engines[group]
    call = node.receive(command, wait_s, sealed=not app[MODE].mixed, last_try=last_try, encoded=encoded,
                        client=client, principal_cap=long_poll_cap(app, principal, group))
    committed = await _committed(app, node, call, wait_s, unknown_served_again=True,
                                 refusal=lambda code: quota_refusal(principal, code, group, app))
    if committed is not None:
        await _check_placement(app, group, committed.result)
    return committed


async def _check_placement(app: web.Application, group: int, result) -> None:
    """Rerouted when `group` refused or did not find a queue because the view of the catalog
    that routed the request here is older than the group's fence (groups.py): the name may
    have left the group, and the queue may live in another now."""
    if not isinstance(result, dict) or result.get("error") not in ("wrong_group", "not_found") \
            or "fence" not in result:
        return
    groups, name, fence = app[GROUPS], result["queue"], result["fence"]
    stale = groups.forget_before(group, fence)
    if result["error"] == "not_found" and name not in stale:
        return                    # a view as new as the fence placed it here: it does not exist
    await groups.refresh([name], fence)
    raise Rerouted(f"queue {name!r} was routed to Raft group {group} by an older view of the catalog "
                   f"than the group's (its name left the group, index {fence}); retry")


async def take_checkpoint(app: web.Application, group: int) -> tuple[str, str]:
    """A checkpoint written through the log of `group` (this node's engine leads it): its token and
    this replica's digest there. A checkpoint is only a mark in the log, so one whose outcome a lost
    lead made unknown is taken again where the lead went."""
    node = app[GROUPS].engines[group]
    return await _committed(app, node, node.checkpoint(), 0.0, unknown_served_again=True)


async def _committed(app: web.Application, node, call, wait_s: float, *,
                     unknown_served_again: bool = False, refusal=None):
    """The outcome of a call into the log of `node` (an engine), its failures as HTTP errors
    (`refusal`: the error of a principal's quota the engine holds, from its code).
    `unknown_served_again`: a call whose outcome the lost lead made unknown may be served again
    (a receive: if it was written, the messages it leased come back when their leases end, as
    for a client that lost the answer; a checkpoint: one more mark in the log)."""
    try:
        async with asyncio.timeout(wait_s + app[SETTINGS].write_timeout_s):
            return await call
    except CommitError as exc:
        if exc.code in QUOTA_CODES and refusal is not None:
            if exc.code == "rate_limited":
                await asyncio.sleep(RATE_REFUSAL_HELD_S)
            raise refusal(exc.code) from None
        if exc.code == "too_many_waiters":
            cap = app[SETTINGS].limits.max_long_polls
            raise ApiError("too_many_waiters", f"{cap} receives are already waiting on this node "
                                               "(--max-long-polls); retry later or poll another way",
                           headers={"Retry-After": "1"}) from None
        if exc.code == "too_many_client_waiters":
            cap = app[SETTINGS].limits.max_long_polls_per_client
            raise ApiError("too_many_waiters", f"{cap} receives of this client address are already waiting on "
                                               "this node (--max-long-polls-per-client); retry later",
                           headers={"Retry-After": "1"}) from None
        if exc.code == "too_large":
            raise ApiError("too_large", "the request does not fit in one log entry") from None
        if exc.code == INSUFFICIENT_STORAGE:
            raise app[DISK].disk_refused() from None
        if exc.code == "engine_gone":
            raise no_quorum("this node is shutting down; retry (with the same message ids)") from None
        if exc.code == "no_quorum":
            raise no_quorum("this node heard from no majority within its leader lease, so it wrote nothing; "
                            "retry") from None
        if exc.code == "not_leader":
            raise LeadLost("this node stopped leading the request's group before it wrote anything of it; "
                           "retry", node) from None
        if exc.code == "damaged":
            if unknown_served_again:
                raise LeadLost(DAMAGED + "; served again where the lead goes", node) from None
            raise damaged(DAMAGED + "; retry (with the same message ids), another node serves it") from None
        if unknown_served_again and exc.code in ("leader_changed", "unknown_outcome", "discarded"):
            raise LeadLost(f"this node stopped leading the request's group before the outcome of what "
                           f"it wrote was known ({exc.code}); retry", node) from None
        raise no_quorum(f"the write's outcome is unknown ({exc.code}); retry it "
                        "(with the same message ids, so it is stored once)") from None
    except asyncio.TimeoutError:
        raise no_quorum("no majority acknowledged the write in time; its outcome is unknown, "
                        "retry it with the same message ids") from None


async def leader_read(app: web.Application, group: int, query: str, *args):
    """A query answered by the leader once its barrier is applied (before, its
    state may still lack writes an earlier leader acknowledged: found by the
    chaos checker's no_stale_reads) and a majority confirmed it still leads."""
    return (await settled_read(app, group, query, *args)).result


async def settled_read(app: web.Application, group: int, query: str, *args) -> Read:
    """leader_read's answer with the index the leader had applied when it answered."""
    try:
        async with asyncio.timeout(app[SETTINGS].write_timeout_s):
            return await app[GROUPS].engines[group].read(query, *args, settled=True)
    except CommitError:
        # a read writes nothing: served again where the lead went
        raise LeadLost("this node stopped leading the request's group before it could answer; retry",
                       app[GROUPS].engines[group]) from None
    except asyncio.TimeoutError:
        raise no_quorum("this node could not confirm with a majority that it leads (it may have "
                        "only just been elected, or lost the others); retry") from None


def consistency(request: web.Request) -> str:
    level = request.query.get("consistency", "leader")
    if level not in CONSISTENCY_LEVELS:
        raise ApiError("bad_request", "consistency must be leader, strong or any")
    return level


async def read_here(request: web.Request, group: int, query: str, *args) -> tuple[object, int | None]:
    """A query of this node's engine of `group`, which serves it at the request's consistency:
    the result, and with ``any`` the local replica's applied index."""
    level = consistency(request)
    if level == "any":
        try:
            result, applied_index = await request.app[GROUPS].engines[group].read(query, *args)
        except CommitError as exc:
            if exc.code != "damaged":
                raise
            raise damaged(DAMAGED + "; retry, or read from another node") from None
    else:
        if level == "strong":
            committed = await apply(request.app, group, {"op": "tick"})
            if "error" in committed.result:
                raise from_result(committed.result)
        result, applied_index = await leader_read(request.app, group, query, *args), None
    await _check_placement(request.app, group, result)
    return result, applied_index
