"""`buffer=allow`: take puts while no leader is reachable, forward them once one is.

The buffer itself (engine/storage/put_buffer.py) is a durable FIFO on this node's disk.
Forwarding goes through the same door as any client: the local engine of
the queue's Raft group when it leads, else an HTTP put to that group's
leader (``leader.serving_group`` chooses, as for any request).  A put the leader answered 201
advances the buffer.  One it refused for good (400, 404, 409, 413: the
same put would be refused again) is set aside in the buffer's dead.log,
counted (``raftq_buffer_dead_lettered``, ``raftq cluster status``) and
logged once, and the records behind it go on.  Anything else (no leader, a
full queue, a disk alarm, 401/403 while tokens are rotated) is tried again later, in
order, so that a record held back is not overtaken.  A node in disk alarm
buffers nothing: the buffer is on its disk (507).
"""

import asyncio
import logging
import uuid
from urllib.parse import quote

from aiohttp import ClientError, ClientTimeout, web

from raftq.engine.outcome import CommitError
from raftq.engine.storage.put_buffer import BufferFull, PutBuffer
from raftq.wire_format import with_body_b64

from .codec import respond
from .errors import ApiError
from .keys import DISK, HTTP, NODE, SETTINGS
from .commands import apply, validate
from .leader import Elsewhere, node_authorization, serving_group

log = logging.getLogger(__name__)

BUFFER = web.AppKey("buffer", PutBuffer)
BUFFERED = web.AppKey("buffered", asyncio.Event)   # set when a put is buffered
REPLAY_PERIOD_S = 0.2


def with_ids(messages: list) -> list:
    """Give every message an idempotency id, so a replay stores it once."""
    return [m if m.get("id") else {**m, "id": uuid.uuid4().hex} for m in messages]


def buffer_put(request: web.Request, queue: str, messages: list) -> web.Response:
    request.app[DISK].check_own()       # the buffer is on this node's disk
    try:
        request.app[BUFFER].append(queue, messages)
    except BufferFull:
        raise ApiError("buffer_full", "no leader is reachable and this node's put buffer is full") from None
    request.app[BUFFERED].set()
    return respond(request, {"buffered": True, "ids": [m["id"] for m in messages]}, status=202)


# Answers after which the same put can never succeed.
FINAL_CODES = {"bad_request", "not_found", "conflict", "too_large", "limit_reached"}
FINAL_STATUS = {400, 404, 409, 413}


async def _forward(app: web.Application, queue: str, messages: list) -> str | None:
    """None once the leader stored the put; "retry"; or why it refused it for good."""
    auto_create = app[NODE].auto_create
    command = {"op": "put", "queue": queue, "messages": messages, "auto_create": auto_create}
    try:
        validate(command)
        group = await serving_group(app, [queue], creating=auto_create, authorization=node_authorization(app))
        result = (await apply(app, group, command)).result
    except Elsewhere as there:
        return await _post(app, there.address, queue, messages)
    except CommitError:
        return "retry"
    except ApiError as exc:
        result = exc.body()
    if "error" not in result:
        return None
    if result["error"] in FINAL_CODES and "feature" not in result:   # (a feature waits for an upgrade)
        return f"{result['error']}: {result.get('message', '')}"
    if result["error"] != "insufficient_storage":    # a disk alarm logs its own line, once
        log.warning("buffered put to %s refused (%s); will retry", queue, result["error"])
    return "retry"


async def _post(app: web.Application, address: str, queue: str, messages: list) -> str | None:
    """The put sent to the node at `address`, which leads the queue's group: as _forward's."""
    url = f"{app[SETTINGS].scheme}://{address}/v1/queues/{quote(queue, safe='')}/messages"
    authorization = node_authorization(app)
    headers = {"Authorization": authorization} if authorization else {}
    try:
        async with app[HTTP].post(url, json={"messages": [with_body_b64(m) for m in messages]}, headers=headers,
                                  allow_redirects=False, timeout=ClientTimeout(total=15)) as reply:
            if reply.status == 201:
                return None
            text = await reply.text()
            if reply.status in FINAL_STATUS and '"feature"' not in text:   # (a feature waits for an upgrade)
                return f"HTTP {reply.status}: {text[:300]}"
            if reply.status != 507:                  # a disk alarm logs its own line, once
                log.warning("buffered put to %s answered %s; will retry", queue, reply.status)
    except (ClientError, asyncio.TimeoutError):
        pass
    return "retry"


async def replay(app: web.Application) -> None:
    buffer, buffered = app[BUFFER], app[BUFFERED]
    while True:
        # An empty buffer costs no wake-ups: an idle node sleeps until a put is buffered.
        buffered.clear()
        if buffer.oldest() is None:
            await buffered.wait()
        await asyncio.sleep(REPLAY_PERIOD_S)
        record = buffer.oldest()
        while record is not None:
            next_pos, queue, messages = record
            outcome = await _forward(app, queue, messages)
            if outcome == "retry":
                break
            if outcome is None:
                buffer.forwarded(next_pos)
                log.info("forwarded %d buffered message(s) to %s", len(messages), queue)
            else:
                buffer.dead_letter(next_pos, queue, messages, outcome)
                log.error("a buffered put of %d message(s) to %s was refused for good (%s); set aside in %s",
                          len(messages), queue, outcome, buffer.dead_path)
            record = buffer.oldest()
