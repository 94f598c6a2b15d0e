"""`raftq queues`, `raftq queue ...`, `raftq group ...`, `raftq redrive`: queues and their groups."""

import argparse
import json
from datetime import datetime

from .connect import emit, table, target

UNSET = object()
# flag -> (config field, kind); "none" clears an optional field
CONFIG_FLAGS = {
    "--lease-ms": ("lease_ms", int),
    "--max-deliveries": ("max_deliveries", "optional int"),
    "--dead-letter": ("dead_letter", "optional str"),
    "--ttl-ms": ("ttl_ms", "optional int"),
    "--max-length": ("max_length", "optional int"),
    "--max-bytes": ("max_bytes", "optional int"),
    "--overflow": ("overflow", str),
    "--dedup-window-ms": ("dedup_window_ms", int),
    "--backoff": ("backoff", "backoff"),
    "--retention-ms": ("retention_ms", "optional int"),
    "--retention-bytes": ("retention_bytes", "optional int"),
}
BACKOFF_FIELDS = {"initial_ms": int, "factor": float, "max_ms": int, "jitter": float}


def backoff_spec(text: str):
    """--backoff: 'none', or NAME=VALUE,... of initial_ms, factor, max_ms, jitter (docs/api.md)."""
    if text.lower() in ("none", "null"):
        return None
    policy = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or name not in BACKOFF_FIELDS:
            raise argparse.ArgumentTypeError(f"--backoff is 'none' or NAME=VALUE,... of {', '.join(BACKOFF_FIELDS)}, "
                                             f"not {text!r}")
        try:
            policy[name] = BACKOFF_FIELDS[name](value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--backoff: {name}={value!r} is not a number") from None
    return policy


def position(text: str):
    """A group's position: earliest, latest, seq:N, time:MS or time:<ISO 8601 time> (log time
    starts at the wall clock, so a wall-clock time names about the messages put then)."""
    if text in ("earliest", "latest"):
        return text
    kind, sep, value = text.partition(":")
    try:
        if sep and kind == "seq":
            return {"seq": int(value)}
        if sep and kind == "time":
            if value.isdigit():
                return {"time_ms": int(value)}
            return {"time_ms": int(datetime.fromisoformat(value).timestamp() * 1000)}
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"a position is earliest, latest, seq:N, time:MS or time:2026-12-01T10:00:00Z, "
                                     f"not {text!r}")


def settings_of(group: dict) -> tuple[str, str]:
    """A group's pause and rate limit, as a table shows them."""
    paused = ("until resumed" if group["resume_at_ms"] is None else f"until {group['resume_at_ms']}") \
        if group["paused"] else "no"
    return paused, "-" if group["rate_limit"] is None else f"{group['rate_limit']}/s"


def _optional(kind):
    def parse(text: str):
        if text.lower() in ("none", "null"):
            return None
        if kind is int:
            try:
                return int(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{text!r} is not an integer or 'none'") from None
        return text
    return parse


def config_from(args) -> dict:
    """The queue config the flags (and --config JSON) give; flags win."""
    config = {}
    if args.config:
        try:
            config = json.loads(args.config)
        except ValueError as exc:
            raise SystemExit(f"raftq: --config is not JSON: {exc}") from None
        if not isinstance(config, dict):
            raise SystemExit("raftq: --config must be a JSON object")
    for flag, (field, _) in CONFIG_FLAGS.items():
        value = getattr(args, field)
        if value is not UNSET:
            config[field] = value
    return config


def describe_queue(info: dict) -> str:
    stats, config = info["stats"], info["config"]
    lines = [f"queue {info['name']}",
             "  config: " + ", ".join(f"{k}={v}" for k, v in config.items()),
             "  depth {depth}  in_flight {in_flight}  delayed {delayed}  bytes {bytes}  "
             "retained {retained} ({retained_bytes} bytes)  seqs {first_seq}..{last_seq}".format(**stats),
             "  totals: " + ", ".join(f"{k.removesuffix('_total')} {v}" for k, v in stats.items()
                                      if k.endswith("_total")),
             table(("  group", "depth", "in_flight", "cursor", "paused", "rate"),
                   [("  " + g, s["depth"], s["in_flight"], s["cursor"], *settings_of(s))
                    for g, s in stats["groups"].items()])]
    return "\n".join(lines)


def cmd_queues(args) -> int:
    with target(args).client() as client:
        view = client.queues()
    rows = [(q["name"], q["depth"], q["in_flight"], ",".join(q["groups"])) for q in view["queues"]]
    emit(args, view, table(("queue", "depth", "in_flight", "groups"), rows) if rows else "(no queues)")
    return 0


def cmd_queue(args) -> int:
    with target(args).client() as client:
        if args.action == "show":
            info = client.queue(args.queue)
            emit(args, info, describe_queue(info))
        elif args.action == "create":
            result = client.create_queue(args.queue, **config_from(args))
            emit(args, result, f"queue {args.queue}: " + ", ".join(f"{k}={v}" for k, v in result["config"].items()))
        elif args.action == "patch":
            result = client.patch_queue(args.queue, **config_from(args))
            emit(args, result, f"queue {args.queue}: " + ", ".join(f"{k}={v}" for k, v in result["config"].items()))
        else:
            client.delete_queue(args.queue)
            emit(args, {"deleted": args.queue}, f"deleted {args.queue}")
    return 0


def describe_group(g: dict) -> str:
    paused, rate = settings_of(g)
    return (f"group {g['name']}: depth {g['depth']}  in_flight {g['in_flight']}  cursor {g['cursor']}  "
            f"paused {paused}  rate limit {rate}")


def cmd_group(args) -> int:
    with target(args).client() as client:
        if args.action == "list":
            view = client.groups(args.queue)
            emit(args, view, table(("group", "depth", "in_flight", "cursor", "paused", "rate"),
                                   [(g["name"], g["depth"], g["in_flight"], g["cursor"], *settings_of(g))
                                    for g in view["groups"]]))
        elif args.action == "show":
            g = client.group(args.queue, args.group)
            emit(args, g, describe_group(g))
        elif args.action == "add":
            g = client.add_group(args.queue, args.group, start=args.start)
            emit(args, g, f"group {g['name']} of {args.queue}: depth {g['depth']}  cursor {g['cursor']}")
        elif args.action == "seek":
            g = client.seek_group(args.queue, args.group, args.to)
            emit(args, g, f"group {g['name']} of {args.queue}: replays {g['replayed']}, acked {g['acked']} before "
                          f"it; depth {g['depth']}  cursor {g['cursor']}")
        elif args.action in ("pause", "resume", "limit"):
            if args.action == "pause":
                g = client.pause_group(args.queue, args.group, for_ms=args.for_ms, until_ms=args.until_ms)
            elif args.action == "resume":
                g = client.resume_group(args.queue, args.group)
            else:
                g = client.limit_group_rate(args.queue, args.group, args.rate)
            emit(args, g, describe_group(g))
        else:
            client.delete_group(args.queue, args.group)
            emit(args, {"deleted": args.group}, f"deleted group {args.group} of {args.queue}")
    return 0


def cmd_redrive(args) -> int:
    with target(args).client() as client:
        result = client.redrive(args.queue, from_queue=args.from_queue, max=args.max)
    moved = ", ".join(f"{n} to {q}" for q, n in result["to"].items()) or "nothing"
    emit(args, result, f"moved {moved}" + (" (answered before: a retried request)" if result["duplicate"] else ""))
    return 0


def add_parsers(sub, common) -> None:
    queues = sub.add_parser("queues", parents=[common], help="list queues")
    queues.set_defaults(run=cmd_queues)

    queue = sub.add_parser("queue", help="show, create, patch or delete one queue")
    actions = queue.add_subparsers(dest="action", required=True)
    show = actions.add_parser("show", parents=[common], help="config and stats of one queue")
    show.add_argument("queue")
    for name in ("create", "patch"):
        p = actions.add_parser(name, parents=[common], help=f"{name} a queue; flags set config fields "
                                                            "('none' clears an optional one)")
        p.add_argument("queue")
        p.add_argument("--config", help="the config as a JSON object (flags override its fields)")
        for flag, (field, kind) in CONFIG_FLAGS.items():
            parse = backoff_spec if kind == "backoff" else \
                _optional(int if kind == "optional int" else str) if isinstance(kind, str) else kind
            p.add_argument(flag, dest=field, type=parse, default=UNSET,
                           choices=("reject", "drop_oldest") if field == "overflow" else None,
                           **({"metavar": "none|initial_ms=MS,factor=F,max_ms=MS,jitter=J",
                               "help": "redelivery back-off of a lease that ends or a nack without a delay"}
                              if field == "backoff" else {}))
    delete = actions.add_parser("delete", parents=[common], help="delete a queue and its messages")
    delete.add_argument("queue")
    queue.set_defaults(run=cmd_queue)

    group = sub.add_parser("group", help="a queue's consumer groups")
    gactions = group.add_subparsers(dest="action", required=True)
    glist = gactions.add_parser("list", parents=[common])
    glist.add_argument("queue")
    for name, what in (("show", "one group's depth, cursor, pause and rate limit"),
                       ("add", "add a group"), ("delete", "delete a group"),
                       ("seek", "move a group to a position: it replays the stored messages from there"),
                       ("pause", "hand the group nothing (until resumed, --for-ms, or --until-ms)"),
                       ("resume", "end a group's pause"),
                       ("limit", "at most RATE deliveries a second to the group ('none' lifts it)")):
        p = gactions.add_parser(name, parents=[common], help=what)
        p.add_argument("queue")
        p.add_argument("group")
        if name == "add":
            p.add_argument("--start", type=position, default="earliest",
                           help="earliest (every stored message, retained ones too), latest (only later ones), "
                                "seq:N or time:MS / time:ISO-8601")
        elif name == "seek":
            p.add_argument("to", type=position, help="earliest, latest, seq:N, time:MS or time:ISO-8601")
        elif name == "pause":
            until = p.add_mutually_exclusive_group()
            until.add_argument("--for-ms", type=int, help="resume by itself after this long")
            until.add_argument("--until-ms", type=int, help="resume by itself at this log time")
        elif name == "limit":
            p.add_argument("rate", type=_optional(int), help="deliveries a second, or none")
    group.set_defaults(run=cmd_group)

    redrive = sub.add_parser("redrive", parents=[common],
                             help="move dead letters back to the queue they died in")
    redrive.add_argument("queue", help="the dead-letter queue")
    redrive.add_argument("--from-queue", help="only dead letters of this queue")
    redrive.add_argument("--max", type=int, help="at most this many (default 1000)")
    redrive.set_defaults(run=cmd_redrive)
