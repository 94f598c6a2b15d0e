"""`raftq node` (one node of a deployment) and `raftq up` (a local cluster in the foreground)."""

import asyncio
import sys
from pathlib import Path


def cmd_node(args) -> int:
    from api.app import Settings

    from .. import config as cluster_config
    from ..server import serve, setup_logging
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
    from ..local import up
    return up(args.nodes, args.data_dir, args.http_port, args.raft_port, args.demo)


def add_parsers(sub) -> None:
    up = sub.add_parser("up", help="run a local cluster in the foreground (Ctrl-C, SIGTERM or SIGHUP stops it)")
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
    node.set_defaults(run=cmd_node)
