"""`buffer=allow`: take puts while no leader is reachable, forward them once one is.

The buffer itself (raftq/buffer.py) is a durable FIFO on this node's disk.
Forwarding goes through the same door as any client: the local node when it
leads, else an HTTP put to the leader.  Only a put the leader answered 201
advances the buffer; anything else is tried again later, in order, so a
refused record (a full queue) holds back the ones behind it rather than
letting them overtake it.
"""

import asyncio
import base64
import logging
import uuid

from aiohttp import ClientError, ClientTimeout, web

from raftq.buffer import BufferFull, PutBuffer
from raftq.committer import CommitError

from .codec import respond
from .errors import ApiError
from .leader import HTTP, NODE, SETTINGS

log = logging.getLogger("raftq.buffer")

BUFFER = web.AppKey("buffer", PutBuffer)
REPLAY_PERIOD_S = 0.2


def with_ids(messages: list) -> list:
    """Give every message an idempotency id, so a replay stores it once."""
    return [m if m.get("id") else {**m, "id": uuid.uuid4().hex} for m in messages]


def buffer_put(request: web.Request, queue: str, messages: list) -> web.Response:
    try:
        request.app[BUFFER].append(queue, messages)
    except BufferFull:
        raise ApiError("buffer_full", "no leader is reachable and this node's put buffer is full") from None
    return respond(request, {"buffered": True, "ids": [m["id"] for m in messages]}, status=202)


async def _forward(app: web.Application, queue: str, messages: list) -> bool:
    node = app[NODE]
    status = node.status()
    if status["leader_id"] is None or not status["quorum_ok"]:
        return False
    command = {"op": "put", "queue": queue, "messages": messages, "auto_create": node.auto_create}
    if status["role"] == "leader":
        try:
            result = await node.submit(command)
        except CommitError:
            return False
        if "error" in result:
            log.warning("buffered put to %s refused (%s); will retry", queue, result["error"])
            return False
        return True
    url = f"{app[SETTINGS].scheme}://{node.http_addr(status['leader_id'])}/v1/queues/{queue}/messages"
    token = app[SETTINGS].tokens.admin
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with app[HTTP].post(url, json={"messages": [_wire(m) for m in messages]}, headers=headers,
                                  allow_redirects=False, timeout=ClientTimeout(total=15)) as reply:
            if reply.status == 201:
                return True
            log.warning("buffered put to %s answered %s; will retry", queue, reply.status)
    except (ClientError, asyncio.TimeoutError):
        pass
    return False


def _wire(message: dict) -> dict:
    if isinstance(message.get("body"), bytes):
        message = dict(message)
        message["body_b64"] = base64.b64encode(message.pop("body")).decode()
    return message


async def replay(app: web.Application) -> None:
    buffer = app[BUFFER]
    while True:
        await asyncio.sleep(REPLAY_PERIOD_S)
        record = buffer.oldest()
        while record is not None:
            next_pos, queue, messages = record
            if not await _forward(app, queue, messages):
                break
            buffer.forwarded(next_pos)
            log.info("forwarded %d buffered message(s) to %s", len(messages), queue)
            record = buffer.oldest()
