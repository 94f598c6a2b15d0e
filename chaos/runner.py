"""A chaos campaign, end to end: cluster, proxies, workload, faults, healing, verdicts.

Theory of operation
-------------------
1. A Toxiproxy server starts (chaos/toxiproxy.py, or a real one: see
   `start_toxiproxy`). For every pair of nodes it gets one proxy on the Raft
   port, pointed at the node that *accepts* that pair's connection; the other
   node, the one pysyncobj makes dial (its `raft` string sorts higher), is told
   in cluster.toml to dial the proxy instead (`[[links]]`, engine/config.py).
   The nodes still know each other by their real Raft addresses, so cutting a
   pair's proxy cuts exactly that pair. Each node's HTTP port gets a proxy too,
   and clients only ever use those.
2. The nodes start as real processes (raftq.local.LocalCluster), running
   production code; every kill -9 is made a power cut (chaos/power.py): the
   node's journal segments are cut back to what its fsyncs covered. A clock fault restarts its node under libfaketime for the
   length of the fault (chaos/nemesis.py, `Clocks`). With disk faults among
   the kinds, the nodes load the write seam's fault injector
   (chaos/disk_faults.py), scrub their live entries every SCRUB_PASS_HOURS
   (so that damage is found within a fault or two, as a day's pass finds it
   on a real disk), and with `disk-full` each data directory is a tmpfs of
   its own (chaos/disks.py), unmounted at the end whatever happens. With `groups` > 1 the
   cluster has that many Raft groups (issue 24): each node's supervisor runs
   one engine process per group it is a member of, all behind its one Raft
   port, so the pair proxies carry every group's traffic.
3. Queues are created (at least one work queue and one probe queue per Raft
   group: each new name goes to the group holding fewest), the routing is read
   and recorded (queue -> group; the checker reports per group), the monitor
   starts sampling every node, producers and
   consumers start (chaos/workload.py), and after a fault-free stretch the
   nemesis applies its seeded schedule: each fault, its hold, healing, and a
   wait for a leader before the next. With `load_at_birth` the monitor,
   producers and consumers start together with the node processes, before
   any leader exists, so a cluster's first moments are under load too; the
   queues then come into being with their first put, each with its default
   group only (a group added later would not see what was acked before it).
4. Then everything is healed, the workload runs fault-free for a moment and
   stops, every group is drained, replicas are verified over HTTP and with the
   CLI, and the nodes' logs are scanned for lines the checker judges.
5. The checker (chaos/checker.py) turns the history into verdicts; history,
   verdicts, summary and a timeline plot go to the results folder.

Every process started here (nodes, proxy server) is stopped here by PID,
whatever happens.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from dataclasses import dataclass, replace
from itertools import combinations
from pathlib import Path
from typing import Callable

from chaos import backlog
from chaos.checker import GIVE_UP, Report, check, render
from chaos.disks import Disks, SmallDisks, bad_disks
from chaos.history import History
from chaos.nemesis import DISK_KINDS, KINDS, Clocks, Nemesis, Network, plan, wait_settled
from chaos.power import PowerCutCluster
from chaos.toxiproxy import ToxiproxyServer, start_toxiproxy
from chaos.workload import (BACKOFF, PROBE_QUEUE_PREFIX, Endpoints, Monitor, Prober, Workload, churn_queues,
                            drain, placement, verify)
from raftq.client import Client
from raftq.engine.config import Link
from raftq.engine.placement import for_cluster
from raftq.local import LocalCluster, free_ports

CONSUMER_GROUPS = ["default", "audit"]
FANOUT_QUEUES = 2          # the first work queues are read by every consumer group, the others by "default"
JUDGED_LOG_LEVELS = ("critical",)
ROUTING_WAIT_S = 30.0
# With disk faults: a scrubber's pass over every live entry each 36 s (at most 4 MiB/s)
SCRUB_PASS_HOURS = 0.01


@dataclass
class Options:
    nodes: int = 3
    minutes: float | None = None     # stop starting faults after this long ...
    cycles: int | None = None        # ... or after this many rounds of every kind
    seed: int | None = None
    kinds: tuple[str, ...] = KINDS
    out: Path = Path("results")
    producers: int = 4
    consumers_per_group: int = 2
    lease_ms: int = 2000
    calm_s: float = 3.0              # fault-free time before the first fault and after the last
    load_at_birth: bool = False      # clients start with the node processes, not once a leader exists
    groups: int = 1                  # Raft groups (issue 24)
    replicas: int | None = None      # members of each group but group 0 (None: the default)
    backlog: int = 0                 # messages stored before the faults and read back after them (chaos/backlog.py)


def work_queues(raft_groups: int) -> list[str]:
    """At least one work queue per Raft group: queues go to the group holding fewest."""
    return [f"chaos-{i}" for i in range(max(FANOUT_QUEUES, raft_groups))]


def probe_queues(raft_groups: int) -> list[str]:
    return [f"{PROBE_QUEUE_PREFIX}{i}" for i in range(raft_groups)]


class ChaosCluster(PowerCutCluster):
    """A cluster whose every kill -9 is a power cut, and that can start chosen
    nodes on a fake clock (those in `faked`), and with their write seam's disk faults armed
    through `disk_control` (when set)."""

    clocks: Clocks
    faked: set[str]
    disk_control: Path | None = None

    def node_env(self, node_id: str) -> dict[str, str]:
        env = {"RAFTQ_DISK_FAULTS": str(self.disk_control)} if self.disk_control else {}
        return {**env, **(self.clocks.env(node_id) if node_id in self.faked else {})}

    def engine_pid(self, node_id: str, group: int, timeout: float = 5.0) -> int | None:
        """The PID of Raft group `group`'s engine process in the running node: the
        child of the node's supervisor that logged as that group's engine."""
        deadline = time.monotonic() + timeout
        while True:
            node_pid = self.pid(node_id)
            if node_pid is None:
                return None
            try:
                children = {int(p) for p in Path(f"/proc/{node_pid}/task/{node_pid}/children").read_text().split()}
            except OSError:
                return None
            for line in reversed(self.log_path(node_id).read_text(errors="replace").splitlines()):
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict) and entry.get("group") == group and entry.get("pid") in children:
                    return entry["pid"]
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)   # a group's engine may not have logged yet

    def wait_exit(self, node_id: str, timeout: float) -> int | None:
        """The exit status of a node stopping by itself, once it has (None: still running)."""
        proc = self.procs[node_id]
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        del self.procs[node_id]
        self._forget_pid(node_id)
        return proc.returncode


def wire_proxies(server: ToxiproxyServer, cluster: LocalCluster) -> tuple[Network, Endpoints]:
    """One proxy per node pair on the Raft ports and one per node on HTTP; links in cluster.toml."""
    client = server.client()
    raft, http, links, client_urls = {}, {}, [], {}
    pairs = list(combinations(cluster.cfg.nodes, 2))
    # A node's ports are free whenever it is down; a proxy listening on port 0
    # could be given one of them and keep that node from ever starting again.
    node_ports = {int(addr.rsplit(":", 1)[1]) for spec in cluster.cfg.nodes for addr in (spec.raft, spec.http)}
    listen_ports = iter(free_ports(len(pairs) + len(cluster.cfg.nodes), avoid=node_ports))
    for a, b in pairs:
        dialer, acceptor = (a, b) if a.raft > b.raft else (b, a)  # pysyncobj's rule
        name = f"raft-{dialer.id}-{acceptor.id}"
        proxy = client.create(upstream=acceptor.raft, name=name, listen=f"127.0.0.1:{next(listen_ports)}")
        raft[frozenset((a.id, b.id))] = name
        links.append(Link(source=dialer.id, target=acceptor.id, dial=proxy.listen))
    for spec in cluster.cfg.nodes:
        name = f"http-{spec.id}"
        proxy = client.create(upstream=spec.http, name=name, listen=f"127.0.0.1:{next(listen_ports)}")
        http[spec.id] = name
        client_urls[spec.id] = f"http://{proxy.listen}"
    cluster.cfg = replace(cluster.cfg, links=tuple(links))
    cluster.write_config()
    direct = {nid: cluster.url(nid) for nid in cluster.ids}
    return Network(server.client, raft, http), Endpoints(client_urls, direct, cluster.token)


def create_queues(urls: list[str], queues: dict[str, list[str]], lease_ms: int, token: str | None,
                  backoff: dict | None = None) -> None:
    """Create the queues in order (each goes to the Raft group holding fewest), with the back-off
    policy `backoff`, and their groups."""
    with Client(urls, retry_for=30, token=token) as client:
        for queue, groups in queues.items():
            client.create_queue(queue, lease_ms=lease_ms, backoff=backoff)
            for group in groups:
                if group != "default":
                    client.add_group(queue, group, start="earliest")


def read_routing(urls: list[str], token: str | None, queues: list[str]) -> dict[str, int]:
    """queue -> Raft group once every one of `queues` is assigned (their first put
    creates them when the load starts with the nodes)."""
    deadline = time.monotonic() + ROUTING_WAIT_S
    with Client(urls, retry_for=15, token=token) as client:
        while True:
            routing = client.routing()
            if routing["group_count"] == 1:
                return {queue: 0 for queue in queues}   # no catalog: every queue is group 0's
            if all(q in routing["queues"] for q in queues) or time.monotonic() > deadline:
                return routing["queues"]
            time.sleep(0.2)


def scan_logs(cluster: LocalCluster, history: History) -> None:
    """Record the node log lines the checker judges (truncations, critical errors, entries given
    up to damage), each with its wall clock."""
    for nid in cluster.ids:
        path = cluster.log_path(nid)
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue   # tracebacks and stray output; the JSON line before them tells the story
            if isinstance(entry, dict) and (entry.get("level") in JUDGED_LOG_LEVELS
                                            or GIVE_UP.search(str(entry.get("msg", "")))):
                history.event("log", node=nid, level=entry["level"], line=entry.get("msg", ""), ts=entry.get("ts"))


def prepare_disks(cluster: ChaosCluster, seed: int, kinds: tuple[str, ...], log: Callable[[str], None]) -> Disks:
    """What the campaign's disk faults strike: the nodes whose disks go bad, the seam's control
    file (loaded by the nodes if any kind uses the seam), each data directory's own tmpfs (if
    the disk-full kind is in), and a scrubber fast enough to find damage between faults."""
    placement = for_cluster(cluster.cfg)
    smallest = min(len(placement.members(group)) for group in range(cluster.cfg.groups))
    disks = Disks(root=cluster.root, bad=bad_disks(seed, cluster.ids, smallest), control=cluster.root / "disk-faults.json")
    if not set(kinds) & set(DISK_KINDS):
        return disks
    cluster.disk_control = disks.control
    cluster.node_args += ("--scrub-pass-hours", str(SCRUB_PASS_HOURS))
    log(f"chaos: disks that go bad: {', '.join(disks.bad) or 'none'}")
    if "disk-full" in kinds:
        small = SmallDisks(cluster.root, cluster.ids, cluster.cfg.groups)
        disks.why_not = small.mount()
        disks.small = None if disks.why_not else small
        if disks.why_not:
            log(f"chaos: {disks.why_not}; the disk-full fault is skipped")
    return disks


def run(options: Options, log: Callable[[str], None] = print) -> Report:
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(1 << 32)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results = Path(options.out).resolve() / f"{stamp}-n{options.nodes}-g{options.groups}-seed{seed}"
    results.mkdir(parents=True, exist_ok=True)
    log(f"chaos: seed {seed}, {options.nodes} nodes, {options.groups} Raft group(s); reproduce the schedule with "
        f"python -m chaos run --nodes {options.nodes} --groups {options.groups} --seed {seed}"
        + (f" --replicas {options.replicas}" if options.replicas else "")
        + (f" --minutes {options.minutes}" if options.minutes else f" --cycles {options.cycles}")
        + (" --load-at-birth" if options.load_at_birth else "")
        + (f" --backlog {options.backlog}" if options.backlog else ""))
    log(f"chaos: results in {results}")
    history = History(results / "history.jsonl")
    started = time.monotonic()
    with open(results / "toxiproxy.log", "wb") as proxy_log:
        server = start_toxiproxy(seed=seed, stderr=proxy_log)
        cluster = network = disks = None
        try:
            cluster = ChaosCluster.create(results / "cluster", options.nodes, groups=options.groups,
                                          replicas=options.replicas)
            cluster.clocks, cluster.faked = Clocks(results / "clocks"), set()
            disks = prepare_disks(cluster, seed, options.kinds, log)
            network, endpoints = wire_proxies(server, cluster)
            _campaign(options, seed, cluster, network, endpoints, history, disks, log)
        finally:
            try:
                if cluster is not None:
                    cluster.close()
                    scan_logs(cluster, history)
            finally:   # what it mounted is unmounted even if stopping the nodes failed
                if disks is not None and disks.small is not None:
                    for problem in disks.small.unmount():
                        log(f"chaos: {problem}")
                if network is not None and server.process is None:
                    network.destroy()   # someone else's server: leave it as we found it
                server.stop()
                history.close()
    report = check(history.events)
    report.summary["duration_s"] = round(time.monotonic() - started, 1)
    text = render(report)
    (results / "verdicts.txt").write_text(text + "\n")
    (results / "summary.json").write_text(json.dumps(report.summary, indent=2, default=str) + "\n")
    try:
        from chaos.plot import timeline
        timeline(history.events, results / "timeline.png", title=f"{options.nodes} nodes, {options.groups} Raft group(s), seed {seed}")
    except ImportError:
        log("chaos: matplotlib is not installed (pip install raftq[plot]); no timeline.png")
    log(text)
    return report


def _record_routing(history: History, urls: list[str], token: str | None, work: list[str], probes: list[str],
                    raft_groups: int, log: Callable[[str], None]) -> tuple[dict[int, str], str]:
    """Record and print which Raft group holds each queue; the probe queue of each group,
    and a work queue of group 0 (which the leader faults' victim always leads) for the
    reads sent to an isolated leader."""
    routing = read_routing(urls, token, [*work, *probes])
    history.event("routing", queues={q: routing[q] for q in [*work, *probes] if q in routing})
    for group in range(raft_groups):
        log(f"chaos: Raft group {group} holds " + (", ".join(q for q in [*work, *probes] if routing.get(q) == group)
                                                   or "no queue"))
    probe_of = {routing[q]: q for q in probes if q in routing}
    if sorted(probe_of) != list(range(raft_groups)) or {routing.get(q) for q in work} != set(range(raft_groups)):
        raise RuntimeError(f"the queues do not cover every Raft group once: {routing}")
    return probe_of, next(q for q in work if routing[q] == 0)


def _campaign(options: Options, seed: int, cluster: ChaosCluster, network: Network, endpoints: Endpoints,
              history: History, disks: Disks, log: Callable[[str], None]) -> None:
    if not cluster.clocks.available:
        log("chaos: libfaketime not found (apt-get install faketime); clock faults are skipped")
    work, probes = work_queues(options.groups), probe_queues(options.groups)
    queues = {queue: ["default"] if options.load_at_birth or i >= FANOUT_QUEUES else list(CONSUMER_GROUPS)
              for i, queue in enumerate(work)}
    queues.update({queue: ["default"] for queue in probes})
    urls = list(endpoints.direct.values())
    if not options.load_at_birth:
        cluster.start()
        if not wait_settled(cluster, options.groups, 60):
            raise RuntimeError(f"not every Raft group elected a leader; see the node logs in {cluster.root}")
        create_queues(urls, {q: queues[q] for q in work}, options.lease_ms, cluster.token, BACKOFF)
        create_queues(urls, {q: queues[q] for q in probes}, options.lease_ms, cluster.token)
    workload = Workload(history, endpoints, {q: queues[q] for q in work},
                        seed=seed, lease_ms=options.lease_ms, producers=options.producers,
                        consumers_per_group=options.consumers_per_group,
                        eager_first_put=options.load_at_birth, churn=churn_queues(options.groups))
    # the work queues back off as BACKOFF says; made by their first puts (load at birth), they do not
    backoff = {} if options.load_at_birth else {queue: BACKOFF for queue in work}
    history.event("setup", seed=seed, nodes=options.nodes, raft_groups=options.groups,
                  replicas=cluster.cfg.replicas_per_group, queues=queues, lease_ms=options.lease_ms, backoff=backoff,
                  producers=workload.producer_names, kinds=list(options.kinds),
                  faketime=cluster.clocks.available, load_at_birth=options.load_at_birth, bad_disks=disks.bad,
                  wall_ms_at_t0=round(time.time() * 1000 - history.now() * 1000))
    monitor = Monitor(history, endpoints)
    monitor.start()
    workload.start()
    if options.load_at_birth:
        cluster.start()
        if not wait_settled(cluster, options.groups, 60):
            raise RuntimeError(f"not every Raft group elected a leader; see the node logs in {cluster.root}")
    try:
        if options.load_at_birth:
            read_routing(urls, cluster.token, work)     # the first puts made the work queues
            create_queues(urls, {queue: ["default"] for queue in probes}, options.lease_ms, cluster.token)
        probe_of, read_queue = _record_routing(history, urls, cluster.token, work, probes, options.groups, log)
        if options.backlog:
            backlog.fill(urls, cluster.token, options.backlog, history, log)
        with Client(urls, retry_for=15, timeout=5, token=cluster.token) as admin:
            nemesis = Nemesis(cluster, network, cluster.clocks, history,
                              Prober(history, endpoints, probe_of, read_queue), admin, disks, log)
            try:
                time.sleep(options.calm_s)
                deadline = time.monotonic() + options.minutes * 60 if options.minutes else None
                for fault in plan(seed, options.nodes, options.cycles, options.kinds):
                    if deadline is not None and time.monotonic() >= deadline:
                        break
                    nemesis.apply(fault)
            finally:
                nemesis.heal()
            nemesis.leader()
            time.sleep(options.calm_s)
            workload.stop()
            if workload.churn:
                history.event("churn", queues=workload.churn, answers=workload.churn_answers)
            log(f"[{history.now():7.1f}s] faults over; draining")
            if not drain(history, endpoints, queues):
                log("chaos: the queues did not drain; messages still stored count as lost")
            leader = nemesis.leader()
            if leader is not None:
                verify(history, endpoints, leader)
            if workload.churn:
                placement(history, endpoints, leader or endpoints.ids[0], workload.churn, options.groups)
            if options.backlog:
                backlog.read_back(urls, cluster.token, options.backlog, history, log)
    finally:
        workload.stop()
        monitor.stop()
