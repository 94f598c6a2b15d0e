"""`raftq cluster ...` and `raftq health`/`raftq metrics`: the nodes, membership, leadership."""

import re
import sys

from ..client import RaftqError
from .connect import Target, emit, table, target

CONTACT_NOTE = ("heard: how long ago the leader last heard from that node over Raft "
                "(- on the leader itself, or when no leader answered)")


def node_order(node_id: str) -> list:
    """n2 before n10: the digits in an id compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", node_id)]


def cluster_view(where, client) -> dict:
    """The cluster's view (see _asked_view), its nodes in id order whoever answered."""
    view = _asked_view(where, client)
    return {**view, "nodes": sorted(view["nodes"], key=lambda n: node_order(n["id"]))}


def _asked_view(where, client) -> dict:
    """GET /v1/cluster, asked of the leader when another node answered first.

    Only the leader hears from every node, so only its view has a meaningful
    'last contact' for each; any node's view serves when the leader does not answer.
    """
    view = client.cluster()
    leader = view.get("leader")
    address = next((n["http_addr"] for n in view["nodes"] if n["id"] == leader), None)
    if address is None or view.get("id") == leader:
        return view
    scheme = where.urls[0].split("://")[0]
    try:
        with Target([f"{scheme}://{address}"], where.token, where.cafile, "the leader").client(
                retry_for=0, timeout=3.0) as leader_client:
            leader_view = leader_client.cluster()
    except (OSError, RaftqError):
        return view
    return leader_view if leader_view.get("id") == leader else view


def status_table(view: dict) -> str:
    commit = view.get("commit_index") or 0
    rows = []
    for n in view["nodes"]:
        applied = n.get("applied_index")
        contact = n.get("last_contact_ms") if view.get("id") == view.get("leader") else None
        rows.append((
            n["id"] + (" *" if n["id"] == view.get("leader") else ""), n["role"], n.get("term"),
            n.get("commit_index"), applied, None if applied is None else max(0, commit - applied),
            None if contact is None else f"{contact:g}ms", "yes" if n["healthy"] else "NO",
            disk_cell(n.get("disk")), n.get("fsync_policy"), n["http_addr"]))
    columns = ("id", "role", "term", "commit", "applied", "lag", "heard", "healthy", "disk", "fsync", "http")
    lines = [table(columns, rows),
             f"leader: {view.get('leader') or 'none'}   (* marks the leader; view of {view.get('id')})",
             CONTACT_NOTE + "; disk: free space on the data directory's file system"]
    lines += disk_alarms(view["nodes"])
    groups = view.get("groups") or []
    if len(groups) > 1:
        lines += ["", groups_table(groups)]
    lines += voters_disagreeing(groups)
    if view.get("move"):
        move = view["move"]
        lines.append(f"moving: group {move['group']}'s replica from {move['source']} to {move['target']}")
    if view.get("leaving"):
        lines.append(f"leaving once their replicas have moved away: {', '.join(view['leaving'])}")
    catalog = view.get("catalog")
    if catalog:
        lines.append(f"catalog: {catalog['names']} of {catalog['limit']} queue names "
                     "(--max-queues for each group; a deleted queue's name leaves within seconds)")
    buffer = view.get("buffer") or {}
    if buffer.get("dead_lettered"):
        lines.append(f"put buffer of {view['id']}: {buffer['dead_lettered']} buffered put(s) refused for good, "
                     f"set aside in {buffer['dead_letter_file']}")
    return "\n".join(lines)


def size(count: int) -> str:
    """A byte count as people read it: 812M, 3.2G."""
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f}".rstrip("0").rstrip(".") + unit
    return f"{count}B"


def disk_cell(disk: dict | None) -> str | None:
    if disk is None:
        return None
    return f"ALARM:{size(disk['free_bytes'])}" if disk["alarm"] else size(disk["free_bytes"])


def disk_alarms(nodes: list[dict]) -> list[str]:
    """A line for each node in disk alarm (api/disk.py)."""
    return [f"disk alarm on {n['id']}: {size(n['disk']['free_bytes'])} free, below its watermark of "
            f"{size(n['disk']['watermark_bytes'])}; writes to the Raft groups it holds are refused (507) until "
            "space returns: let consumers drain, or give its data directory room (docs/operations.md)"
            for n in nodes if (n.get("disk") or {}).get("alarm")]


def groups_table(groups: list[dict]) -> str:
    """The Raft groups (issue 24): members, leader, term, commit, each member's applied index and
    lag; then how many groups each node leads."""
    rows = []
    for group in groups:
        replicas = group["replicas"]
        rows.append((group["id"], " ".join(group["members"]), group["leader"] or "none", group["term"],
                     group["commit_index"],
                     " ".join(f"{node}:{replicas[node]['applied_index']}" for node in sorted(replicas, key=node_order)),
                     max((r["lag"] for r in replicas.values() if r["lag"] is not None), default=None)))
    leads = {}
    for group in groups:
        for node in group["members"]:
            leads.setdefault(node, 0)
        if group["leader"]:
            leads[group["leader"]] = leads.get(group["leader"], 0) + 1
    return "\n".join([table(("group", "members", "leader", "term", "commit", "applied", "lag"), rows),
                      "groups led: " + "  ".join(f"{node} {leads[node]}" for node in sorted(leads, key=node_order))])


def voters_disagreeing(groups: list[dict]) -> list[str]:
    """A line for each replica that counts other voters than its group's leader does: a
    membership change it has not received yet, or one that went wrong."""
    lines = []
    for group in groups:
        replicas = group.get("replicas") or {}
        led = (replicas.get(group.get("leader")) or {}).get("voters")
        for node in sorted(replicas, key=node_order):
            counted = replicas[node].get("voters")
            if led is not None and counted is not None and counted != led:
                lines.append(f"group {group['id']}: {node} counts voters {', '.join(counted)}; "
                             f"its leader {group['leader']} counts {', '.join(led)}")
    return lines


def has_quorum(view: dict) -> bool:
    healthy = sum(1 for n in view["nodes"] if n["healthy"])
    return view.get("leader") is not None and healthy > len(view["nodes"]) // 2


# differ is a bug to report; incomplete is worth asking again, so a script tells them apart
VERIFY_EXITS = {"agree": 0, "differ": 1, "incomplete": 3}


def verify_verdict(result: dict) -> str:
    if result["verdict"] == "incomplete":
        return (f"no digest from {', '.join(result['unanswered'])} in time (down, or still applying); "
                "the replicas that answered agree: run verify again")
    return "replicas agree" if result["verdict"] == "agree" else "REPLICAS DIFFER"


def cmd_cluster(args) -> int:
    where = target(args)
    with where.client(retry_for=2.0, timeout=5.0) as client:
        if args.action == "status":
            # no node reached, or an answer such as a 401: said as for every command (cli.main)
            view = cluster_view(where, client)
            emit(args, view, status_table(view))
            return 0 if has_quorum(view) else 1
        if args.action == "verify":
            result = client.verify()
            lines = [f"{prefix}{node}: {digest or 'no answer'}"
                     for prefix, answer in ([(f"group {g['group']}  ", g) for g in result["groups"]]
                                            if "groups" in result else [("", result)])
                     for node, digest in answer["digests"].items()]
            emit(args, result, "\n".join(lines + [verify_verdict(result)]))
            return VERIFY_EXITS[result["verdict"]]
        if args.action == "rebalance":
            result = client.rebalance()
            lines = [f"group {move['group']}: {'moved' if move['moved'] else 'stays'}" for move in result["groups"]]
            emit(args, result, "\n".join(lines + [f"{result['moved']} group(s) changed leader"
                                                  if result["groups"] else "one Raft group: nothing to balance"]))
            return 0
        if args.action == "add":
            added = client.add_node(args.id, args.raft, args.http, force=args.force)
            emit(args, added, f"added {args.id}")
            if added.get("warning") and not args.json:
                print(f"warning: {added['warning']}", file=sys.stderr)
            return 0
        if args.action == "transfer":
            result = client.transfer_leadership(args.to)
            emit(args, result, f"leader: {result['leader'] or 'none yet'} (was {result['previous']})"
                 + ("" if result["moved"] else " — leadership did not move"))
            return 0 if result["moved"] or args.to == result["previous"] else 1
        result = client.remove_node(args.id, force=args.force)
        if result and result.get("leaving"):
            emit(args, result, f"{args.id} is leaving: its {result['replicas']} replica(s) of other Raft groups "
                               "move away first, then it leaves (raftq cluster status shows the moves)")
            return 0
        emit(args, {"removed": args.id}, f"removed {args.id}")
        return 0


def cmd_health(args) -> int:
    """Every node's /health/live and /health/ready, asked directly (no failover)."""
    where = target(args)
    rows, report = [], []
    for url in where.urls:
        one = Target([url], where.token, where.cafile, where.source)
        with one.client(retry_for=0, timeout=2.0) as client:
            try:
                live = client.live()
                ready = client.ready()
            except (OSError, RaftqError) as exc:
                live, ready = None, {"ready": False, "error": str(exc)}
        report.append({"url": url, "live": live is not None, **ready})
        rows.append((url, "yes" if live else "NO", "yes" if ready.get("ready") else "NO", ready.get("id"),
                     ready.get("role"), ready.get("leader"), ready.get("term")))
    emit(args, {"nodes": report}, table(("url", "live", "ready", "id", "role", "leader", "term"), rows))
    return 0 if all(r.get("ready") for r in report) else 1


def cmd_metrics(args) -> int:
    where = target(args)
    with where.client(retry_for=2.0, timeout=5.0) as client:
        text = client.metrics()
    emit(args, {"metrics": text}, text.rstrip("\n"))
    return 0


def add_parsers(sub, common) -> None:
    cluster = sub.add_parser("cluster", help="the nodes: status, verify, membership, leadership")
    actions = cluster.add_subparsers(dest="action", required=True)
    actions.add_parser("status", parents=[common],
                       help="every node's role, term, indexes, lag, contact, health, fsync policy; "
                            "exit 1 without a leader and a healthy majority")
    actions.add_parser("verify", parents=[common], help="compare every replica's state digest at one log position")
    actions.add_parser("rebalance", parents=[common],
                       help="move each Raft group's leadership to its first live, caught-up preference now")
    add = actions.add_parser("add", parents=[common], help="add a voter (membership change through the log)")
    add.add_argument("id")
    add.add_argument("raft")
    add.add_argument("http")
    remove = actions.add_parser("remove", parents=[common], help="remove a voter")
    remove.add_argument("id")
    for change in (add, remove):
        change.add_argument("--force", action="store_true",
                            help="even if the live voters would then be no majority (refused otherwise): "
                                 "the second node of a cluster made on one")
    transfer = actions.add_parser("transfer", parents=[common], help="hand leadership to another node")
    transfer.add_argument("to", nargs="?", help="the node to lead (default: the most caught-up follower)")
    cluster.set_defaults(run=cmd_cluster)

    health = sub.add_parser("health", parents=[common], help="each node's /health/live and /health/ready")
    health.set_defaults(run=cmd_health)
    metrics = sub.add_parser("metrics", parents=[common], help="a node's Prometheus metrics")
    metrics.set_defaults(run=cmd_metrics)
