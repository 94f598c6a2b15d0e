"""A backlog stored before the faults and read back, byte for byte, after them (issue 25).

A stored body lies in the log entry that carried it (docs/architecture.md,
"Where a stored body lives"): compaction keeps that entry's segment, a
rewrite moves it, a follower rebuilt from a snapshot is sent it. While the
workload writes, every node compacts its log again and again; the faults
kill, pause and cut power to nodes meanwhile. The backlog says whether
every body it held survived that: `--backlog N` messages of 100 bytes, each
body naming its number, put into a queue of their own that nobody consumes,
then browsed at the end (browsing changes nothing) and compared with what
was put.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from chaos.history import History
from raftq.client import Client, Producer

BACKLOG_QUEUE = "chaos-backlog"
BODY_BYTES = 100
PAGE = 10_000      # the most one browse returns
EXAMPLES = 10


def body_of(number: int) -> str:
    """The body of the backlog's message `number`: its number, then filler up to BODY_BYTES."""
    head = f"{number:010d}:"
    return head + "b" * (BODY_BYTES - len(head))


def fill(urls: list[str], token: str | None, count: int, history: History, log: Callable[[str], None]) -> None:
    """Put `count` messages, each with an id of its own (a resend is stored once), and record them."""
    with Client(urls, retry_for=30, token=token) as client:
        client.create_queue(BACKLOG_QUEUE)
    began = time.monotonic()

    async def put_all() -> None:
        async with Producer(urls, token=token) as producer:
            for number in range(count):
                await producer.send(BACKLOG_QUEUE, body_of(number), id=f"backlog-{number}")

    asyncio.run(put_all())
    history.event("backlog", queue=BACKLOG_QUEUE, count=count)
    log(f"[{history.now():7.1f}s] backlog: {count:,} messages stored in {time.monotonic() - began:.1f} s")


def tally(count: int, messages: list[dict]) -> dict:
    """What the browsed `messages` hold of a backlog of `count`: the "backlog_read" event's fields."""
    seen: dict[int, int] = {}
    wrong: list[dict] = []
    for message in messages:
        body = message["body"]
        number = int(body[:10]) if isinstance(body, str) and body[:10].isdigit() else None
        if number is None or not 0 <= number < count or body != body_of(number):
            wrong.append({"seq": message["seq"], "body": repr(body)[:60]})
        else:
            seen[number] = seen.get(number, 0) + 1
    missing = [number for number in range(count) if number not in seen]
    twice = [number for number, times in seen.items() if times > 1]
    return {"intact": len(seen), "missing": len(missing), "wrong": len(wrong), "twice": len(twice),
            "examples": ([{"missing": n} for n in missing[:EXAMPLES]] + wrong[:EXAMPLES]
                         + [{"twice": n} for n in twice[:EXAMPLES]])}


def read_back(urls: list[str], token: str | None, count: int, history: History,
              log: Callable[[str], None]) -> None:
    """Browse the whole backlog from the leader and record what is missing, changed or there twice."""
    messages: list[dict] = []
    try:
        with Client(urls, retry_for=60, timeout=60, token=token) as client:
            next_seq = 0
            while page := client.browse(BACKLOG_QUEUE, from_seq=next_seq, limit=PAGE)["messages"]:
                messages.extend({"seq": m["seq"], "body": m["body"]} for m in page)
                next_seq = page[-1]["seq"] + 1
    except Exception as exc:   # recorded as never read back: the checker's verdict fails
        log(f"[{history.now():7.1f}s] backlog: could not be read back: {exc!r}")
        return
    found = tally(count, messages)
    history.event("backlog_read", queue=BACKLOG_QUEUE, **found)
    log(f"[{history.now():7.1f}s] backlog: {found['intact']:,} of {count:,} read back intact, "
        f"{found['missing']} missing, {found['wrong']} changed, {found['twice']} twice")
