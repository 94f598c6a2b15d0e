"""The nemesis: which faults a campaign injects, when, and how.

`plan()` is pure: from a seed it draws an endless (or `cycles`-long) schedule
in which every kind of fault appears once per cycle, in a shuffled order, with
its hold time, the quiet gap before it and every random choice it needs (which
follower, which partition, which toxic) already drawn. The same seed gives the
same schedule; only what depends on the live cluster (who leads right now) is
resolved when the fault is applied.

`Nemesis` applies a schedule to a running cluster. Network faults go through a
Toxiproxy API (chaos/toxiproxy.py or a real toxiproxy-server): one proxy per
pair of nodes on the Raft port, one in front of each node's HTTP port for
clients. Process faults are signals to node PIDs, or to one Raft group's engine
process inside a node (`kill-engine`). Clock faults rewrite the
node's libfaketime timestamp file. Disk faults strike the nodes whose disks
go bad in this campaign (a minority of every group: chaos/disks.py), but a
full disk, which strikes every node: bytes flipped in their stored records
(chaos/disks.py, `rot`), failed syncs, short and misdirected writes through
the nodes' write seam (chaos/disk_faults.py), and each data directory's own
small filesystem filled up (chaos/disks.py, `SmallDisks`). Every fault is recorded in the history as a
`start` and a `stop` event; the instants the checker measures failover from
(a leader killed, isolated, terminated, paused) are `mark` events taken just
before the action, and name the Raft groups the victim led.

A fault ends once it is healed, every node is back and ready, every Raft
group has a leader, and that leader has applied what it had committed (a
leader restarted replays its log first): its `stop` event. The nemesis then waits (up to
REBALANCE_WAIT_S) until leadership is balanced over the nodes before the next
fault, so that the checker can judge `leaders_rebalanced` on each fault alone.
"""

from __future__ import annotations

import glob
import http.client
import json
import os
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Callable, Iterator

from chaos import disk_faults
from chaos.checker import STALE_READER, balanced, leaders
from chaos.disks import Disks, rot
from chaos.history import History
from chaos.workload import READY_PATH
from raftq.engine.node import group_data_dir
from raftq.engine.placement import for_cluster
from raftq.server import REMOVED_EXIT

KINDS = (
    "isolate-leader", "partition-halves", "partition-islands", "partition-bridge",
    "slow-follower", "slow-leader", "flaky-link", "client-faults",
    "kill-leader", "kill-majority", "power-loss", "pause", "terminate-leader",
    "clock-jump", "membership", "kill-engine",
    "bit-rot", "bit-rot-stopped", "disk-full", "fsync-eio", "short-write", "misdirected-write",
)
DISK_KINDS = KINDS[KINDS.index("bit-rot"):]
LINK_TOXICS = ("bandwidth", "reset_peer", "limit_data", "slow_close", "timeout")
CLIENT_TOXICS = ("latency", "bandwidth", "reset_peer", "limit_data", "slow_close", "timeout")
CLOCK_OFFSETS_S = (-7200, -600, 600, 7200)
RECOVERY_S = 30.0
# How long a removed node may take to see its replicas moved away, leave group 0 and stop.
LEAVE_S = 120.0
# Longer than the checker's REBALANCE_S, so that a slow rebalance is measured rather than cut short.
REBALANCE_WAIT_S = 10.0
# A node stops whole once one of its engines dies: its other engines hand over first.
NODE_STOP_S = 60.0
# How long after a fault's end writes must be acknowledged again (the checker's
# writes_resume judges it; the nemesis probes that long and more before the next fault).
RESUME_PROBE_S = 30.0
# Calls a short-write fault cuts short, at most (each one counted in a file of its own).
SHORT_WRITES = 50
# How long a leader may take to replay its log after a restart (a slow, shared machine included).
CATCH_UP_S = 90.0
# A node leading several groups under load may take half a second to say so.
VIEW_TIMEOUT_S = 2.0
SLOW_FOLLOWER_MS = 200
# libfaketime re-reads the timestamp file once per cache period; a jump must
# last longer than that to be seen at all.
FAKETIME_CACHE_S = 1


@dataclass(frozen=True)
class Fault:
    kind: str
    hold_s: float
    gap_s: float
    params: dict = field(default_factory=dict, hash=False)


def _toxic(rng: random.Random, kinds: tuple[str, ...]) -> dict:
    kind = rng.choice(kinds)
    attributes = {
        "latency": {"latency": rng.choice((150, 300)), "jitter": 50},
        "bandwidth": {"rate": rng.choice((2, 20))},                # KB/s
        "reset_peer": {"timeout": rng.choice((0, 200))},
        "limit_data": {"bytes": rng.choice((300, 5000))},
        "slow_close": {"delay": 1000},
        "timeout": {"timeout": rng.choice((0, 1000))},
    }[kind]
    return {"type": kind, "stream": rng.choice(("upstream", "downstream")), "attributes": attributes}


def _params(kind: str, nodes: int, rng: random.Random) -> dict:
    order = list(range(nodes))
    rng.shuffle(order)
    majority = nodes // 2 + 1
    method = rng.choice(("disable", "blackhole"))
    if kind == "isolate-leader":
        return {"method": method}
    if kind == "partition-halves":
        return {"method": method, "sides": [sorted(order[:majority]), sorted(order[majority:])]}
    if kind == "partition-islands":
        # 1|1|1 on three nodes, 2|2|1 on five: no side has a majority
        sizes = [1, 1, 1] if nodes == 3 else [2, 2, 1]
        sides, at = [], 0
        for size in sizes:
            sides.append(sorted(order[at:at + size]))
            at += size
        return {"method": method, "sides": sides}
    if kind == "partition-bridge":
        # two sides that only the bridge node still joins
        rest = order[1:]
        half = len(rest) // 2
        return {"method": method, "bridge": order[0], "sides": [sorted(rest[:half]), sorted(rest[half:])]}
    if kind == "slow-follower":
        return {"pick": rng.random(), "jitter_ms": rng.choice((0, 20))}
    if kind == "slow-leader":
        return {"latency_ms": rng.choice((500, 800)), "jitter_ms": 50}
    if kind == "flaky-link":
        return {"pair": sorted(order[:2]), "toxic": _toxic(rng, LINK_TOXICS)}
    if kind == "client-faults":
        return {"leader": rng.random() < 0.5, "pick": rng.random(), "toxic": _toxic(rng, CLIENT_TOXICS)}
    if kind == "kill-leader":
        return {"times": 3, "down_s": round(rng.uniform(0.3, 1.5), 2)}
    if kind == "kill-majority":
        return {"victims": sorted(order[:majority]), "down_s": round(rng.uniform(1.0, 3.0), 2)}
    if kind == "power-loss":
        return {"everyone": rng.random() < 0.5, "pick": rng.random(), "down_s": round(rng.uniform(0.5, 2.0), 2)}
    if kind == "pause":
        return {"leader": rng.random() < 0.6, "pick": rng.random()}
    if kind == "terminate-leader":
        return {"down_s": round(rng.uniform(0.3, 1.5), 2)}
    if kind == "clock-jump":
        return {"leader": rng.random() < 0.5, "pick": rng.random(), "offset_s": rng.choice(CLOCK_OFFSETS_S)}
    if kind == "membership":
        return {"pick": rng.random(), "method": method}
    if kind == "kill-engine":
        # which Raft group (a fraction of G, known only on the live cluster), its leader's engine or a member's
        return {"group_pick": rng.random(), "leader": rng.random() < 0.7, "pick": rng.random(),
                "down_s": round(rng.uniform(0.3, 1.5), 2)}
    if kind == "disk-full":
        return {"headroom_kib": rng.choice((0, 64, 1024))}
    # the other disk faults: how many of the bad disks (a fraction), which first, whether group 0's
    # leader is handed to it first (a bad disk under the node that serves)
    bad = {"many": rng.random(), "pick": rng.random(), "leader": rng.random() < 0.5}
    if kind in ("bit-rot", "bit-rot-stopped"):
        bad.update(records=rng.randint(3, 12), snapshot=rng.random() < 0.3, seed=rng.randrange(1 << 32))
        if kind == "bit-rot-stopped":
            bad.update(power_cut=rng.random() < 0.5, down_s=round(rng.uniform(0.3, 1.5), 2))
        return bad
    if kind == "fsync-eio":
        return {**bad, "group_pick": rng.random()}
    if kind == "short-write":
        return bad
    if kind == "misdirected-write":
        return {**bad, "group_pick": rng.random(), "count": rng.randint(1, 3)}
    raise ValueError(f"unknown fault kind {kind!r}")


def plan(seed: int, nodes: int, cycles: int | None = None,
         kinds: tuple[str, ...] = KINDS) -> Iterator[Fault]:
    """The fault schedule for a seed: `cycles` shuffled rounds of `kinds` (forever if None)."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds: {sorted(unknown)}")
    rng = random.Random(seed)
    done = 0
    while cycles is None or done < cycles:
        order = list(kinds)
        rng.shuffle(order)
        for kind in order:
            hold = round(rng.uniform(4.0, 7.0) if kind == "slow-leader" else rng.uniform(2.0, 4.0), 2)
            yield Fault(kind, hold, round(rng.uniform(0.5, 1.5), 2), _params(kind, nodes, rng))
        done += 1


def _pick(candidates: list[str], pick: float) -> str:
    return candidates[min(int(pick * len(candidates)), len(candidates) - 1)]


# --- the means -----------------------------------------------------------------------

class Network:
    """Partitions and toxics on the Raft pair proxies and the HTTP proxies."""

    def __init__(self, client_factory: Callable, raft: dict[frozenset, str], http: dict[str, str]):
        self._client = client_factory
        self.raft = raft      # {frozenset({a, b}): proxy name}
        self.http = http      # {node: proxy name}

    def _proxy(self, name: str):
        return self._client().get_proxy(name)

    def cut(self, pairs: list[tuple[str, str]], method: str) -> None:
        """Sever each pair both ways: proxy down (refused), or a black hole (silence)."""
        for a, b in pairs:
            proxy = self._proxy(self.raft[frozenset((a, b))])
            if method == "disable":
                proxy.disable()
            else:
                for stream in ("upstream", "downstream"):
                    proxy.add_toxic(name=f"blackhole-{stream}", type="timeout", stream=stream,
                                    attributes={"timeout": 0})

    def slow(self, node: str, latency_ms: int, jitter_ms: int) -> None:
        for pair, name in self.raft.items():
            if node in pair:
                for stream in ("upstream", "downstream"):
                    self._proxy(name).add_toxic(name=f"slow-{stream}", type="latency", stream=stream,
                                                attributes={"latency": latency_ms, "jitter": jitter_ms})

    def toxic(self, proxy_name: str, toxic: dict) -> None:
        self._proxy(proxy_name).add_toxic(name="nemesis", **toxic)

    def heal(self) -> None:
        """Every proxy up, every toxic gone."""
        self._client().reset()

    def destroy(self) -> None:
        for name in [*self.raft.values(), *self.http.values()]:
            proxy = self._proxy(name)
            if proxy is not None:
                proxy.destroy()

    def pairs_touching(self, node: str) -> list[tuple[str, str]]:
        return [tuple(sorted(pair)) for pair in self.raft if node in pair]


def find_libfaketime() -> str | None:
    for pattern in ("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1",
                    "/usr/local/lib/faketime/libfaketime.so.1", "/usr/lib64/faketime/libfaketime.so.1"):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


class Clocks:
    """Per-node wall clocks under libfaketime, moved by rewriting a timestamp file.

    Only CLOCK_REALTIME is faked (FAKETIME_DONT_FAKE_MONOTONIC=1): real clocks
    jump, monotonic ones do not. libfaketime 0.9.10 also slows a threaded Python
    process down badly (dozens of needless elections a minute under load), so a
    node runs under it only while its own clock fault lasts.
    """

    def __init__(self, directory: Path, lib: str | None = None):
        self.lib = lib if lib is not None else find_libfaketime()
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def available(self) -> bool:
        return self.lib is not None

    def _file(self, node: str) -> Path:
        return self.directory / f"{node}.faketime"

    def env(self, node: str) -> dict[str, str]:
        """What a node process needs in its environment to run on this node's clock
        (besides chaos/node_site on PYTHONPATH, which chaos.power gives every node)."""
        return {"LD_PRELOAD": self.lib, "FAKETIME_TIMESTAMP_FILE": str(self._file(node)),
                "FAKETIME_CACHE_DURATION": str(FAKETIME_CACHE_S), "FAKETIME_DONT_FAKE_MONOTONIC": "1"}

    def set(self, node: str, offset_s: int) -> None:
        tmp = self._file(node).with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+d}\n")
        tmp.replace(self._file(node))  # libfaketime must never read a half-written file


def ready_with_groups(cluster, node: str) -> dict | None:
    """The node's /health/ready answer with each of its Raft groups' role, leader and
    term (`raft_groups`, given when asked); None when it does not answer."""
    try:
        conn = http.client.HTTPConnection(cluster.cfg.node(node).http, timeout=VIEW_TIMEOUT_S)
        try:
            conn.request("GET", READY_PATH, headers={"Accept": "application/json"})
            reply = conn.getresponse()
            view = json.loads(reply.read())
        finally:
            conn.close()
    except (OSError, http.client.HTTPException, ValueError):
        return None
    return view if reply.status in (200, 503) and isinstance(view, dict) else None


def cluster_views(cluster) -> dict[str, dict]:
    """/health/ready of every running node that answers."""
    views = {node: ready_with_groups(cluster, node) for node in cluster.ids if cluster.running(node)}
    return {node: view for node, view in views.items() if view is not None}


def wait_settled(cluster, raft_groups: int, timeout: float) -> bool:
    """Whether, within `timeout`, every node runs and is ready and every Raft group has a leader."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        views = cluster_views(cluster)
        if (len(views) == len(cluster.ids) and all(v.get("ready") for v in views.values())
                and len(leaders(views)) == raft_groups):
            return True
        time.sleep(0.1)
    return False


def _leader_positions(views: dict[str, dict]) -> dict[int, tuple[str, int | None, int | None]]:
    """Raft group -> (its leader, the leader's commit index, its applied index)."""
    out = {}
    for group, node in leaders(views).items():
        view = views[node]
        state = view.get("raft_groups", {}).get(str(group)) if view.get("raft_groups") else view
        out[group] = (node, (state or {}).get("commit_index"), (state or {}).get("applied_index"))
    return out


def wait_caught_up(cluster, raft_groups: int, timeout: float) -> float | None:
    """Seconds until each Raft group's leader has applied what it had committed when first seen
    (after a restart a leader replays its log before it answers a write); None: not in `timeout`."""
    started = time.monotonic()
    targets: dict[int, tuple[str, int]] = {}
    while time.monotonic() - started < timeout:
        positions = _leader_positions(cluster_views(cluster))
        for group, (node, commit, _) in positions.items():
            if commit is not None and targets.get(group, (None,))[0] != node:
                targets[group] = (node, commit)
        if len(targets) == raft_groups and all(
                positions.get(group, (None,))[0] == node and (positions[group][2] or 0) >= commit
                for group, (node, commit) in targets.items()):
            return round(time.monotonic() - started, 2)
        time.sleep(0.1)
    return None


# --- applying a schedule ------------------------------------------------------------------

class Nemesis:
    """Applies faults to a live cluster and records them.

    `cluster` is a chaos.runner.ChaosCluster (a LocalCluster that can start a
    node on a fake clock); `prober` (chaos.workload.Prober)
    measures failover by putting until a write is acknowledged; `admin` is a
    raftq Client for membership changes; `disks` (chaos/disks.py) what disk faults strike.
    """

    def __init__(self, cluster, network: Network, clocks: Clocks, history: History, prober, admin,
                 disks: Disks, log: Callable[[str], None] = print):
        self.cluster = cluster
        self.net = network
        self.clocks = clocks
        self.disks = disks
        self.history = history
        self.prober = prober
        self.admin = admin
        self.log = log
        self._faults = 0
        self.expected_up: set[str] = set(cluster.ids)
        self.placement = for_cluster(cluster.cfg)
        self.raft_groups = cluster.cfg.groups

    # ---- helpers ------------------------------------------------------------------------
    def leader(self, timeout: float = RECOVERY_S) -> str | None:
        return self.cluster.wait_for_leader(timeout)

    def views(self) -> dict[str, dict]:
        return cluster_views(self.cluster)

    def led_by(self, node: str) -> list[int]:
        """The Raft groups `node` leads now."""
        return sorted(group for group, leader in leaders(self.views()).items() if leader == node)

    def _wait_balanced(self, timeout: float = REBALANCE_WAIT_S) -> float | None:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if balanced(self.views(), self.raft_groups):
                return round(time.monotonic() - started, 2)
            time.sleep(0.1)
        return None

    def followers(self, leader: str | None) -> list[str]:
        return [n for n in self.cluster.ids if n != leader]

    def _mark(self, fault: int, **value) -> None:
        self.history.event("nemesis", f="mark", fault=fault, value=value)

    def _node_ids(self, indexes) -> list[str]:
        ids = self.cluster.ids
        return [ids[i] for i in indexes]

    def _start(self, node: str) -> None:
        self.cluster.start(node)
        self.expected_up.add(node)

    def _restart(self, node: str, *, faked: bool) -> None:
        """SIGTERM (a leader hands over first) and start again, on a fake clock or not."""
        self.expected_up.discard(node)
        self.cluster.stop(node)
        if faked:
            self.clocks.set(node, 0)
            self.cluster.faked.add(node)
        else:
            self.cluster.faked.discard(node)
        self._start(node)

    def _kill(self, node: str) -> None:
        self.expected_up.discard(node)
        self.cluster.kill(node)

    def _wait_ready(self, node: str, timeout: float = RECOVERY_S) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            view = self.cluster.ready_view(node, timeout=0.5)
            if view and view.get("ready"):
                return True
            time.sleep(0.1)
        return False

    # ---- one fault ----------------------------------------------------------------------------
    def apply(self, fault: Fault) -> None:
        time.sleep(fault.gap_s)
        self._check_processes()
        self._faults += 1
        fid = self._faults
        start = self.history.event("nemesis", f="start", fault=fid, kind=fault.kind,
                                   value={"hold_s": fault.hold_s, **fault.params})
        self.log(f"[{start['t']:7.1f}s] fault {fid}: {fault.kind} {fault.params}")
        details: dict = {}
        try:
            getattr(self, "_" + fault.kind.replace("-", "_"))(fid, fault, details)
        finally:
            self.heal()
            settled = wait_settled(self.cluster, self.raft_groups, RECOVERY_S)
            caught_up = wait_caught_up(self.cluster, self.raft_groups, CATCH_UP_S) if settled else None
            leader = self.leader()
            self.history.event("nemesis", f="stop", fault=fid, kind=fault.kind,
                               value={**details, "leader_after": leader, "settled": settled,
                                      "caught_up_s": caught_up})
            if not settled:
                self.log(f"  nodes not all ready, or a Raft group without a leader, {RECOVERY_S:.0f}s "
                         f"after healing fault {fid}")
            if self.prober.until_acked(f"resume-{fid}", range(self.raft_groups), timeout=RESUME_PROBE_S) is None:
                self.log(f"  writes not acknowledged in every Raft group {RESUME_PROBE_S:.0f}s after fault {fid}")
            balanced_after = self._wait_balanced()
            if balanced_after is None:
                self.log(f"  leaders not balanced {REBALANCE_WAIT_S:.0f}s after fault {fid}")

    def heal(self) -> None:
        """Undo every fault: links, toxics, disk faults armed, full disks, pauses, fake clocks,
        dead nodes."""
        self.net.heal()
        disk_faults.disarm(self.disks.control)
        if self.disks.small is not None and self.disks.small.filled:
            self.disks.small.grow()
        self._check_processes()
        for node in self.cluster.ids:
            self.cluster.signal(node, signal.SIGCONT)
            if node in self.cluster.faked:
                self._restart(node, faked=False)
            elif not self.cluster.running(node):
                self._start(node)

    def _check_processes(self) -> None:
        """A node that died without being killed is a crash: recorded, then restarted."""
        for node in sorted(self.expected_up):
            proc = self.cluster.procs.get(node)
            if proc is not None and proc.poll() is not None:
                self.history.event("crash", node=node, exit_code=proc.returncode)
                self.log(f"  node {node} exited by itself with status {proc.returncode}")
                self.cluster.procs.pop(node)
                self._start(node)

    def _wait_hold(self, started: float, fault: Fault) -> None:
        left = fault.hold_s - (time.monotonic() - started)
        if left > 0:
            time.sleep(left)

    def _mark_failover(self, fid: int, why: str, leader: str, since: float, groups: list[int],
                       stale: bool = False) -> None:
        """Mark, once the fault has taken effect, that failover of the Raft groups
        `leader` led (`groups`) is measured from `since` (just before it was
        applied); for an isolated leader, also start asking it for writes, and
        for reads (judged by no_stale_reads), until it refuses them."""
        stale_probe = None
        if stale:
            stale_probe = f"stale-{fid}"
            threading.Thread(target=self.prober.until_refused, args=(leader, stale_probe),
                             daemon=True).start()
            threading.Thread(target=self.prober.reads_until_refused, args=(leader, f"{STALE_READER}-{fid}"),
                             daemon=True).start()
        self._mark(fid, failover=why, leader=leader, since=since, raft_groups=groups, stale_probe=stale_probe)

    # ---- network faults --------------------------------------------------------------------------
    def _cut_sides(self, sides: list[list[str]], method: str) -> list[tuple[str, str]]:
        pairs = [(a, b) for i, x in enumerate(sides) for y in sides[i + 1:] for a in x for b in y]
        self.net.cut(pairs, method)
        return pairs

    def _isolate_leader(self, fid, fault, details):
        leader = self.leader()
        if leader is None:
            details["skipped"] = "no leader"
            return
        led = self.led_by(leader)
        started, since = time.monotonic(), self.history.now()
        self.net.cut(self.net.pairs_touching(leader), fault.params["method"])
        self._mark_failover(fid, "isolate", leader, since, led, stale=True)
        details["leader"] = leader
        details["acked_after_s"] = self.prober.until_acked(f"probe-{fid}", led)
        self._wait_hold(started, fault)

    def _partition(self, fid, fault, details):
        sides = [self._node_ids(side) for side in fault.params["sides"]]
        details["sides"] = sides
        started = time.monotonic()
        self._cut_sides(sides, fault.params["method"])
        self._wait_hold(started, fault)

    _partition_halves = _partition
    _partition_islands = _partition
    _partition_bridge = _partition

    def _slow_follower(self, fid, fault, details):
        leader = self.leader()
        follower = _pick(self.followers(leader), fault.params["pick"])
        details.update(leader=leader, follower=follower)
        started = time.monotonic()
        self.net.slow(follower, SLOW_FOLLOWER_MS, fault.params["jitter_ms"])
        self._wait_hold(started, fault)

    def _slow_leader(self, fid, fault, details):
        leader = self.leader()
        if leader is None:
            details["skipped"] = "no leader"
            return
        self.history.event("nemesis", f="mark", fault=fid, value={"slow_leader": leader})
        details["leader"] = leader
        started = time.monotonic()
        self.net.slow(leader, fault.params["latency_ms"], fault.params["jitter_ms"])
        self._wait_hold(started, fault)

    def _flaky_link(self, fid, fault, details):
        a, b = self._node_ids(fault.params["pair"])
        started = time.monotonic()
        self.net.toxic(self.net.raft[frozenset((a, b))], fault.params["toxic"])
        details["pair"] = [a, b]
        self._wait_hold(started, fault)

    def _client_faults(self, fid, fault, details):
        leader = self.leader()
        node = leader if fault.params["leader"] and leader else _pick(self.cluster.ids, fault.params["pick"])
        started = time.monotonic()
        self.net.toxic(self.net.http[node], fault.params["toxic"])
        details["node"] = node
        self._wait_hold(started, fault)

    # ---- process faults -----------------------------------------------------------------------------
    def _kill_leader(self, fid, fault, details):
        killed = []
        for _ in range(fault.params["times"]):
            leader = self.leader()
            if leader is None:
                break
            led = self.led_by(leader)
            since = self.history.now()
            self._kill(leader)
            self._mark_failover(fid, "kill", leader, since, led)
            killed.append(leader)
            self.prober.until_acked(f"probe-{fid}", led)
            time.sleep(fault.params["down_s"])
            self._start(leader)
            self._wait_ready(leader)
        details["killed"] = killed

    def _kill_majority(self, fid, fault, details):
        victims = self._node_ids(fault.params["victims"])
        started = time.monotonic()
        for node in victims:
            self._kill(node)
            time.sleep(0.2)
        details["killed"] = victims
        time.sleep(fault.params["down_s"])
        for node in victims:
            self._start(node)
        self._wait_hold(started, fault)

    def _power_loss(self, fid, fault, details):
        """kill -9 at one instant of the leader and enough others for a majority (or all):
        each kill is a power cut (chaos.power), so what they had not fsynced is gone."""
        leader = self.leader()
        others = self.followers(leader)
        if fault.params["everyone"] or leader is None:
            victims = list(self.cluster.ids)
        else:
            need = len(self.cluster.ids) // 2
            first = int(fault.params["pick"] * len(others)) % len(others)
            victims = [leader] + [others[(first + i) % len(others)] for i in range(need)]
        for node in victims:
            self.expected_up.discard(node)
            self.cluster.signal(node, signal.SIGKILL)
        for node in victims:
            self.cluster.kill(node)  # reaps; the SIGKILLs above landed together
        details["killed"] = victims
        time.sleep(fault.params["down_s"])
        for node in victims:
            self._start(node)

    def _pause(self, fid, fault, details):
        leader = self.leader()
        node = leader if fault.params["leader"] and leader else _pick(self.followers(leader), fault.params["pick"])
        led = self.led_by(node)
        started, since = time.monotonic(), self.history.now()
        self.cluster.signal(node, signal.SIGSTOP)
        details["paused"] = node
        if node == leader:
            self._mark_failover(fid, "pause", leader, since, led)
            self.prober.until_acked(f"probe-{fid}", led, timeout=fault.hold_s)
        self._wait_hold(started, fault)
        self.cluster.signal(node, signal.SIGCONT)

    def _terminate_leader(self, fid, fault, details):
        leader = self.leader()
        if leader is None:
            details["skipped"] = "no leader"
            return
        led = self.led_by(leader)
        since = self.history.now()
        self.expected_up.discard(leader)
        self.cluster.stop(leader)
        self._mark_failover(fid, "terminate", leader, since, led)
        details["stopped"] = leader
        self.prober.until_acked(f"probe-{fid}", led)
        time.sleep(fault.params["down_s"])
        self._start(leader)

    def _kill_engine(self, fid, fault, details):
        """kill -9 of one Raft group's engine process on one node (its leader's, or
        another member's): the node stops whole, its other engines handing over
        first; then it is started again, as after a crash."""
        group = min(int(fault.params["group_pick"] * self.raft_groups), self.raft_groups - 1)
        leader = leaders(self.views()).get(group)
        others = [m for m in self.placement.members(group) if m != leader]
        node = leader if fault.params["leader"] and leader else _pick(others, fault.params["pick"])
        pid = self.cluster.engine_pid(node, group)
        details.update(group=group, node=node, group_leader=leader)
        if pid is None:
            details["skipped"] = f"group {group}'s engine process on {node} not found"
            return
        led = self.led_by(node)
        since = self.history.now()
        self.expected_up.discard(node)
        os.kill(pid, signal.SIGKILL)
        details.update(pid=pid, led=led)
        if led:
            self._mark_failover(fid, "kill-engine", node, since, led)
            details["acked_after_s"] = self.prober.until_acked(f"probe-{fid}", led)
        status = self.cluster.wait_exit(node, NODE_STOP_S)
        details["node_exit"] = status
        if status is None:
            self.history.event("crash", node=node, exit_code=None,
                               why=f"kept running {NODE_STOP_S:.0f}s after group {group}'s engine was killed")
            self._kill(node)
        time.sleep(fault.params["down_s"])
        self._start(node)
        self._wait_ready(node)

    # ---- clocks and membership -----------------------------------------------------------------------------
    def _clock_jump(self, fid, fault, details):
        """Restart a node on a fake clock, let it lead if the plan says so, then jump
        its wall clock by offset_s, and back again."""
        if not self.clocks.available:
            details["skipped"] = "libfaketime is not installed"
            return
        node = _pick(self.cluster.ids, fault.params["pick"])
        self._restart(node, faked=True)
        details.update(node=node, offset_s=fault.params["offset_s"], ready=self._wait_ready(node))
        if fault.params["leader"]:
            details["election_forced"] = self._force_election(node)
        leader = self.leader()
        started = time.monotonic()
        self.clocks.set(node, fault.params["offset_s"])
        self._mark(fid, clock_jump=node, offset_s=fault.params["offset_s"], leader=leader)
        details["led_when_jumped"] = leader == node
        time.sleep(2 * FAKETIME_CACHE_S)
        details["observed_skew_s"] = self._wall_skew(node)
        time.sleep(max(0.0, fault.hold_s - 2 * FAKETIME_CACHE_S))
        self.clocks.set(node, 0)   # a second jump, the other way
        time.sleep(2 * FAKETIME_CACHE_S)
        self._wait_hold(started, fault)
        self._restart(node, faked=False)

    def _wall_skew(self, node: str) -> float | None:
        """How far the node's wall clock is from ours, read from its HTTP Date header."""
        try:
            conn = http.client.HTTPConnection(self.cluster.cfg.node(node).http, timeout=5)
            conn.request("GET", "/health/live")
            reply = conn.getresponse()
            reply.read()
            conn.close()
            return round(parsedate_to_datetime(reply.getheader("Date")).timestamp() - time.time())
        except (OSError, http.client.HTTPException, TypeError, ValueError):
            return None

    def _remove_and_return(self, node: str, details: dict) -> None:
        """`raftq cluster remove` of a running node: its replicas move away, it leaves group 0 and
        stops with REMOVED_EXIT (not a crash); then `raftq cluster add` and a start with the data
        it kept (a lagging follower to Raft; the groups it held were removed with their replicas)."""
        details["node"] = node
        self.expected_up.discard(node)
        started = time.monotonic()
        if self._change_membership("remove-node", node, details):
            proc = self.cluster.procs.get(node)
            try:
                code = proc.wait(LEAVE_S) if proc is not None else None
            except subprocess.TimeoutExpired:
                code = None
            details["left_after_s"] = round(time.monotonic() - started, 2)
            details["exit_code"] = code
            if code == REMOVED_EXIT:
                self.cluster.procs.pop(node)
                self._change_membership("add-node", node, details)
            else:
                self.log(f"  {node} did not stop as removed within {LEAVE_S:.0f}s (exit status {code})")
        if not self.cluster.running(node):
            self._start(node)
        self.expected_up.add(node)

    def _change_membership(self, f: str, node: str, details: dict) -> bool:
        """`raftq cluster remove` (f "remove-node") or `add` of `node`, recorded; whether it was done."""
        spec = self.cluster.cfg.node(node)
        call = (lambda: self.admin.remove_node(node)) if f == "remove-node" else \
            (lambda: self.admin.add_node(node, spec.raft, spec.http))
        op = self.history.invoke("nemesis", f, {"node": node})
        try:
            result = call()
        except Exception as exc:  # recorded: a refused change is a finding, not a crash of the run
            self.history.complete(op, "info", error=f"{type(exc).__name__}: {exc}")
            details[f] = f"failed: {exc}"
            return False
        self.history.complete(op, "ok", result)
        details[f] = "ok"
        return True

    def _force_election(self, node: str) -> bool:
        """Pause whoever leads for a moment, so that `node` may win the election.

        Best effort: a node slowed by libfaketime seldom wins, and whether it
        led when its clock jumped is recorded (led_when_jumped)."""
        leader = self.leader()
        if leader is None or leader == node:
            return False
        self.cluster.signal(leader, signal.SIGSTOP)
        time.sleep(1.0)
        self.cluster.signal(leader, signal.SIGCONT)
        return True

    def _membership(self, fid, fault, details):
        """One group: cut a follower off, remove it and add it back while it is cut off, then
        heal. Several groups, where a removal first moves the node's replicas away: remove a
        follower, let it leave and stop by itself, then add it back and start it."""
        leader = self.leader()
        if leader is None:
            details["skipped"] = "no leader"
            return
        node = _pick(self.followers(leader), fault.params["pick"])
        if self.raft_groups > 1:
            self._remove_and_return(node, details)
            return
        started = time.monotonic()
        self.net.cut(self.net.pairs_touching(node), fault.params["method"])
        details["node"] = node
        if self._change_membership("remove-node", node, details):
            self._change_membership("add-node", node, details)
        self._wait_hold(started, fault)

    # ---- disk faults -------------------------------------------------------------------------------------
    def _bad_disks(self, fault: Fault, details: dict) -> list[str]:
        """The nodes a disk fault strikes: some of the bad disks' (at least one), and group 0's
        leadership handed to the first of them first if the plan says so."""
        bad = self.disks.bad
        if not bad:
            details["skipped"] = "no disk may go bad: no Raft group has replicas enough for a minority"
            return []
        first = int(fault.params["pick"] * len(bad)) % len(bad)
        victims = [bad[(first + i) % len(bad)] for i in range(1 + min(int(fault.params["many"] * len(bad)),
                                                                     len(bad) - 1))]
        details["victims"] = victims
        if fault.params["leader"]:
            details["lead"] = self._hand_lead_to(victims[0])
        return victims

    def _hand_lead_to(self, node: str) -> str:
        leader = self.leader()
        if leader == node:
            return f"{node} led"
        try:
            moved = self.admin.transfer_leadership(node)
        except Exception as exc:   # recorded: the fault goes on wherever the lead is
            return f"not handed to {node}: {exc}"
        return f"handed to {node}" if moved.get("leader") == node else f"{moved.get('leader')} took it, not {node}"

    def _engine_dir(self, node: str, group: int) -> Path:
        return group_data_dir(self.disks.root / node, group) / "raft"

    def _group_of(self, fault: Fault, victims: list[str]) -> tuple[int, list[str]]:
        """The Raft group the plan picks, and those of `victims` that hold a replica of it."""
        group = min(int(fault.params["group_pick"] * self.raft_groups), self.raft_groups - 1)
        return group, [node for node in victims if node in self.placement.members(group)]

    def _rot(self, fid: int, fault: Fault, victims: list[str], details: dict) -> None:
        rng = random.Random(fault.params["seed"])
        flips = {node: rot(self.disks.root / node, rng, fault.params["records"], snapshot=fault.params["snapshot"])
                 for node in victims}
        self._mark(fid, flips={node: [flip.as_dict() for flip in done] for node, done in flips.items()})
        details["flipped"] = {node: len(done) for node, done in flips.items()}

    def _bit_rot(self, fid, fault, details):
        """Bytes flipped in live records of running nodes' journals and snapshots."""
        victims = self._bad_disks(fault, details)
        started = time.monotonic()
        if victims:
            self._rot(fid, fault, victims, details)
            self._wait_hold(started, fault)

    def _bit_rot_stopped(self, fid, fault, details):
        """The same while the nodes are down (after a power cut, or stopped), then started again:
        start-up finds it."""
        victims = self._bad_disks(fault, details)
        if not victims:
            return
        for node in victims:
            if fault.params["power_cut"]:
                self._kill(node)
            else:
                self.expected_up.discard(node)
                self.cluster.stop(node)
        self._rot(fid, fault, victims, details)
        time.sleep(fault.params["down_s"])
        for node in victims:
            self._start(node)

    def _disk_full(self, fid, fault, details):
        """Every node's data directory's filesystem shrunk to what its files take (plus a little),
        for the hold; grown back as it heals."""
        if self.disks.small is None:
            details["skipped"] = self.disks.why_not or "no small filesystems"
            return
        started = time.monotonic()
        details["free_bytes"] = self.disks.small.fill(fault.params["headroom_kib"] * 1024)
        self._wait_hold(started, fault)

    def _seam(self, fid: int, fault: Fault, faults: dict[str, dict], details: dict) -> dict[str, int] | None:
        """Arm `faults` (node -> the seam's fault) for the hold, or until each with a count used
        it up: the calls each hit, or None if there was nothing to arm (the skip goes to details)."""
        if not faults:
            details.setdefault("skipped", "no bad disk holds a replica of the Raft group picked")
            return None
        ids = {node: f"{fid}-{node}" for node in faults}
        started = time.monotonic()
        disk_faults.arm(self.disks.control, *[{**f, "id": ids[node]} for node, f in faults.items()])
        while time.monotonic() - started < fault.hold_s and not all(
                "count" in f and disk_faults.hits(self.disks.control, ids[node]) >= f["count"]
                for node, f in faults.items()):
            time.sleep(0.05)
        disk_faults.disarm(self.disks.control)
        return {node: disk_faults.hits(self.disks.control, ids[node]) for node in faults}

    def _fsync_eio(self, fid, fault, details):
        """One fsync or fdatasync of a Raft group's engine fails with EIO: it stops and is started again."""
        group, victims = self._group_of(fault, self._bad_disks(fault, details))
        details["group"] = group
        failed = self._seam(fid, fault, {node: {"kind": "sync_eio", "path": f"{self._engine_dir(node, group)}/",
                                                "count": 1} for node in victims}, details)
        if failed is not None:
            details["sync_failed"] = failed

    def _short_write(self, fid, fault, details):
        """The nodes' writes come up short (every file of theirs), for the hold."""
        hits = self._seam(fid, fault, {node: {"kind": "short_write", "path": f"{self.disks.root / node}/",
                                              "count": SHORT_WRITES}
                                       for node in self._bad_disks(fault, details)}, details)
        if hits is not None:
            details["hits"] = hits

    def _misdirected_write(self, fid, fault, details):
        """A few writes to a Raft group's journal segments land over the record before them."""
        group, victims = self._group_of(fault, self._bad_disks(fault, details))
        details["group"] = group
        hits = self._seam(fid, fault, {node: {"kind": "misdirect", "path": f"{self._engine_dir(node, group)}/journal/seg-",
                                              "count": fault.params["count"]}
                                       for node in victims}, details)
        if hits is not None:
            details["hits"] = hits
