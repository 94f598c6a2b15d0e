"""`raftq node` (one node of a deployment), `raftq up` (a local cluster in the foreground, or
`--detach`ed) and `raftq down` (which stops it from anywhere).

`node` and `up` run nodes, which need the server's dependencies (pyproject.toml's
`server` extra); an install of the client alone has none of them, so neither
imports the node before `server_missing` has said what to install.
"""

import dataclasses
import logging
import os
import re
import sys
from importlib import metadata
from pathlib import Path


LOCAL_COMMANDS = ("up", "down", "node")     # the commands that reach no cluster over HTTP


def server_missing(command: str) -> str | None:
    """Why `command` cannot run a node here, and what to install; None when it can: the
    distributions the installed raftq's `server` extra names that are not installed (a
    checkout run without installing it has no such record, and is taken to have them)."""
    try:
        requirements = metadata.requires("raftq") or []
    except metadata.PackageNotFoundError:
        return None
    server = [re.match(r"[A-Za-z0-9._-]+", requirement).group() for requirement in requirements
              if re.search(r"""extra\s*==\s*["']server["']""", requirement)]
    missing = []
    for name in server:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    if not missing:
        return None
    return (f"{command}: this environment has raftq's client only, and a node needs the server's dependencies "
            f"({', '.join(missing)} missing). Install them with: {sys.executable} -m pip install 'raftq[server]'")


def cmd_node(args) -> int:
    missing = server_missing("raftq node")
    if missing:
        print(missing, file=sys.stderr)
        return 2
    from raftq.api.app import Settings
    from raftq.api.limits import Limits

    from raftq.engine import config as cluster_config
    from ..logs import setup_logging
    from ..server import run_node
    setup_logging(args.id, args.log_level)
    # Message bodies are on disk: every file and directory this node makes is its owner's only.
    os.umask(0o077)
    try:
        cfg = cluster_config.load(args.config)
        cfg.node(args.id)
    except cluster_config.ConfigError as exc:
        print(f"raftq node: {exc}", file=sys.stderr)
        return 2
    if cfg.secret is None and not args.insecure_no_secret:
        print(f"raftq node: {args.config} has no [cluster] secret; without one anyone who reaches the Raft "
              "port can run code on this node. Add one (raftq up makes one), or pass --insecure-no-secret "
              "for a throw-away test cluster", file=sys.stderr)
        return 2
    if not cfg.tokens.any() and not args.insecure_no_auth:
        print(f"raftq node: {args.config} has no [auth] admin token; without one anyone who reaches the HTTP "
              "port can read, delete and reconfigure everything. Add one, or pass --insecure-no-auth "
              "for a throw-away test cluster", file=sys.stderr)
        return 2
    for flag, given in (("--insecure-no-secret", args.insecure_no_secret),
                        ("--insecure-no-auth", args.insecure_no_auth)):
        if given:
            logging.getLogger(__name__).warning("INSECURE: started with %s; for tests only", flag)
    if bool(args.tls_cert) != bool(args.tls_key):
        print("raftq node: give both --tls-cert and --tls-key", file=sys.stderr)
        return 2
    limits = Limits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Limits)})
    if args.scrub_pass_hours < 0:
        print("raftq node: --scrub-pass-hours must be 0 (no scrubbing) or more", file=sys.stderr)
        return 2
    if args.disk_free_limit is not None and args.disk_free_limit < 0:
        print("raftq node: --disk-free-limit is a number of bytes, 0 or more", file=sys.stderr)
        return 2
    settings = Settings(tokens=cfg.tokens, sqs=cfg.sqs, max_message_bytes=args.max_message_bytes,
                        scheme="https" if args.tls_cert else "http", tls_ca=args.tls_ca,
                        scrub_pass_hours=args.scrub_pass_hours, limits=limits,
                        keys=cluster_config.ClusterKeys.derive(cfg.secret), disk_free_limit=args.disk_free_limit)
    data_dir = Path(args.data_dir or f".raftq/{args.id}")
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    data_dir.chmod(0o700)
    if args.workers < 1:
        print("raftq node: --workers must be at least 1", file=sys.stderr)
        return 2
    try:
        return run_node(cfg, args.id, str(data_dir), settings=settings,
                        tls=(args.tls_cert, args.tls_key) if args.tls_cert else None,
                        auto_create=not args.no_auto_create, workers=args.workers, joining=args.join)
    except OSError as exc:
        print(f"raftq node: cannot serve {args.id}: {exc}", file=sys.stderr)
        return 1


def cmd_up(args) -> int:
    missing = server_missing("raftq up")
    if missing:
        print(missing, file=sys.stderr)
        return 2
    if args.detach:
        from .down import detach
        return detach(_up_arguments(args), args.data_dir)
    from .up import up
    return up(args.nodes, args.data_dir, args.http_port, args.raft_port, args.demo, restart=not args.no_restart,
              groups=args.groups, replicas=args.replicas, sqs=args.sqs)


def _up_arguments(args) -> list[str]:
    """The `raftq up` a detached one runs: these arguments, its data directory made absolute."""
    argv = ["--nodes", str(args.nodes), "--data-dir", str(Path(args.data_dir).absolute()),
            "--http-port", str(args.http_port), "--raft-port", str(args.raft_port)]
    for flag, value in (("--groups", args.groups), ("--replicas", args.replicas)):
        if value is not None:
            argv += [flag, str(value)]
    return argv + ["--demo"] * args.demo + ["--no-restart"] * args.no_restart + ["--sqs"] * args.sqs


def cmd_down(args) -> int:
    from .down import down
    return down(args.data_dir, args.timeout)


def add_parsers(sub) -> None:
    up = sub.add_parser("up", help="run a local cluster in the foreground (Ctrl-C, SIGTERM or SIGHUP stops it)")
    up.add_argument("--nodes", type=int, choices=(3, 5), default=3)
    up.add_argument("--data-dir", default=".raftq")
    up.add_argument("--http-port", type=int, default=8001)
    up.add_argument("--raft-port", type=int, default=7001)
    up.add_argument("--groups", type=int,
                    help="Raft groups of a new cluster (default: half the cores, at least 1; fixed once made)")
    up.add_argument("--replicas", type=int,
                    help="members of each group but group 0 in a new cluster (default: 3, at most the nodes)")
    up.add_argument("--demo", action="store_true", help="put, receive and ack one message once it is up")
    up.add_argument("--sqs", action="store_true", help="an admin and a data key of the SQS API, in "
                                                       "sqs-admin.env and sqs-data.env beside cluster.toml")
    up.add_argument("--no-restart", action="store_true",
                    help="leave a node that exits down (default: start it again, backing off if it keeps exiting)")
    up.add_argument("--detach", action="store_true",
                    help="run in the background once the cluster serves (its output into DATA_DIR/up.log); "
                         "`raftq down` stops it")
    up.set_defaults(run=cmd_up)

    down = sub.add_parser("down", help="stop the local cluster a `raftq up` runs, from any terminal")
    down.add_argument("--data-dir", default=".raftq", help="the directory `raftq up` was given (default: .raftq)")
    down.add_argument("--timeout", type=float, default=15.0,
                      help="seconds a node has to stop (it hands over and flushes) before it is killed")
    down.set_defaults(run=cmd_down)

    node = sub.add_parser("node", help="run one node of a cluster")
    node.add_argument("--config", required=True)
    node.add_argument("--id", required=True)
    node.add_argument("--data-dir")
    node.add_argument("--insecure-no-secret", action="store_true",
                      help="run without a cluster secret: anyone reaching the Raft port can run code (tests only)")
    node.add_argument("--insecure-no-auth", action="store_true",
                      help="serve HTTP without tokens when the config has none (tests only)")
    node.add_argument("--tls-cert")
    node.add_argument("--tls-key")
    node.add_argument("--tls-ca", help="CA bundle this node trusts when it calls other nodes over HTTPS")
    node.add_argument("--no-auto-create", action="store_true")
    node.add_argument("--join", action="store_true",
                      help="a new node joining a running cluster (after `raftq cluster add`): with several Raft "
                           "groups it starts with group 0 alone, and runs the groups the replica mover gives it")
    node.add_argument("--workers", type=int, default=max(1, min(8, len(os.sched_getaffinity(0)) - 1)),
                      help="front processes serving HTTP (default: the cores but one, at least 1)")
    node.add_argument("--max-message-bytes", type=int, default=1 << 20,
                      help="a message's body, key, id and headers together")
    node.add_argument("--scrub-pass-hours", type=float, default=24.0,
                      help="read back and check every live log entry once in this long, in the background, "
                           "repairing damage from a replica (at most 4 MiB/s; 0: never; default 24)")
    node.add_argument("--disk-free-limit", type=int,
                      help="bytes the data directory's file system keeps free beyond this node's snapshots: below, "
                           "the node is in disk alarm and writes to its Raft groups are refused (507) until space "
                           "returns (default: 128 MiB for each group it holds; 0: no alarm)")
    from raftq.api.limits import LIMIT_HELP, Limits
    for f in dataclasses.fields(Limits):
        node.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default,
                          help=f"{LIMIT_HELP[f.name]} (default {f.default})")
    node.add_argument("--log-level", default="INFO")
    node.set_defaults(run=cmd_node)
