"""One tenant attacks, the others work: a principal's quotas keep the others' throughput (issue 52).

    .venv/bin/python -m bench.tenant_attack [--seconds 6] [--workers 8] [--reps 3] [--attacks flood,fill,hog]

A 3-node cluster of this tree with two principals: ``victim`` (put, receive on ``v-*``, no
quotas) and ``attacker`` (put, receive, admin on ``a-*``) held to put_rate 200, stored_bytes
4 MiB, long_polls 8, connections 8 and queues 4. The victim's `--workers` loops put a 100-byte
message and receive and ack one, through the leader, for `--seconds`; the attacker works the
same node from its own process, as a tenant's machine would (its client's CPU is not the
victim's client's; what the two still share here is the machine's cores and its loopback):

- flood: 32 loops putting batches of 10 messages into a-flood as fast as the node answers,
  a 429 (put_rate) taken as a cue to send again at once: what refused requests cost;
- paced (not run unless named): the flood's 200 messages a second within the put_rate, never
  refused: beside the flood in one run, what the flood costs beyond what it is let put;
- fill: 16 loops putting 64 KiB bodies into a-fill (its queues soon store their quota),
  waiting the Retry-After of a 429 as the clients do; a-fill stays full, so from the second
  rep on the fill is a tenant at its stored_bytes quota retrying;
- hog: 200 long polls (20 s) on the empty a-idle, each opened again when it ends, a 429
  (long_polls) waited out as Retry-After says.

The victim is measured undisturbed and beside each attack in turn (the attacker started and
given a second first), the phases alternating rep after rep and ending undisturbed, so that
drift in the machine's load falls on both: an attack's figure for a rep is the victim's
operations a second beside it over the mean of the undisturbed phases on either side (the
issue asks for 0.8 or more), printed with how the attacker's requests were answered and the
cores each process used (``outside``: the machine's busy cores that none of them used, other
work on a shared machine). The run closes with each attack's median and range over the reps,
and the cluster's CPU per victim operation beside it over undisturbed: what the attack costs
the servers, which the machine's other work moves less than it moves the operations a second.
Then a principal is revoked and the time until every node refuses its token is measured (the
median of 5). The last line is one JSON object.
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

from bench.measure import CLOCK_TICKS, cpu_by_process, group_pids, machine, process_name  # noqa: E402
from raftq.local import LocalCluster  # noqa: E402

ATTACKER_QUOTAS = {"put_rate": 200, "stored_bytes": 4 << 20, "long_polls": 8, "connections": 8, "queues": 4}
# Before the victim is measured beside an attack, the attack runs this long: its loops reach
# their steady state (a flood's first second passes its bucket; its refusals begin).
ATTACK_SETTLE_S = 1.0
# The `paced` attack puts what the flood is let put, its put_rate, and no more: 4 loops of
# 10-message puts, each every 0.2 s.
PACED_LOOPS, PACED_EVERY_S = 4, 4 * 10 / ATTACKER_QUOTAS["put_rate"]
# Where the attacker's process finds its principal's token.
TOKEN_VARIABLE = "TENANT_ATTACK_TOKEN"
SERVER_ROLES = ("followers", "leader_engines", "leader_fronts", "leader_other")


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


async def attack(session, url: str, who: dict, kind: str, answers: collections.Counter):
    """The attacker's loops, until cancelled."""
    async def flood():
        while True:
            async with session.post(url + "/v1/queues/a-flood/messages", json={"messages": [{"body": "f"}] * 10},
                                    headers=who) as reply:
                answers[reply.status] += 1
                await reply.read()

    async def paced():
        due = time.monotonic()
        while True:
            async with session.post(url + "/v1/queues/a-flood/messages", json={"messages": [{"body": "f"}] * 10},
                                    headers=who) as reply:
                answers[reply.status] += 1
                await reply.read()
            due += PACED_EVERY_S
            await asyncio.sleep(max(0.0, due - time.monotonic()))

    async def fill():
        body = "z" * (64 << 10)
        while True:
            async with session.post(url + "/v1/queues/a-fill/messages", json={"body": body}, headers=who) as reply:
                answers[reply.status] += 1
                await reply.read()
                if reply.status == 429:
                    await asyncio.sleep(float(reply.headers.get("Retry-After", 1)))

    async def hog():
        while True:
            try:
                async with session.post(url + "/v1/queues/a-idle/receive", json={"wait_ms": 20_000},
                                        headers=who, timeout=aiohttp.ClientTimeout(total=3)) as reply:
                    answers[reply.status] += 1
                    await reply.read()
                    if reply.status == 429:
                        await asyncio.sleep(float(reply.headers.get("Retry-After", 1)))
            except asyncio.TimeoutError:
                answers["held"] += 1

    loops, count = {"flood": (flood, 32), "paced": (paced, PACED_LOOPS), "fill": (fill, 16), "hog": (hog, 200)}[kind]
    await asyncio.gather(*(loops() for _ in range(count)))


async def attacker_process(kind: str, url: str, token: str) -> None:
    """The attacker in its own process: it says `ready` once its loops run, attacks until its
    standard input closes, and prints how its requests were answered."""
    answers: collections.Counter = collections.Counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        attacking = asyncio.create_task(attack(session, url, {"Authorization": f"Bearer {token}"}, kind, answers))
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        attacking.cancel()
        try:
            await attacking
        except asyncio.CancelledError:
            pass
    print(json.dumps({str(k): v for k, v in sorted(answers.items(), key=str)}), flush=True)


class Attacker:
    """The attacker's process, started for one attack and stopped after it."""

    def __init__(self, kind: str, url: str, token: str):
        self.kind, self.url, self.token = kind, url, token
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.tenant_attack", "--attacker", self.kind, "--url", self.url, cwd=ROOT,
            env={**os.environ, TOKEN_VARIABLE: self.token},      # not in its command line, which ps shows
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        line = await self.process.stdout.readline()
        if line.strip() != b"ready":
            await self.process.wait()
            raise SystemExit(f"the attacker's process did not start (exit {self.process.returncode})")

    async def stop(self) -> dict:
        self.process.stdin.close()
        out, _ = await self.process.communicate()
        return json.loads(out.decode().strip().splitlines()[-1])


class Probe:
    """The CPU seconds, over a phase, of the leader node's engines and fronts, the other nodes,
    this process (the victim's client) and the attacker's, as cores."""

    def __init__(self, cluster: LocalCluster, leader: str, attacker_pid: int | None = None):
        self.roles: dict[int, str] = {os.getpid(): "victim_client"}
        if attacker_pid is not None:
            self.roles[attacker_pid] = "attacker_client"
        for node in cluster.ids:
            pid = cluster.pid(node)
            for p in group_pids([pid] if pid is not None else []):
                name = process_name(p) or ""
                if node != leader:
                    self.roles[p] = "followers"
                elif name.startswith("raftq-front-"):
                    self.roles[p] = "leader_fronts"
                elif name.startswith("raftq-group-"):
                    self.roles[p] = "leader_engines"
                else:
                    self.roles[p] = "leader_other"
        self.before = cpu_by_process(list(self.roles))
        self.machine_before = machine_busy_s()
        self.started = time.monotonic()

    def cores(self) -> dict[str, float]:
        after, took = cpu_by_process(list(self.roles)), time.monotonic() - self.started
        used: collections.Counter = collections.Counter()
        for pid, seconds in after.items():
            used[self.roles[pid]] += seconds - self.before.get(pid, 0.0)
        used["outside"] = max(0.0, machine_busy_s() - self.machine_before - sum(used.values()))
        return {role: round(used[role] / took, 2) for role in sorted(used)}


def server_ms_per_op(cores: dict[str, float], ops_s: float) -> float | None:
    """The cluster's CPU milliseconds per victim operation: what an attack costs the servers shows
    here whatever else the machine runs, which moves the operations a second themselves."""
    server = sum(v for role, v in cores.items() if role in SERVER_ROLES)
    return round(server * 1000 / ops_s, 2) if ops_s else None


def machine_busy_s() -> float:
    """The CPU seconds every core of the machine spent on anything but idling and waiting for disk."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLOCK_TICKS     # less idle and iowait


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
        kinds = args.attacks.split(",")
        figures: dict = {"seconds": args.seconds, "workers": args.workers, "reps": args.reps,
                         "attacker_quotas": ATTACKER_QUOTAS, "machine": machine(), "rounds": []}
        try:
            leader = cluster.wait_for_leader(60)
            if leader is None or not cluster.wait_all_ready(60):
                raise SystemExit(f"the cluster did not come up; see {cluster.root}")
            url, admin = cluster.url(leader), {"Authorization": f"Bearer {cluster.token}"}
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as session:
                victim_who = {"Authorization": "Bearer " + await make(
                    session, url, admin, "victim", [{"actions": ["put", "receive"], "queues": ["v-*"]}])}
                attacker_token = await make(
                    session, url, admin, "attacker", [{"actions": ["put", "receive", "admin"], "queues": ["a-*"]}],
                    ATTACKER_QUOTAS)
                attacker_who = {"Authorization": f"Bearer {attacker_token}"}
                async with session.put(url + "/v1/queues/a-idle", json={}, headers=attacker_who) as made:
                    assert made.status in (200, 201), await made.text()
                for node in cluster.urls:     # every node takes both before anything is measured
                    for who in (victim_who, attacker_who):
                        while (await session.get(node + "/v1/whoami", headers=who)).status != 200:
                            await asyncio.sleep(0.05)
                await victim(session, url, victim_who, 1.0, args.workers)      # warm up
                async def undisturbed() -> tuple[float, dict]:
                    probe = Probe(cluster, leader)
                    return await victim(session, url, victim_who, args.seconds, args.workers), probe.cores()

                before, before_cores = await undisturbed()
                for rep in range(1, args.reps + 1):
                    for kind in kinds:
                        attacker = Attacker(kind, url, attacker_token)
                        await attacker.start()
                        await asyncio.sleep(ATTACK_SETTLE_S)
                        probe = Probe(cluster, leader, attacker.process.pid)
                        beside = await victim(session, url, victim_who, args.seconds, args.workers)
                        beside_cores = probe.cores()
                        answers = await attacker.stop()
                        after, after_cores = await undisturbed()
                        alone = (before + after) / 2
                        ratio = beside / alone if alone else None
                        figures["rounds"].append({
                            "rep": rep, "attack": kind, "undisturbed_ops_s": [round(before, 1), round(after, 1)],
                            "beside_ops_s": round(beside, 1), "ratio": round(ratio, 3) if ratio else None,
                            "attacker_answers": answers, "undisturbed_cores_before": before_cores,
                            "beside_cores": beside_cores,
                            "server_ms_per_op": [server_ms_per_op(before_cores, before),
                                                 server_ms_per_op(beside_cores, beside)]})
                        log(f"rep {rep} {kind:<6} victim {beside:7.1f} ops/s beside, {before:7.1f} and {after:7.1f} "
                            f"undisturbed either side: ratio {ratio:.3f}  attacker answered {answers}")
                        log(f"           cores undisturbed {before_cores}")
                        log(f"           cores beside      {beside_cores}")
                        log(f"           the cluster's CPU ms per victim op: {server_ms_per_op(before_cores, before)} "
                            f"undisturbed, {server_ms_per_op(beside_cores, beside)} beside")
                        before, before_cores = after, after_cores
                for kind in kinds:
                    ratios = [r["ratio"] for r in figures["rounds"] if r["attack"] == kind and r["ratio"]]
                    median = statistics.median(ratios)
                    figures[f"{kind}_ratio_median"] = round(median, 3)
                    figures[f"{kind}_ratio_range"] = [min(ratios), max(ratios)]
                    costs = [r["server_ms_per_op"][1] / r["server_ms_per_op"][0] for r in figures["rounds"]
                             if r["attack"] == kind and all(r["server_ms_per_op"])]
                    figures[f"{kind}_cost_median"] = round(statistics.median(costs), 3)
                    log(f"{kind:<6} ratio median {median:.3f} (range {min(ratios):.3f} to {max(ratios):.3f} over "
                        f"{len(ratios)} reps; target >= 0.8: {'met' if median >= 0.8 else 'NOT met'}); the cluster's "
                        f"CPU per victim op beside it over undisturbed: median {statistics.median(costs):.2f}")
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
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--attacks", default="flood,fill,hog", help="which attacks, comma-separated")
    parser.add_argument("--attacker", help=argparse.SUPPRESS)     # the attacker's own process: its attack
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attacker:
        asyncio.run(attacker_process(args.attacker, args.url, os.environ[TOKEN_VARIABLE]))
        return
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
