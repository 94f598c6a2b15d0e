"""Put, receive (long poll), ack/nack/extend, browse, commit and transactions."""

import re

from aiohttp import web

from raftq.statemachine.queue import message_size
from raftq.statemachine.rules import PUT, RECEIVE
from raftq.statemachine.validation import MAX_RECEIVE, MAX_WAIT_MS, check_message, is_int

from .buffering import buffer_put, with_ids
from .codec import message_from_wire, read_body, read_optional_body, respond
from .errors import ApiError, from_result
from .forwarding import client_of
from .commands import receive_waiting, validate, write
from .keys import GROUP, GROUPS, NODE, SETTINGS
from .leader import read, route_to_leader
from .principals import PRINCIPAL, authorize
from .receipts import Opened, well_formed
from .routing import queue_name, group_name
from .sqs.attributes import HEADER_PREFIX

DURABILITY = ("quorum", "all", "leader")
QUERY_INT = re.compile(r"[0-9]{1,19}")


def _messages(request: web.Request, raw) -> list:
    if isinstance(raw, dict) and "messages" in raw and "body" not in raw and "body_b64" not in raw:
        raw = raw["messages"]
        if not isinstance(raw, list):
            raise ApiError("bad_request", "messages must be a list")
    else:
        raw = [raw]
    limit = request.app[SETTINGS].max_message_bytes
    return [checked_message(m, i, limit) for i, m in enumerate(raw)]


def checked_message(raw, index: int, limit: int) -> dict:
    """A client's message as the state machine takes it; refused if malformed, or
    larger than `limit` (--max-message-bytes: body, key, id and headers together)."""
    message = message_from_wire(raw, index)
    problem = check_message(message, index)
    if problem:
        raise from_result(problem)
    sqs_owned = [name for name in message.get("headers") or () if name.lower().startswith(HEADER_PREFIX)]
    if sqs_owned:
        raise ApiError("bad_request", f"message {index}: header {sqs_owned[0][:100]!r}: headers starting with "
                                      f"{HEADER_PREFIX} are the SQS API's own (a message's MessageId, SenderId and "
                                      "attributes); a message put here may not set them")
    if message_size(message) > limit:
        raise ApiError("too_large", f"message {index} is larger than {limit} bytes "
                                    "(body, key, id and headers together)")
    return message


async def put(request: web.Request) -> web.Response:
    name = queue_name(request)
    durability = request.query.get("durability", "quorum")
    if durability not in DURABILITY:
        raise ApiError("bad_request", "durability must be quorum, all or leader")
    may_buffer = request.query.get("buffer") == "allow"
    node = request.app[NODE]

    async def command() -> dict:
        messages = _messages(request, await read_body(request))
        return {"op": "put", "queue": name, "messages": with_ids(messages) if may_buffer else messages,
                "auto_create": node.auto_create}

    put_command = None
    try:
        # A follower redirects before it reads the body: decoding is the leader's cost. But a
        # name this node has not seen placed may be assigned a Raft group by the routing, which
        # only a valid put may do: its body is read and checked first.
        if node.auto_create and request.app[GROUPS].cached(name) is None:
            put_command = await command()
            validate(put_command)
        elsewhere = await route_to_leader(request, creating=node.auto_create)
        if elsewhere is not None:
            return elsewhere
        put_command = put_command or await command()
        committed = await write(request, put_command)
    except ApiError as exc:
        # Buffered only when no leader can take the write; a refusal (400, 429) is final.
        # The body is read here if no leader was found before it was; a command that was
        # offered to the log keeps its ids, so a replay of it stores nothing twice. The node
        # replays it as its own: a principal with quotas is never buffered, or they would not hold.
        principal = request.get(PRINCIPAL)
        if not (may_buffer and exc.code == "no_quorum") or (principal is not None and principal.quotas):
            raise
        put_command = put_command or await command()
        validate(put_command)
        return buffer_put(request, name, put_command["messages"])
    given, shortfall = await reach_durability(request.app, request[GROUP], durability, committed.index)
    reply = {"messages": committed.result["messages"], "commit_index": committed.index, "durability": given}
    if shortfall:
        reply["durability_not_reached"] = shortfall
    return respond(request, reply, status=201)


async def reach_durability(app: web.Application, group: int, durability: str, index: int) -> tuple[str, dict | None]:
    """After a put was applied at log `index` of `group`: wait for what `durability` asks beyond a quorum.

    Returns the level given and, when `all` was asked but not reached, what fell short. The level named is what was actually given,
    never more (docs/api.md): durability=leader is served as quorum, which is
    strictly stronger, and an `all` that some connected voter did not reach
    within the write timeout is only `quorum`.
    """
    if durability != "all":
        return "quorum", None
    timeout = app[SETTINGS].write_timeout_s
    lagging = await app[GROUPS].engines[group].replicated_everywhere(index, timeout)
    if not lagging:
        return "all", None
    return "quorum", {
        "requested": "all", "lagging": lagging,
        "message": f"stored on a majority, but {', '.join(lagging)} did not hold it "
                   f"within {timeout:g} s: durability=all was NOT reached"}


def _int_field(body: dict, field: str, default, low: int, high: int, *, nullable=False):
    value = body.get(field, default)
    if value is None and nullable:
        return None
    if not is_int(value) or not low <= value <= high:
        raise ApiError("bad_request", f"{field} must be an integer from {low} to {high}")
    return value


async def receive(request: web.Request) -> web.Response:
    name = queue_name(request)
    body = await read_optional_body(request)
    if not isinstance(body, dict):
        raise ApiError("bad_request", "the body must be an object")
    group = group_name(body.get("group", "default"))
    count = _int_field(body, "max", 1, 1, MAX_RECEIVE)
    wait_ms = _int_field(body, "wait_ms", 0, 0, MAX_WAIT_MS)
    lease_ms = _int_field(body, "lease_ms", None, 1, 1 << 40, nullable=True)
    command = {"op": "receive", "queue": name, "group": group, "max": count, "lease_ms": lease_ms}
    validate(command)
    elsewhere = await route_to_leader(request, waits=wait_ms > 0)
    if elsewhere is not None:
        return elsewhere
    result = (await receive_waiting(request.app, request[GROUP], command, wait_ms / 1000,
                                    client=client_of(request), principal=request.get(PRINCIPAL))).result
    if "error" in result:
        raise from_result(result)
    return respond(request, result)


async def _settle(request: web.Request, op: str) -> web.Response:
    name = queue_name(request)
    body = await read_body(request)
    if not isinstance(body, dict):
        raise ApiError("bad_request", "the body must be an object with receipts")
    command = {"op": op, "queue": name, "receipts": body.get("receipts")}
    if op == "nack" and body.get("delay_ms") is not None:
        command["delay_ms"] = body["delay_ms"]
    if op == "extend" and body.get("lease_ms") is not None:
        command["lease_ms"] = body["lease_ms"]
    validate(command)
    refuse_invalid_receipts(command["receipts"])
    elsewhere = await route_to_leader(request)
    if elsewhere is not None:
        return elsewhere
    opened = Opened(request.app)
    try:
        result = (await write(request, {**command, "receipts": opened.open(name, command["receipts"])})).result
    except ApiError as exc:
        raise opened.given_in(exc) from None
    return respond(request, {**result, "stale": opened.given(result["stale"])})


def refuse_invalid_receipts(receipts: list) -> None:
    """A receipt raftq could never have issued (a typo, a truncated paste) is the client's
    mistake, 400; one that names a lease that ended, or whose MAC does not hold, stays the state
    machine's 409 stale_receipt. Checked here, at the edge only: the log applies exactly as the
    nodes that wrote it did."""
    invalid = [r for r in receipts if not well_formed(r)]
    if invalid:
        raise ApiError("invalid_receipt", f"{len(invalid)} of the receipts could not have been issued by "
                                          "raftq (a receipt is what receive answered, unchanged)",
                       invalid=invalid)


async def ack(request):
    return await _settle(request, "ack")


async def nack(request):
    return await _settle(request, "nack")


async def extend(request):
    return await _settle(request, "extend")


def _query_int(request: web.Request, field: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(field)
    if raw is None:
        return default
    # ASCII digits only: str.isdigit() also takes '²', which int() refuses
    if not QUERY_INT.fullmatch(raw) or not low <= int(raw) <= high:
        raise ApiError("bad_request", f"{field} must be an integer from {low} to {high}")
    return int(raw)


async def browse(request: web.Request) -> web.Response:
    name = queue_name(request)
    group = request.query.get("group", "default")
    group_name(group)
    from_seq = _query_int(request, "from_seq", 0, 0, 1 << 62)
    limit = _query_int(request, "limit", 100, 1, 10_000)
    if "from_time_ms" in request.query:
        from_time_ms = _query_int(request, "from_time_ms", 0, 0, 1 << 62)
        return await read(request, "browse", name, group, from_seq, limit, from_time_ms)
    return await read(request, "browse", name, group, from_seq, limit)


async def commit(request: web.Request) -> web.Response:
    body = await read_body(request)
    if not isinstance(body, dict):
        raise ApiError("bad_request", "the body must be an object with seq")
    command = {"op": "commit", "queue": queue_name(request), "group": group_name(request.match_info["group"]),
               "seq": body.get("seq")}
    validate(command)
    elsewhere = await route_to_leader(request)
    if elsewhere is not None:
        return elsewhere
    return respond(request, (await write(request, command)).result)


async def transaction(request: web.Request) -> web.Response:
    body = await read_body(request)
    if not isinstance(body, dict) or set(body) - {"ack", "put"}:
        raise ApiError("bad_request", "a transaction is an object with 'ack' and/or 'put'")
    puts = body.get("put", [])
    if not isinstance(puts, list):
        raise ApiError("bad_request", "put must be a list")
    for part in puts:
        if not isinstance(part, dict):
            raise ApiError("bad_request", "each put must be an object with queue and messages")
        part["messages"] = _messages(request, {"messages": part.get("messages")})
    auto_create = request.app[NODE].auto_create
    command = {"op": "tx", "ack": body.get("ack", []), "put": puts, "auto_create": auto_create}
    validate(command)
    refuse_invalid_receipts([r for part in command["ack"] for r in part["receipts"]])
    authorize(request, RECEIVE, [part["queue"] for part in command["ack"]])
    authorize(request, PUT, [part["queue"] for part in puts])
    # Served by the one group of every queue it names (409 cross_group otherwise).
    elsewhere = await route_to_leader(request, [part["queue"] for part in command["ack"] + puts],
                                      creating=auto_create)
    if elsewhere is not None:
        return elsewhere
    opened = Opened(request.app)
    acks = [{**part, "receipts": opened.open(part["queue"], part["receipts"])} for part in command["ack"]]
    try:
        committed = await write(request, {**command, "ack": acks})
    except ApiError as exc:
        raise opened.given_in(exc) from None
    return respond(request, {**committed.result, "commit_index": committed.index}, status=201 if puts else 200)

