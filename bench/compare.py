"""`python -m bench compare`: raftq, RabbitMQ quorum queues and NATS JetStream
(twice: fsyncing every message, and as it ships), each a 3-node cluster on
127.0.0.1, measured side by side in one run.

Theory of operation
-------------------
All systems are started first (each by its own side module) and stay up, idle
while another is measured; then every workload runs on each system in turn,
and the whole round is repeated (`--reps`), so that the machine's noise falls
on every system alike: raftq, RabbitMQ, NATS, raftq, RabbitMQ, NATS, ...
Ratios are raftq ÷ peer from medians of this run, never against a figure from
another day; `*_vs_nats` is against the NATS that fsyncs every message, the
promise raftq and RabbitMQ make. Everything started is stopped by PID,
whatever happens.

Workloads (100-byte messages, durable as each system allows):
- W1  one message at a time, each acknowledged before the next: rate, p50, p99
- W2  pipelined single messages (raftq: a Producer with a window of 1 000;
      raftq-http: 64 concurrent single-message puts; RabbitMQ: 1 000
      unconfirmed publishes; NATS: 1 000 async publishes in flight)
- W3  consume and ack a backlog of `--backlog` messages in each system's best mode
- W4  kill -9 of the leader under one-at-a-time writes: time to the next
      acknowledged write (median over `--failovers` rounds), acked writes lost
- W5  produce at one rate for every system (`--w5-rate`) while consuming:
      put -> delivered latency p50, p99
- W5b the same at half of what the system itself can both take and hand out
      (the lower of its own W2 and W3 rates)
- W6  K client processes at once (each K of `--scale`), each producing as in
      W2 to a queue or stream of its own: aggregate msgs/s, the servers' and
      the clients' CPU per message and cores busy (bench/scale.py). raftq runs
      it with each number of Raft groups G of `--groups`: G = 1 on the raftq
      cluster, each other G as a column raftq-gG of a cluster of its own, up
      only for W6 (idle, its engines would tax W1-W5); raftq's server CPU per
      message is split by process: leader engines, follower engines, fronts,
      supervisors (docs/scaling.md uses it).
- raftq alone, on a cluster of its own: RSS per node holding `--stored`
  messages (once the snapshots their last puts caused are written; the most
  seen while they were, as `rss_1m_snapshot_peak_mib`), and a whole-cluster
  restart to ready with them.
- raftq alone, the backlog row (`--backlog-messages`, `--backlog-big-messages`):
  bench/backlog_bench.py at those counts, on clusters of its own; its figures
  come out prefixed `backlog_`.
CPU per message (server: the nodes' processes; client: this process) is
reported beside each throughput figure.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench.measure import cpu_seconds, machine, percentile
from bench.scale import w6


def make_systems(names: list[str], root: Path, groups: list[int] = (1,)) -> list:
    """The sides to compare, in the order given; raftq-http shares raftq's cluster when both run;
    raftq is followed by a raftq-gG side for each G of `groups` above 1, and runs W6 itself
    only when `groups` has 1.

    Each side is imported only when named: the peers' clients (pika, nats-py)
    come with the `bench` extra, which raftq alone does not need.
    """
    made: dict = {}
    for name in names:
        if name == "raftq-http":
            from bench.raftq_side import RaftqHttp
            made[name] = RaftqHttp(root, cluster_of=made.get("raftq"))
        elif name == "raftq":
            from bench.raftq_side import Raftq, RaftqGroups
            made[name] = Raftq(root)
            made[name].scales = 1 in groups
            for count in groups:
                if count > 1:
                    made[f"raftq-g{count}"] = RaftqGroups(root, count)
        elif name == "rabbitmq":
            from bench.rabbitmq_side import RabbitMQ
            made[name] = RabbitMQ(root)
        elif name == "nats":
            from bench.nats_side import Nats
            made[name] = Nats(root)
        else:
            from bench.nats_side import NatsLazy
            made[name] = NatsLazy(root)
    return list(made.values())


def measured(system, workload, *args) -> dict:
    """Run one workload, adding its rate and the CPU it cost per message."""
    pids = system.server_pids()
    server0, client0 = cpu_seconds(pids), time.process_time()
    figures = workload(*args)
    server, client = cpu_seconds(pids) - server0, time.process_time() - client0
    n = max(figures["n"], 1)
    figures["msgs_per_s"] = figures["n"] / figures["secs"] if figures.get("secs") else None
    figures["server_cpu_us_per_msg"] = server / n * 1e6
    figures["client_cpu_us_per_msg"] = client / n * 1e6
    return figures


# raftq's server processes in W6, as bench/raftq_side.py's cpu_split tells them apart
PROCESS_KINDS = ("leader_engine", "follower_engine", "other_engines", "fronts", "supervisors", "other")


def _summary(runs: list[dict]) -> dict:
    """Medians over repetitions of what a workload reported."""
    out = {}
    for key in ("msgs_per_s", "server_cpu_us_per_msg", "client_cpu_us_per_msg", "p50_ms", "p99_ms",
                "rate", "sent_per_s", "server_cores_busy", "raft_groups",
                *(f"{kind}_cpu_us_per_msg" for kind in PROCESS_KINDS)):
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            out[key] = statistics.median(values)
    return out


def _latency_figures(figures: dict, key: str) -> None:
    values = figures.pop(key)
    figures["p50_ms"] = percentile(values, 50)
    figures["p99_ms"] = percentile(values, 99)
    figures["_" + key] = values


def run(args, log=print) -> dict:
    root = Path(tempfile.mkdtemp(prefix="raftq-compare-"))
    size = machine()
    log(f"on {size['cores']} cores (load average {size['load_avg_1m']})")
    out = Path(args.out) / time.strftime("compare-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    systems = make_systems(args.systems, root, args.groups)
    all_along = [s for s in systems if not s.w6_only]
    raw: dict[str, dict[str, list]] = {s.name: defaultdict(list) for s in systems}
    extra: dict = {}
    backlog_figures: dict = {}
    started = []
    try:
        def start(system) -> None:
            t = time.perf_counter()
            started.append(system)   # stopped even if it fails half way up
            system.start()
            log(f"{system.label}: up in {time.perf_counter() - t:.1f} s")
        for system in all_along:
            start(system)
        for rep in range(args.reps):
            for system in all_along:
                w1 = measured(system, system.w1, args.seconds)
                _latency_figures(w1, "latencies_ms")
                w2 = measured(system, system.w2, args.seconds)
                backlog = system.fill(args.backlog)
                w3 = measured(system, system.w3, backlog, args.backlog)
                for name, figures in (("w1", w1), ("w2", w2), ("w3", w3)):
                    raw[system.name][name].append(figures)
                log(f"rep {rep + 1} {system.name:<9} W1 {w1['msgs_per_s']:8.0f}/s p50 {w1['p50_ms']:.2f} ms "
                    f"p99 {w1['p99_ms']:.2f} ms | W2 {w2['msgs_per_s']:8.0f}/s | W3 {w3['msgs_per_s']:8.0f}/s")
        for rep in range(args.reps):
            for system in all_along:
                own_half = 0.5 * min(statistics.median(r["msgs_per_s"] for r in raw[system.name][w])
                                     for w in ("w2", "w3"))
                for workload, rate in (("w5", args.w5_rate), ("w5b", own_half)):
                    figures = measured(system, system.w5, rate, args.seconds)
                    _latency_figures(figures, "e2e_ms")
                    figures["rate"] = rate
                    # a system that cannot take the rate sends less: its latency is then its backlog's
                    figures["sent_per_s"] = figures["sent"] / args.seconds
                    raw[system.name][workload].append(figures)
                    log(f"rep {rep + 1} {system.name:<10} {workload.upper():<3} at {rate:7.0f}/s: e2e p50 "
                        f"{figures['p50_ms']:.2f} ms p99 {figures['p99_ms']:.2f} ms "
                        f"({figures['n']} of {figures['sent']} delivered)")
        for system in systems:
            if system.w6_only:
                start(system)
        for rep in range(args.reps):
            for k in args.scale:
                for system in [s for s in systems if s.scales]:
                    figures = w6(system, k, args.seconds)
                    raw[system.name][f"w6_k{k}"].append(figures)
                    log(f"rep {rep + 1} {system.name:<10} W6 {k} processes: {figures['msgs_per_s']:8.0f}/s, "
                        f"server {figures['server_cpu_us_per_msg']:.0f} µs/msg"
                        + "".join(f" ({kind} {figures[f'{kind}_cpu_us_per_msg']:.0f})" for kind in PROCESS_KINDS
                                  if f"{kind}_cpu_us_per_msg" in figures)
                        + f", client {figures['client_cpu_us_per_msg']:.0f} µs/msg, "
                        f"{figures['server_cores_busy']:.2f} of {size['cores']} cores busy, "
                        f"{figures['raft_groups']} Raft groups")
        for system in systems:
            if system.w6_only:
                system.stop()
        for system in [s for s in systems if s.fails_over]:
            w4 = system.w4(args.failovers)
            w4["median_s"] = statistics.median(w4["rounds_s"])
            raw[system.name]["w4"].append(w4)
            log(f"{system.name:<10} W4 kill -9 leader -> next acked write: median {w4['median_s'] * 1000:.0f} ms "
                f"over {len(w4['rounds_s'])} rounds, {w4['lost']} acked writes lost")
        raftq = next((s for s in systems if s.name == "raftq"), None)
        if raftq is not None and args.stored:
            # On a cluster of its own: the workloads' puts carried ids, which
            # every node remembers for the dedup window (5 min; about 28 B
            # each, docs/operations.md), and a million of them is not what
            # holding the stored messages costs.
            raftq.stop()
            holder = type(raftq)(root / "stored")
            started.append(holder)
            holder.start()
            extra = holder.memory_and_restart(args.stored)
            log(f"raftq holding {args.stored:,} messages: RSS {extra['rss_mib_max']:.0f} MiB per node (max), "
                f"{extra['rss_peak_mib']:.0f} MiB while writing a snapshot, restart to ready {extra['restart_s']:.1f} s"
                + ("" if extra["snapshot_settled"] else " (a snapshot was still being written)"))
        if raftq is not None and args.backlog_messages:
            for system in started:
                if system.name == "raftq":   # the workloads' cluster and the one holding --stored: not the backlog's
                    system.stop()
            from bench.backlog_bench import measure as measure_backlog
            backlog_figures = measure_backlog(root / "backlog", args.backlog_messages, args.backlog_big_messages,
                                              args.backlog_window_s, log=log, churn_bytes=args.backlog_churn_bytes)
    finally:
        for system in reversed(started):
            system.stop()
        shutil.rmtree(root, ignore_errors=True)
    report = build_report(raw, extra, args, {
        "machine": size, "described": {s.name: {"label": s.label, "durability": s.durability} for s in systems}},
        backlog_figures)
    write_outputs(out, raw, report, systems)
    log(f"results in {out}")
    return report


def _ratio(a, b) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def build_report(raw: dict, extra: dict, args, about: dict, backlog_figures: dict | None = None) -> dict:
    """The figures: medians per system and workload, and raftq ÷ peer ratios. `about` says
    where they were taken (`machine`) and what ran (`described`: each system's label, with
    the version that ran, and its durability); `backlog_figures` are bench/backlog_bench.py's,
    each kept under its name prefixed `backlog_`."""
    table: dict[str, dict] = {}
    for name, workloads in raw.items():
        table[name] = {w: _summary(runs) for w, runs in workloads.items() if w != "w4"}
        if workloads.get("w4"):
            w4 = workloads["w4"][0]
            table[name]["w4"] = {"median_s": w4["median_s"], "lost": w4["lost"], "rounds_s": w4["rounds_s"]}
    figures: dict = {"reps": args.reps, "seconds": args.seconds, "backlog": args.backlog,
                     "w5_rate": args.w5_rate, "scale": args.scale, "groups": args.groups, **about, "systems": table}

    def get(system, workload, key):
        return table.get(system, {}).get(workload, {}).get(key)

    for peer in ("rabbitmq", "nats"):
        if peer not in table or "raftq" not in table:
            continue
        figures[f"w1_p50_vs_{peer}"] = _ratio(get("raftq", "w1", "p50_ms"), get(peer, "w1", "p50_ms"))
        figures[f"w1_p99_vs_{peer}"] = _ratio(get("raftq", "w1", "p99_ms"), get(peer, "w1", "p99_ms"))
        for w in ("w1", "w2", "w3"):
            figures[f"{w}_vs_{peer}"] = _ratio(get("raftq", w, "msgs_per_s"), get(peer, w, "msgs_per_s"))
        figures[f"w4_median_vs_{peer}"] = _ratio(get("raftq", "w4", "median_s"), get(peer, "w4", "median_s"))
        for w in ("w5", "w5b"):
            figures[f"{w}_p50_vs_{peer}"] = _ratio(get("raftq", w, "p50_ms"), get(peer, w, "p50_ms"))
            figures[f"{w}_p99_vs_{peer}"] = _ratio(get("raftq", w, "p99_ms"), get(peer, w, "p99_ms"))
        for k in args.scale:
            figures[f"w6_k{k}_vs_{peer}"] = _ratio(get("raftq", f"w6_k{k}", "msgs_per_s"),
                                                  get(peer, f"w6_k{k}", "msgs_per_s"))
    most, fewest = max(args.scale), min(args.scale)
    if "raftq" in table and len(args.scale) > 1:
        figures[f"w6_k{most}_vs_k{fewest}"] = _ratio(get("raftq", f"w6_k{most}", "msgs_per_s"),
                                                     get("raftq", f"w6_k{fewest}", "msgs_per_s"))
    for name in [n for n in table if n.startswith("raftq-g")]:
        g = name.removeprefix("raftq-")        # G Raft groups against one, and against the peers
        for k in args.scale:
            figures[f"w6_k{k}_{g}_vs_g1"] = _ratio(get(name, f"w6_k{k}", "msgs_per_s"),
                                                   get("raftq", f"w6_k{k}", "msgs_per_s"))
            for peer in ("rabbitmq", "nats"):
                if peer in table:
                    figures[f"w6_k{k}_{g}_vs_{peer}"] = _ratio(get(name, f"w6_k{k}", "msgs_per_s"),
                                                               get(peer, f"w6_k{k}", "msgs_per_s"))
        if len(args.scale) > 1:
            figures[f"w6_k{most}_vs_k{fewest}_{g}"] = _ratio(get(name, f"w6_k{most}", "msgs_per_s"),
                                                             get(name, f"w6_k{fewest}", "msgs_per_s"))
    figures["acked_lost"] = {name: t["w4"]["lost"] for name, t in table.items() if "w4" in t}
    if extra:
        figures["rss_1m_mib"] = round(extra["rss_mib_max"], 1)
        figures["rss_1m_snapshot_peak_mib"] = round(extra["rss_peak_mib"], 1)
        figures["restart_1m_s"] = round(extra["restart_s"], 2)
        figures["stored_for_rss"] = extra["stored"]
    for key, value in (backlog_figures or {}).items():
        if key != "machine":      # the run's, said once
            figures[f"backlog_{key}"] = value
    return figures


def markdown(report: dict) -> str:
    table = report["systems"]
    described = report["described"]
    names = list(described)
    peers = [p for p in ("rabbitmq", "nats") if p in names and "raftq" in names]

    def cell(system, workload, key, scale=1.0, digits=0):
        value = table.get(system, {}).get(workload, {}).get(key)
        return "—" if value is None else f"{value * scale:,.{digits}f}"

    rows = [
        ("W1 one at a time, acked: msgs/s", "w1", "msgs_per_s", 1, 0, "rate"),
        ("W1 p50 ms", "w1", "p50_ms", 1, 2, "latency"),
        ("W1 p99 ms", "w1", "p99_ms", 1, 2, "latency"),
        ("W2 pipelined single messages: msgs/s", "w2", "msgs_per_s", 1, 0, "rate"),
        ("W2 server CPU µs/msg", "w2", "server_cpu_us_per_msg", 1, 0, None),
        ("W2 client CPU µs/msg", "w2", "client_cpu_us_per_msg", 1, 0, None),
        (f"W3 consume+ack {report['backlog']:,} backlog: msgs/s", "w3", "msgs_per_s", 1, 0, "rate"),
        ("W4 kill -9 leader -> next acked write: median ms", "w4", "median_s", 1000, 0, "latency"),
        ("W4 acked writes lost", "w4", "lost", 1, 0, None),
        (f"W5 at {report['w5_rate']:,.0f} msgs/s for all: sent msgs/s", "w5", "sent_per_s", 1, 0, None),
        ("W5 e2e p50 ms", "w5", "p50_ms", 1, 2, "latency"),
        ("W5 e2e p99 ms", "w5", "p99_ms", 1, 2, "latency"),
        ("W5b at half of own max: sent msgs/s", "w5b", "sent_per_s", 1, 0, None),
        ("W5b e2e p50 ms", "w5b", "p50_ms", 1, 2, "latency"),
        ("W5b e2e p99 ms", "w5b", "p99_ms", 1, 2, "latency"),
    ]
    for k in report["scale"]:
        rows += [(f"W6 {k} producing processes: msgs/s", f"w6_k{k}", "msgs_per_s", 1, 0, "rate"),
                 (f"W6 {k}: server CPU µs/msg", f"w6_k{k}", "server_cpu_us_per_msg", 1, 0, None),
                 *((f"W6 {k}: {kind.replace('_', ' ')} CPU µs/msg", f"w6_k{k}", f"{kind}_cpu_us_per_msg", 1, 0, None)
                   for kind in PROCESS_KINDS),
                 (f"W6 {k}: client CPU µs/msg", f"w6_k{k}", "client_cpu_us_per_msg", 1, 0, None),
                 (f"W6 {k}: server cores busy", f"w6_k{k}", "server_cores_busy", 1, 2, None),
                 (f"W6 {k}: Raft groups", f"w6_k{k}", "raft_groups", 1, 0, None)]
    # (numerator, denominator) of each ratio column: raftq over each peer, raftq-gG over raftq
    over = [("raftq", p) for p in peers] + [(n, "raftq") for n in names if n.startswith("raftq-g")]
    head = ["workload", *names, *[f"{a} ÷ {b}" for a, b in over]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for title, workload, key, scale, digits, kind in rows:
        cells = [cell(n, workload, key, scale, digits) for n in names]
        if all(c == "—" for c in cells):
            continue
        ratios = []
        for numerator, denominator in over:
            a = table[numerator].get(workload, {}).get(key)
            b = table[denominator].get(workload, {}).get(key)
            ratios.append(f"{a / b:.2f}" if kind and a is not None and b else "")
        lines.append("| " + " | ".join([title, *cells, *ratios]) + " |")
    size = report["machine"]
    notes = [f"Medians of {report['reps']} interleaved repetitions of {report['seconds']} s each, on "
             f"{size['cores']} cores (the machine has {size['cpu_count']}; load average "
             f"{size['load_avg_1m']} at the start); throughput ratios above 1 and latency ratios below 1 "
             "favour raftq."]
    notes += [f"{name}: {d['label']}; {d['durability']}." for name, d in described.items()]
    if "rss_1m_mib" in report:
        notes.append(f"raftq holding {report['stored_for_rss']:,} stored 100-byte messages: "
                     f"{report['rss_1m_mib']} MiB RSS per node (max; {report['rss_1m_snapshot_peak_mib']} MiB "
                     f"while the node writes a snapshot, whose writer is a forked child), whole-cluster restart "
                     f"to ready {report['restart_1m_s']} s.")
    if "backlog_messages" in report:
        met = report["backlog_targets_met"]
        notes.append(f"raftq's backlog (bench/backlog_bench.py, {report['backlog_messages']:,} stored 100-byte "
                     f"messages): {report['backlog_rss_growth_b_per_msg']} B per stored message, peak "
                     f"{report['backlog_rss_peak_vs_rest']} x rest while a snapshot is written, snapshot "
                     f"{report['backlog_snapshot_b_per_msg']} B per message, restart {report['backlog_restart_s']} s, "
                     f"consume+ack at depth {report['backlog_consume_at_depth_vs_shallow']} x at 1 k, disk "
                     f"{report['backlog_disk_vs_live_bytes']} x the live bodies; issue 25's targets met: "
                     f"{sum(met.values())} of {len(met)}.")
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"


def write_outputs(out: Path, raw: dict, report: dict, systems) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(markdown(report))
    try:
        from bench.compare_plots import plot
    except ImportError:
        return   # matplotlib is in the [plot] extra
    plot(out, raw, {s.name: s.label for s in systems})
