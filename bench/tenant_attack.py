"""One tenant attacks, the others work: a principal's quotas keep the others' throughput (issue 52).

    .venv/bin/python -m bench.tenant_attack [--seconds 8] [--workers 8] [--attacks flood,fill,hog]

A 3-node cluster of this tree with two principals: ``victim`` (put, receive on ``v-*``, no
quotas) and ``attacker`` (put, receive, admin on ``a-*``) held to put_rate 200, stored_bytes
4 MiB, long_polls 8, connections 8 and queues 4. The victim's `--workers` loops put a 100-byte
message and receive and ack one, through the leader, for `--seconds`: undisturbed, then beside
each attack in turn, with the attacker at the same node:

- flood: 32 loops putting batches of 10 messages into a-flood as fast as the node answers,
  a 429 (put_rate) taken as a cue to send again at once: what refused requests cost;
- fill: 16 loops putting 64 KiB bodies into a-fill (its queues soon store their quota),
  waiting the Retry-After of a 429 as the clients do;
- hog: 200 long polls (20 s) on the empty a-idle, each opened again when it ends, a 429
  (long_polls) waited out as Retry-After says.

Each attack's figure is the victim's operations a second beside it over undisturbed (the issue
asks for 0.8 or more), and how the attacker's requests were answered. Then a principal is
revoked and the time until every node refuses its token is measured (the median of 5).
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raftq.local import LocalCluster  # noqa: E402

ATTACKER_QUOTAS = {"put_rate": 200, "stored_bytes": 4 << 20, "long_polls": 8, "connections": 8, "queues": 4}


def log(message: str) -> None:
    print(message, flush=True)


async def make(session, url: str, admin: dict, name: str, rules: list, quotas: dict | None = None) -> str:
    async with session.post(url + "/v1/principals", json={"name": name, "rules": rules, "quotas": quotas or {}},
                            headers=admin) as reply:
        assert reply.status == 201, await reply.text()
        return (await reply.json())["token"]


async def victim(session, url: str, who: dict, seconds: float, workers: int) -> float:
    """The victim's put + receive + ack rounds a second."""
    done = 0
    deadline = time.monotonic() + seconds

    async def loop(n: int):
        nonlocal done
        queue = f"{url}/v1/queues/v-work-{n % 2}"
        while time.monotonic() < deadline:
            async with session.post(queue + "/messages", json={"body": "x" * 100}, headers=who) as put:
                await put.read()
            async with session.post(queue + "/receive", json={"max": 1}, headers=who) as got:
                leased = (await got.json()).get("messages", []) if got.status == 200 else []
            if leased:
                async with session.post(queue + "/ack", json={"receipts": [m["receipt"] for m in leased]},
                                        headers=who) as ack:
                    await ack.read()
            if put.status == 201:
                done += 1
    start = time.monotonic()
    await asyncio.gather(*(loop(n) for n in range(workers)))
    return done / (time.monotonic() - start)


async def attack(session, url: str, who: dict, kind: str, stop: asyncio.Event, answers: collections.Counter):
    async def flood():
        while not stop.is_set():
            async with session.post(url + "/v1/queues/a-flood/messages", json={"messages": [{"body": "f"}] * 10},
                                    headers=who) as reply:
                answers[reply.status] += 1
                await reply.read()

    async def fill():
        body = "z" * (64 << 10)
        while not stop.is_set():
            async with session.post(url + "/v1/queues/a-fill/messages", json={"body": body}, headers=who) as reply:
                answers[reply.status] += 1
                await reply.read()
                if reply.status == 429:
                    await asyncio.sleep(float(reply.headers.get("Retry-After", 1)))

    async def hog():
        while not stop.is_set():
            try:
                async with session.post(url + "/v1/queues/a-idle/receive", json={"wait_ms": 20_000},
                                        headers=who, timeout=aiohttp.ClientTimeout(total=3)) as reply:
                    answers[reply.status] += 1
                    await reply.read()
                    if reply.status == 429:
                        await asyncio.sleep(float(reply.headers.get("Retry-After", 1)))
            except asyncio.TimeoutError:
                answers["held"] += 1

    loops, count = {"flood": (flood, 32), "fill": (fill, 16), "hog": (hog, 200)}[kind]
    await asyncio.gather(*(loops() for _ in range(count)))


async def revocation_s(session, cluster: LocalCluster, url: str, admin: dict) -> float:
    """Seconds from a principal's removal being answered until every node refuses its token."""
    token = await make(session, url, admin, "short-lived", [{"actions": ["put"], "queues": ["v-*"]}])
    who = {"Authorization": f"Bearer {token}"}
    for node in cluster.urls:
        while True:
            async with session.get(node + "/v1/whoami", headers=who) as reply:
                if reply.status == 200:
                    break
            await asyncio.sleep(0.02)
    async with session.delete(url + "/v1/principals/short-lived", headers=admin) as reply:
        assert reply.status in (200, 204), await reply.text()
    removed = time.monotonic()
    pending = set(cluster.urls)
    while pending:
        for node in list(pending):
            async with session.get(node + "/v1/whoami", headers=who) as reply:
                if reply.status == 401:
                    pending.discard(node)
        await asyncio.sleep(0.005)
    return time.monotonic() - removed


async def run(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="raftq-tenant-attack-") as tmp:
        os.chdir(tmp)            # `python -m raftq` puts the working directory first on sys.path
        cluster = LocalCluster.create(Path(tmp) / "cluster", 3, env={**os.environ, "PYTHONPATH": str(ROOT)})
        cluster.start()
        figures: dict = {"seconds": args.seconds, "workers": args.workers, "attacker_quotas": ATTACKER_QUOTAS}
        try:
            leader = cluster.wait_for_leader(60)
            if leader is None or not cluster.wait_all_ready(60):
                raise SystemExit(f"the cluster did not come up; see {cluster.root}")
            url, admin = cluster.url(leader), {"Authorization": f"Bearer {cluster.token}"}
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as session:
                victim_who = {"Authorization": "Bearer " + await make(
                    session, url, admin, "victim", [{"actions": ["put", "receive"], "queues": ["v-*"]}])}
                attacker_who = {"Authorization": "Bearer " + await make(
                    session, url, admin, "attacker", [{"actions": ["put", "receive", "admin"], "queues": ["a-*"]}],
                    ATTACKER_QUOTAS)}
                async with session.put(url + "/v1/queues/a-idle", json={}, headers=attacker_who) as made:
                    assert made.status in (200, 201), await made.text()
                for node in cluster.urls:     # every node takes both before anything is measured
                    for who in (victim_who, attacker_who):
                        while (await session.get(node + "/v1/whoami", headers=who)).status != 200:
                            await asyncio.sleep(0.05)
                await victim(session, url, victim_who, 1.0, args.workers)      # warm up
                alone = await victim(session, url, victim_who, args.seconds, args.workers)
                figures["undisturbed_ops_s"] = round(alone, 1)
                log(f"undisturbed   victim {alone:8.1f} ops/s")
                for kind in args.attacks.split(","):
                    stop, answers = asyncio.Event(), collections.Counter()
                    attacking = asyncio.create_task(attack(session, url, attacker_who, kind, stop, answers))
                    await asyncio.sleep(1.0)
                    beside = await victim(session, url, victim_who, args.seconds, args.workers)
                    stop.set()
                    await attacking
                    ratio = beside / alone if alone else None
                    figures[f"{kind}_ops_s"] = round(beside, 1)
                    figures[f"{kind}_ratio"] = round(ratio, 3) if ratio is not None else None
                    figures[f"{kind}_attacker_answers"] = {str(k): v for k, v in sorted(answers.items(), key=str)}
                    log(f"{kind:<13} victim {beside:8.1f} ops/s  ratio {ratio:.3f} (target >= 0.8: "
                        f"{'met' if ratio >= 0.8 else 'NOT met'})  attacker answered {dict(answers)}")
                times = [await revocation_s(session, cluster, url, admin) for _ in range(5)]
                figures["revocation_every_node_s"] = round(statistics.median(times), 3)
                figures["revocation_every_node_max_s"] = round(max(times), 3)
                log(f"revocation    every node refuses the token {statistics.median(times):.3f} s after the answer "
                    f"(median of 5; max {max(times):.3f} s)")
        finally:
            cluster.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--attacks", default="flood,fill,hog", help="which attacks, comma-separated")
    print(json.dumps(asyncio.run(run(parser.parse_args()))))


if __name__ == "__main__":
    main()
