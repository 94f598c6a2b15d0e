"""`raftq top`: a live terminal view of the nodes and the queues, refreshed each second."""

import sys
import time

from ..client import RaftqError
from .cluster import cluster_view
from .connect import table, target

CLEAR = "\x1b[H\x1b[2J"


class Rates:
    """Per-second rates of a queue's counters between two looks."""

    def __init__(self):
        self.last: dict[str, tuple[float, dict]] = {}

    def update(self, name: str, stats: dict, now: float) -> dict:
        previous = self.last.get(name)
        self.last[name] = (now, stats)
        if previous is None or now <= previous[0]:
            return {}
        seconds = now - previous[0]
        return {field: max(0.0, (stats[field] - previous[1][field]) / seconds)
                for field in ("put_total", "acked_total")}


def behind(stats: dict) -> int:
    """Messages the slowest group has not acked yet."""
    end = (stats["last_seq"] or 0) + 1
    return max((end - g["cursor"] for g in stats["groups"].values()), default=0)


def frame(where, client, rates: Rates) -> str:
    lines = [f"raftq top   {time.strftime('%H:%M:%S')}   {where.describe()}"]
    try:
        view = cluster_view(where, client)
        listing = client.queues()["queues"]
        infos = [client.queue(q["name"]) for q in listing]
    except (OSError, RaftqError) as exc:
        return "\n".join(lines + [f"no node answers: {exc}"])
    now = time.monotonic()
    commit = view.get("commit_index") or 0
    lines.append(f"leader {view.get('leader') or 'NONE'}   term {view.get('term')}   commit {commit}")
    lines.append(table(("node", "role", "term", "commit", "applied", "lag", "healthy", "fsync", "http"), [
        (n["id"] + (" *" if n["id"] == view.get("leader") else ""), n["role"], n.get("term"),
         n.get("commit_index"), n.get("applied_index"),
         None if n.get("applied_index") is None else max(0, commit - n["applied_index"]),
         "yes" if n["healthy"] else "NO", n.get("fsync_policy"), n["http_addr"]) for n in view["nodes"]]))
    lines.append("")
    rows = []
    for info in infos:
        stats = info["stats"]
        rate = rates.update(info["name"], stats, now)
        rows.append((info["name"], stats["depth"], stats["in_flight"], stats["delayed"], behind(stats),
                     stats["dead_lettered_total"],
                     f"{rate['put_total']:.1f}" if rate else "…", f"{rate['acked_total']:.1f}" if rate else "…",
                     len(stats["groups"])))
    lines.append(table(("queue", "depth", "in_flight", "delayed", "behind", "dead", "put/s", "ack/s", "groups"), rows)
                 if rows else "(no queues)")
    return "\n".join(lines)


def cmd_top(args) -> int:
    where = target(args)
    rates = Rates()
    shown = 0
    with where.client(retry_for=1.0, timeout=3.0) as client:
        while args.iterations == 0 or shown < args.iterations:
            started = time.monotonic()
            text = frame(where, client, rates)
            sys.stdout.write((CLEAR if sys.stdout.isatty() else "") + text + "\n\n")
            sys.stdout.flush()
            shown += 1
            if args.iterations == 0 or shown < args.iterations:
                time.sleep(max(0.0, args.interval - (time.monotonic() - started)))
    return 0


def add_parser(sub, common) -> None:
    top = sub.add_parser("top", parents=[common], help="live view of nodes and queues (rates, depth, lag)")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    top.add_argument("--iterations", type=int, default=0, help="stop after this many refreshes (0: until Ctrl-C)")
    top.set_defaults(run=cmd_top)
