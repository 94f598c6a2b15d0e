"""`raftq top`: a live terminal view of the nodes and the queues, refreshed each second."""

import json
import shutil
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


def look(where, client, rates: Rates) -> dict:
    """One look at the cluster: its view, and every queue's stats with the rates since the last look."""
    view = cluster_view(where, client)
    infos = [client.queue(q["name"]) for q in client.queues()["queues"]]
    now = time.monotonic()
    queues = []
    for info in infos:
        rate = rates.update(info["name"], info["stats"], now)
        queues.append({"name": info["name"], "stats": info["stats"], "behind": behind(info["stats"]),
                       "put_per_s": rate.get("put_total"), "ack_per_s": rate.get("acked_total")})
    return {"at": time.time(), "cluster": view, "queues": queues}


def _widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def _shorten(text: str, room: int) -> str:
    return text if len(text) <= room else text[:room - 1] + "…"


def fitted_table(columns: tuple, rows: list, width: int, droppable: tuple = ()) -> str:
    """A table no wider than `width`: the `droppable` columns go first, in that order, then
    the first column's cells (names) are shortened to the room left."""
    columns, rows = list(columns), [list(row) for row in rows]
    text = table(columns, rows)
    for name in droppable:
        if _widest(text) <= width:
            break
        at = columns.index(name)
        del columns[at]
        for row in rows:
            del row[at]
        text = table(columns, rows)
    if _widest(text) > width and len(columns) > 1:
        rest = _widest(table(columns[1:], [row[1:] for row in rows]))
        room = max(4, width - rest - 2)
        text = table(columns, [[_shorten("-" if row[0] is None else str(row[0]), room)] + row[1:]
                               for row in rows])
    return text


def frame(where, seen: dict, width: int) -> str:
    """One screen of `top`, no line wider than the terminal (a wrapped line breaks the table)."""
    view = seen["cluster"]
    commit = view.get("commit_index") or 0
    nodes = fitted_table(
        ("node", "role", "term", "commit", "applied", "lag", "healthy", "fsync", "http"), [
            (n["id"] + (" *" if n["id"] == view.get("leader") else ""), n["role"], n.get("term"),
             n.get("commit_index"), n.get("applied_index"),
             None if n.get("applied_index") is None else max(0, commit - n["applied_index"]),
             "yes" if n["healthy"] else "NO", n.get("fsync_policy"), n["http_addr"]) for n in view["nodes"]],
        width, droppable=("fsync", "http", "term"))
    rows = [(q["name"], q["stats"]["depth"], q["stats"]["in_flight"], q["stats"]["delayed"], q["behind"],
             q["stats"]["dead_lettered_total"],
             "…" if q["put_per_s"] is None else f"{q['put_per_s']:.1f}",
             "…" if q["ack_per_s"] is None else f"{q['ack_per_s']:.1f}", len(q["stats"]["groups"]))
            for q in seen["queues"]]
    queues = (fitted_table(("queue", "depth", "in_flight", "delayed", "behind", "dead", "put/s", "ack/s", "groups"),
                           rows, width, droppable=("groups", "delayed", "dead")) if rows else "(no queues)")
    lines = [f"raftq top   {time.strftime('%H:%M:%S')}   {where.describe()}",
             f"leader {view.get('leader') or 'NONE'}   term {view.get('term')}   commit {commit}",
             nodes, "", queues]
    return "\n".join(line[:width] for line in "\n".join(lines).splitlines())


def cmd_top(args) -> int:
    """A frame each --interval; with --json, one JSON object per look instead."""
    where = target(args)
    rates = Rates()
    shown = 0
    with where.client(retry_for=1.0, timeout=3.0) as client:
        while args.iterations == 0 or shown < args.iterations:
            started = time.monotonic()
            try:
                seen = look(where, client, rates)
            except (OSError, RaftqError) as exc:
                seen = {"at": time.time(), "error": f"no node answers: {exc}"}
            if args.json:
                text = json.dumps(seen, default=str)
            elif "error" in seen:
                text = seen["error"]
            else:
                width = shutil.get_terminal_size((80, 24)).columns
                text = (CLEAR if sys.stdout.isatty() else "") + frame(where, seen, width) + "\n"
            sys.stdout.write(text + "\n")
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
