"""The `raftq` command line: run nodes, operate the cluster, use queues from a terminal.

Client commands talk to the node named by RAFTQ_URL (any node will do; they
follow redirects to the leader), with RAFTQ_TOKEN as bearer token and
RAFTQ_CA as the CA bundle for https:// URLs, if set.
"""

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from .client import Client, RaftqError

DEFAULT_URL = "http://127.0.0.1:8001"


def _client(args) -> Client:
    return Client(os.environ.get("RAFTQ_URL", DEFAULT_URL), token=os.environ.get("RAFTQ_TOKEN"),
                  cafile=os.environ.get("RAFTQ_CA"), retry_for=5.0)


def _print(args, value, text: str | None = None) -> None:
    if args.json or text is None:
        print(json.dumps(value, indent=None if args.json else 2, default=str))
    else:
        print(text)


def cmd_node(args) -> int:
    from api.app import Settings

    from . import config as cluster_config
    from .server import serve, setup_logging
    setup_logging(args.id, args.log_level)
    try:
        cfg = cluster_config.load(args.config)
        cfg.node(args.id)
    except cluster_config.ConfigError as exc:
        print(f"raftq node: {exc}", file=sys.stderr)
        return 2
    token = Path(args.auth_token_file).read_text().strip() if args.auth_token_file else None
    if bool(args.tls_cert) != bool(args.tls_key):
        print("raftq node: give both --tls-cert and --tls-key", file=sys.stderr)
        return 2
    settings = Settings(auth_token=token, max_message_bytes=args.max_message_bytes,
                        scheme="https" if args.tls_cert else "http", tls_ca=args.tls_ca)
    try:
        asyncio.run(serve(cfg, args.id, args.data_dir or f".raftq/{args.id}", settings=settings,
                          tls=(args.tls_cert, args.tls_key) if args.tls_cert else None,
                          auto_create=not args.no_auto_create))
    except OSError as exc:
        print(f"raftq node: cannot serve {args.id}: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_up(args) -> int:
    from .local import up
    return up(args.nodes, args.data_dir, args.http_port, args.raft_port, args.demo)


def status_table(view: dict) -> str:
    columns = ("id", "role", "term", "commit", "applied", "lag", "contact", "healthy", "fsync", "http")
    rows = []
    commit = view.get("commit_index") or 0
    for n in view["nodes"]:
        applied = n.get("applied_index")
        rows.append((
            n["id"] + (" *" if n["id"] == view.get("leader") else ""), n["role"], n.get("term"),
            n.get("commit_index"), applied, None if applied is None else max(0, commit - applied),
            None if n.get("last_contact_ms") is None else f"{n['last_contact_ms']}ms",
            "yes" if n["healthy"] else "NO", n.get("fsync_policy"), n["http_addr"]))
    cells = [columns] + [tuple("-" if c is None else str(c) for c in row) for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines + [f"leader: {view.get('leader') or 'none'}   (* marks the leader)"])


def has_quorum(view: dict) -> bool:
    healthy = sum(1 for n in view["nodes"] if n["healthy"])
    return view.get("leader") is not None and healthy > len(view["nodes"]) // 2


def cmd_cluster(args) -> int:
    with _client(args) as client:
        if args.action == "status":
            try:
                view = client.cluster()
            except (OSError, RaftqError) as exc:
                print(f"raftq: cannot reach the cluster: {exc}", file=sys.stderr)
                return 1
            _print(args, view, status_table(view))
            return 0 if has_quorum(view) else 1
        if args.action == "verify":
            result = client.verify()
            lines = [f"{node}: {digest or 'no answer'}" for node, digest in result["digests"].items()]
            verdict = "replicas agree" if result["agree"] else "REPLICAS DIFFER"
            _print(args, result, "\n".join(lines + [verdict]))
            return 0 if result["agree"] else 1
        if args.action == "add":
            _print(args, client.add_node(args.id, args.raft, args.http), f"added {args.id}")
            return 0
        client.remove_node(args.id)
        _print(args, {"removed": args.id}, f"removed {args.id}")
        return 0


def cmd_queues(args) -> int:
    with _client(args) as client:
        view = client.queues()
    lines = [f"{q['name']:<30} depth {q['depth']:<8} in_flight {q['in_flight']:<6} groups {','.join(q['groups'])}"
             for q in view["queues"]] or ["(no queues)"]
    _print(args, view, "\n".join(lines))
    return 0


def cmd_put(args) -> int:
    try:
        body = json.loads(args.body)
    except ValueError:
        body = args.body
    with _client(args) as client:
        result = client.put(args.queue, body, key=args.key, id=args.id)
    m = result["messages"][0]
    _print(args, result, f"seq {m['seq']}" + (" (duplicate)" if m["duplicate"] else "")
           + (f" replaced {m['replaced_seq']}" if m["replaced_seq"] else ""))
    return 0


def cmd_receive(args) -> int:
    with _client(args) as client:
        result = client.receive(args.queue, group=args.group, max=args.max, wait_ms=args.wait)
    lines = [f"seq {m['seq']}  receipt {m['receipt']}  deliveries {m['deliveries']}  body {m['body']!r}"
             for m in result["messages"]] or ["(nothing ready)"]
    _print(args, result, "\n".join(lines))
    return 0


def cmd_ack(args) -> int:
    with _client(args) as client:
        result = client.ack(args.queue, args.receipts)
    _print(args, result, f"acked {result['acked']}" + (f", stale {result['stale']}" if result["stale"] else ""))
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="raftq", description="A Raft-replicated durable queue cluster.")
    sub = top.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run a local cluster in the foreground")
    up.add_argument("--nodes", type=int, choices=(3, 5), default=3)
    up.add_argument("--data-dir", default=".raftq")
    up.add_argument("--http-port", type=int, default=8001)
    up.add_argument("--raft-port", type=int, default=7001)
    up.add_argument("--demo", action="store_true", help="put, receive and ack one message once it is up")
    up.set_defaults(run=cmd_up)

    node = sub.add_parser("node", help="run one node of a cluster")
    node.add_argument("--config", required=True)
    node.add_argument("--id", required=True)
    node.add_argument("--data-dir")
    node.add_argument("--auth-token-file")
    node.add_argument("--tls-cert")
    node.add_argument("--tls-key")
    node.add_argument("--tls-ca", help="CA bundle this node trusts when it calls other nodes over HTTPS")
    node.add_argument("--no-auto-create", action="store_true")
    node.add_argument("--max-message-bytes", type=int, default=1 << 20)
    node.add_argument("--log-level", default="INFO")
    # Test-only: keep journal bytes that were not fsynced in memory, so that
    # kill -9 loses exactly what a power cut would.
    node.set_defaults(run=cmd_node)

    cluster = sub.add_parser("cluster", help="operate the cluster")
    csub = cluster.add_subparsers(dest="action", required=True)
    for name in ("status", "verify"):
        p = csub.add_parser(name)
        p.add_argument("--json", action="store_true")
    add = csub.add_parser("add")
    add.add_argument("id")
    add.add_argument("raft")
    add.add_argument("http")
    add.add_argument("--json", action="store_true")
    remove = csub.add_parser("remove")
    remove.add_argument("id")
    remove.add_argument("--json", action="store_true")
    cluster.set_defaults(run=cmd_cluster)

    queues = sub.add_parser("queues", help="list queues")
    queues.add_argument("--json", action="store_true")
    queues.set_defaults(run=cmd_queues)

    put = sub.add_parser("put", help="put one message (BODY is JSON, or else a string)")
    put.add_argument("queue")
    put.add_argument("body")
    put.add_argument("--key")
    put.add_argument("--id")
    put.add_argument("--json", action="store_true")
    put.set_defaults(run=cmd_put)

    receive = sub.add_parser("receive", help="receive (lease) messages")
    receive.add_argument("queue")
    receive.add_argument("--group", default="default")
    receive.add_argument("--max", type=int, default=1)
    receive.add_argument("--wait", type=int, default=0, help="long-poll for up to this many ms")
    receive.add_argument("--json", action="store_true")
    receive.set_defaults(run=cmd_receive)

    ack = sub.add_parser("ack", help="acknowledge received messages")
    ack.add_argument("queue")
    ack.add_argument("receipts", nargs="+")
    ack.add_argument("--json", action="store_true")
    ack.set_defaults(run=cmd_ack)
    return top


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except RaftqError as exc:
        print(f"raftq: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"raftq: cannot reach {os.environ.get('RAFTQ_URL', DEFAULT_URL)}: {exc}", file=sys.stderr)
        return 1
