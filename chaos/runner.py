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
   length of the fault (chaos/nemesis.py, `Clocks`).
3. Queues are created, the monitor starts sampling every node, producers and
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
import time
from dataclasses import dataclass, replace
from itertools import combinations
from pathlib import Path
from typing import Callable

from chaos.checker import Report, check, render
from chaos.history import History
from chaos.nemesis import KINDS, Clocks, Nemesis, Network, plan
from chaos.power import PowerCutCluster
from chaos.toxiproxy import ToxiproxyServer, start_toxiproxy
from chaos.workload import PROBE_QUEUE, Endpoints, Monitor, Prober, Workload, drain, verify
from raftq.client import Client
from engine.config import Link
from raftq.local import LocalCluster, free_ports

GROUPS = ["default", "audit"]
WORK_QUEUES = ["chaos-0", "chaos-1"]
JUDGED_LOG_LEVELS = ("critical",)


@dataclass
class Options:
    nodes: int = 3
    groups: int = 1                  # Raft groups (every fault hits every group of the nodes it hits)
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


class ChaosCluster(PowerCutCluster):
    """A cluster whose every kill -9 is a power cut, and that can start chosen
    nodes on a fake clock (those in `faked`)."""

    clocks: Clocks
    faked: set[str]

    def node_env(self, node_id: str) -> dict[str, str]:
        return self.clocks.env(node_id) if node_id in self.faked else {}


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


def create_queues(urls: list[str], lease_ms: int, token: str | None) -> dict[str, list[str]]:
    queues = {q: list(GROUPS) for q in WORK_QUEUES}
    queues[PROBE_QUEUE] = ["default"]
    with Client(urls, retry_for=30, token=token) as client:
        for queue, groups in queues.items():
            client.create_queue(queue, lease_ms=lease_ms)
            for group in groups:
                if group != "default":
                    client.add_group(queue, group, start="earliest")
    return queues


def scan_logs(cluster: LocalCluster, history: History) -> None:
    """Record the node log lines the checker judges (truncations, critical errors)."""
    for nid in cluster.ids:
        path = cluster.log_path(nid)
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue   # tracebacks and stray output; the JSON line before them tells the story
            if isinstance(entry, dict) and entry.get("level") in JUDGED_LOG_LEVELS:
                history.event("log", node=nid, level=entry["level"], line=entry.get("msg", ""))


def run(options: Options, log: Callable[[str], None] = print) -> Report:
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(1 << 32)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results = Path(options.out).resolve() / f"{stamp}-n{options.nodes}-seed{seed}"
    results.mkdir(parents=True, exist_ok=True)
    log(f"chaos: seed {seed}, {options.nodes} nodes; reproduce the schedule with "
        f"python -m chaos run --nodes {options.nodes} --seed {seed}"
        + (f" --minutes {options.minutes}" if options.minutes else f" --cycles {options.cycles}")
        + (f" --groups {options.groups}" if options.groups != 1 else "")
        + (" --load-at-birth" if options.load_at_birth else ""))
    log(f"chaos: results in {results}")
    history = History(results / "history.jsonl")
    started = time.monotonic()
    with open(results / "toxiproxy.log", "wb") as proxy_log:
        server = start_toxiproxy(seed=seed, stderr=proxy_log)
        cluster = network = None
        try:
            cluster = ChaosCluster.create(results / "cluster", options.nodes, groups=options.groups)
            cluster.clocks, cluster.faked = Clocks(results / "clocks"), set()
            network, endpoints = wire_proxies(server, cluster)
            _campaign(options, seed, cluster, network, endpoints, history, log)
        finally:
            if cluster is not None:
                cluster.close()
                scan_logs(cluster, history)
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
        timeline(history.events, results / "timeline.png", title=f"{options.nodes} nodes, seed {seed}")
    except ImportError:
        log("chaos: matplotlib is not installed (pip install raftq[plot]); no timeline.png")
    log(text)
    return report


def _campaign(options: Options, seed: int, cluster: ChaosCluster, network: Network, endpoints: Endpoints,
              history: History, log: Callable[[str], None]) -> None:
    if not cluster.clocks.available:
        log("chaos: libfaketime not found (apt-get install faketime); clock faults are skipped")
    if options.load_at_birth:
        queues = {queue: ["default"] for queue in [*WORK_QUEUES, PROBE_QUEUE]}
    else:
        cluster.start()
        if cluster.wait_for_leader(60) is None:
            raise RuntimeError(f"no leader elected; see the node logs in {cluster.root}")
        queues = create_queues(list(endpoints.direct.values()), options.lease_ms, cluster.token)
    workload = Workload(history, endpoints, {q: g for q, g in queues.items() if q != PROBE_QUEUE},
                        seed=seed, lease_ms=options.lease_ms, producers=options.producers,
                        consumers_per_group=options.consumers_per_group,
                        eager_first_put=options.load_at_birth)
    history.event("setup", seed=seed, nodes=options.nodes, queues=queues, lease_ms=options.lease_ms,
                  producers=workload.producer_names, kinds=list(options.kinds),
                  faketime=cluster.clocks.available, load_at_birth=options.load_at_birth,
                  wall_ms_at_t0=round(time.time() * 1000 - history.now() * 1000))
    monitor = Monitor(history, endpoints)
    monitor.start()
    workload.start()
    if options.load_at_birth:
        cluster.start()
        if cluster.wait_for_leader(60) is None:
            raise RuntimeError(f"no leader elected; see the node logs in {cluster.root}")
    try:
        with Client(list(endpoints.direct.values()), retry_for=15, timeout=5, token=cluster.token) as admin:
            nemesis = Nemesis(cluster, network, cluster.clocks, history, Prober(history, endpoints, read_queue=WORK_QUEUES[0]), admin, log)
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
            log(f"[{history.now():7.1f}s] faults over; draining")
            if not drain(history, endpoints, queues):
                log("chaos: the queues did not drain; messages still stored count as lost")
            leader = nemesis.leader()
            if leader is not None:
                verify(history, endpoints, leader)
    finally:
        workload.stop()
        monitor.stop()
