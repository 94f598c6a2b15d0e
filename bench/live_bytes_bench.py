"""Live bytes: what each node's disk holds when one message per log entry stays live (issue 47).

    .venv/bin/python bench/live_bytes_bench.py                        # 2 000 entries of 256 KiB: 500 MiB of them
    .venv/bin/python bench/live_bytes_bench.py --entries 200 --churn-mib 128

On a fresh 3-node cluster on 127.0.0.1:
1. `--entries` rounds, each a put of a 100-byte message and an `--entry-bytes`
   one into one queue, a receive of both (leased for an hour) and an ack of
   the large one: each round's log entry keeps one small message live, as a
   slow consumer or a dead-letter queue does. Without copying live bodies
   forward (engine/relocation.py), compaction keeps every one of these
   entries whole for as long as its message stays;
2. `--churn-mib` of puts that store nothing (each repeats the id of a
   message acknowledged already, so its entry is dead at once) grow every
   node's log past its compaction threshold (32 MiB, up to 1.5x per node)
   a few times: the entries the fill left live reach a snapshot, their
   bodies are copied out, and a later compaction drops them; then 48 MiB
   more at a time until a step changes no node's kept bytes and moves no
   body (`--churn-mib` more at most; each step read once its figures stay
   the same for 2 s, past a snapshot still being written), so that what is
   measured is where compaction settled;
3. every small message is read back and compared with what was put, then
   each node's data directory (its allocated blocks, bench/backlog_bench.py's
   `disk_mib`) and its journal's kept bytes (`raftq_journal_kept_bytes`:
   what compaction keeps because stored bodies lie in it) are measured.

Figures: `disk_vs_live_bytes`, the largest node's disk ÷ the live body bytes,
with its target disk <= 2 x live body bytes + 256 MiB (the constant: the log
before compaction, up to 48 MiB; the segment being filled, up to 64 MiB;
kept segments awaiting their rewrite, one per compaction; the snapshot);
`kept_vs_live_bytes`, the largest kept bytes ÷ the live body bytes, with its
target kept <= 2 x live body bytes + 8 MiB (a kept entry is copied out of
once its live bodies take less than half of it, and no relocation is
planned while what compaction keeps is within that).
Each target is printed beside its figure, met or not. The last line printed
is one JSON object of every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    # run as a script: this tree's code, here and in the nodes it starts
    sys.path.insert(0, str(ROOT))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])

from bench.backlog_bench import disk_mib  # noqa: E402
from bench.measure import machine  # noqa: E402
from bench.raftq_side import Raftq  # noqa: E402
from raftq.client import AsyncClient, Client, Producer  # noqa: E402
from raftq.engine.relocation import SLACK_BYTES  # noqa: E402

QUEUE = "slow"
CHURN_QUEUE = "churn"
CHURN_ID = "again"
CHURN_BATCH = 4
CHURN_WINDOW = 16
# Past every node's compaction threshold (32 MiB, jittered up to 1.5x per node).
SETTLE_STEP_MIB = 48
LEASE_MS = 3_600_000
# The disk target's constant, in MiB (see the docstring).
DISK_CONSTANT_MIB = 256
# How long the nodes may take to apply everything and finish a snapshot before they are measured.
SETTLE_S = 120.0
# What a step's figures must stay the same for before they count as read: a compaction its last
# puts set off may still be writing its snapshot (a forked child) when the step ends.
QUIET_S = 2.0

TARGETS = (
    ("disk_vs_live_bytes", f"disk <= 2 x live body bytes + {DISK_CONSTANT_MIB} MiB",
     lambda f: f["disk_mib"] <= 2 * f["live_body_mib"] + DISK_CONSTANT_MIB),
    ("kept_vs_live_bytes", f"kept <= 2 x live body bytes + {SLACK_BYTES >> 20} MiB",
     lambda f: f["kept_bytes"] <= 2 * f["live_body_bytes"] + SLACK_BYTES),
)


def small(n: int) -> str:
    """The n-th message left live: 100 bytes, its number in front."""
    return f"{n:08d}" + "s" * 92


def metric(cluster, node_id: str, name: str) -> float:
    with Client(cluster.url(node_id), token=cluster.token, retry_for=0, timeout=30) as client:
        found = re.search(rf"^{name} (\S+)$", client.metrics(), re.MULTILINE)
    return float(found.group(1))


async def fill(cluster, entries: int, entry_bytes: int) -> None:
    """Step 1: one entry per round, its small message left live, its large one acknowledged."""
    big = "b" * entry_bytes
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        for n in range(entries):
            await client.put_batch(QUEUE, [{"body": small(n)}, {"body": big}])
            taken = (await client.receive(QUEUE, max=2, lease_ms=LEASE_MS))["messages"]
            if [m["body"][:8] for m in taken] != [small(n)[:8], big[:8]]:
                raise RuntimeError(f"round {n} received {[m['seq'] for m in taken]}, not its own two messages")
            await client.ack(QUEUE, [taken[1]["receipt"]])


async def churn(cluster, mib: int, entry_bytes: int) -> None:
    """Step 2's puts that store nothing, `mib` of them."""
    body = "c" * entry_bytes
    async with Producer(cluster.urls, token=cluster.token, window=CHURN_WINDOW, max_batch=CHURN_BATCH) as producer:
        confirms = [await producer.send(CHURN_QUEUE, body, id=CHURN_ID) for _ in range(mib * 2**20 // entry_bytes)]
        await producer.flush()
    stored = [c.result() for c in confirms if not c.result().get("duplicate")]
    if stored:
        raise RuntimeError(f"{len(stored)} churned puts were stored, not taken for duplicates")


async def churn_until_settled(cluster, mib: int, entry_bytes: int) -> int:
    """Step 2: `mib` of puts that store nothing, then SETTLE_STEP_MIB more at a time (each past
    every node's compaction threshold) until a step changes no node's kept bytes, `mib` more at
    most; how many MiB in all."""
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        await client.put(CHURN_QUEUE, "", id=CHURN_ID)
        [first] = (await client.receive(CHURN_QUEUE))["messages"]
        await client.ack(CHURN_QUEUE, [first["receipt"]])
    await churn(cluster, mib, entry_bytes)
    churned, seen = mib, await asyncio.to_thread(quiet_compaction_seen, cluster)
    while churned < 2 * mib:
        await churn(cluster, SETTLE_STEP_MIB, entry_bytes)
        churned += SETTLE_STEP_MIB
        seen, before = await asyncio.to_thread(quiet_compaction_seen, cluster), seen
        if seen == before:
            break
    return churned


def compaction_seen(cluster) -> dict:
    """Each node's journal's kept bytes and the bodies it moved as a leader: while either changes,
    relocation and compaction are still at work."""
    return {node_id: (metric(cluster, node_id, "raftq_journal_kept_bytes"),
                      metric(cluster, node_id, "raftq_relocated_bodies_total")) for node_id in cluster.ids}


def quiet_compaction_seen(cluster) -> dict:
    """``compaction_seen`` once it has not changed for QUIET_S (SETTLE_S at most). Read at once,
    a step whose last puts set off a compaction still being written looked like one that changed
    nothing, and a CI run on a busy machine measured the kept entries before their compaction."""
    deadline = time.monotonic() + SETTLE_S
    seen, since = compaction_seen(cluster), time.monotonic()
    while time.monotonic() - since < QUIET_S and time.monotonic() < deadline:
        time.sleep(0.25)
        latest = compaction_seen(cluster)
        if latest != seen:
            seen, since = latest, time.monotonic()
    return seen


def served(cluster, entries: int) -> bool:
    """Step 3: whether the leader serves every small message as it was put, in order."""
    with Client(cluster.urls, token=cluster.token) as client:
        held = []
        while len(held) < entries + 1:
            page = client.browse(QUEUE, from_seq=held[-1][0] + 1 if held else 0, limit=1_000)["messages"]
            if not page:
                break
            held += [(m["seq"], m["body"]) for m in page]
    return [body for _, body in held] == [small(n) for n in range(entries)]


def measure(root: Path, entries: int, entry_bytes: int, churn_mib: int, log=print) -> dict:
    import raftq.engine
    side = Raftq(root)
    try:
        side.start()
        cluster = side.cluster
        began = time.perf_counter()
        asyncio.run(fill(cluster, entries, entry_bytes))
        fill_s = time.perf_counter() - began
        log(f"filled {entries:,} entries of {entry_bytes:,} B, one 100-byte message live in each, in {fill_s:.1f} s")
        churned = asyncio.run(churn_until_settled(cluster, churn_mib, entry_bytes))
        log(f"churned {churned} MiB of puts that stored nothing")
        for node_id in cluster.ids:
            side._caught_up(node_id, timeout=SETTLE_S)
        intact = served(cluster, entries)
        nodes = {n: {"disk_mib": round(disk_mib(cluster.root / n), 1),
                     "kept_bytes": int(metric(cluster, n, "raftq_journal_kept_bytes")),
                     "relocated_bodies": int(metric(cluster, n, "raftq_relocated_bodies_total"))}
                 for n in cluster.ids}
    finally:
        side.stop()
    live_bytes = entries * len(small(0))
    for node_id, node in nodes.items():
        log(f"{node_id}: disk {node['disk_mib']:,} MiB, journal keeps {node['kept_bytes']:,} B, "
            f"relocated {node['relocated_bodies']:,} bodies as a leader")
    disk = max(node["disk_mib"] for node in nodes.values())
    kept = max(node["kept_bytes"] for node in nodes.values())
    figures = {
        "entries": entries, "entry_bytes": entry_bytes, "churn_mib": churned, "machine": machine(),
        "code_path": str(Path(raftq.engine.__file__).resolve().parent.parent),
        "fill_rounds_per_s": round(entries / fill_s, 1), "bodies_intact": intact,
        "live_body_bytes": live_bytes, "live_body_mib": round(live_bytes / 2**20, 3), "entries_mib": round(entries * entry_bytes / 2**20, 1),
        "disk_mib": disk, "disk_vs_live_bytes": round(disk * 2**20 / live_bytes, 2),
        "kept_bytes": kept, "kept_vs_live_bytes": round(kept / live_bytes, 3),
        "relocated_bodies": sum(node["relocated_bodies"] for node in nodes.values()), "nodes": nodes,
    }
    figures["targets_met"] = {key: bool(met(figures)) for key, _, met in TARGETS}
    for key, target, _ in TARGETS:
        log(f"target {key:<20} {figures[key]!s:>10}   {target:<44} "
            + ("met" if figures["targets_met"][key] else "not met"))
    return figures


def positive(value: str) -> int:
    """An argparse type: an integer, 1 or more."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError("an integer, 1 or more")
    return number


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=positive, default=2_000,
                        help="log entries each left with one live 100-byte message")
    parser.add_argument("--entry-bytes", type=positive, default=256 * 1024,
                        help="the acknowledged message beside it, and each churned put (at most 1 MiB)")
    parser.add_argument("--churn-mib", type=positive, default=160,
                        help="MiB of puts that store nothing, put after the fill")
    args = parser.parse_args(argv)
    if args.entry_bytes > 1 << 20:
        parser.error("--entry-bytes is at most 1048576 (a message's size limit)")
    root = Path(tempfile.mkdtemp(prefix="raftq-live-bytes-"))
    try:
        figures = measure(root, args.entries, args.entry_bytes, args.churn_mib)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
