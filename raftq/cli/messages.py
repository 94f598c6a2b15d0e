"""Messages from a terminal: put, receive, ack, nack, extend, browse, commit, tx, subscribe."""

import argparse
import json

from .connect import emit, target


def body_of(text: str):
    """A body given on the command line: JSON when it parses, else the string itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"a header is NAME=VALUE, not {text!r}")
    return name, value


def show_messages(messages: list, *, receipts: bool) -> str:
    lines = []
    for m in messages:
        line = f"seq {m['seq']}"
        if receipts:
            line += f"  receipt {m['receipt']}"
        line += f"  deliveries {m['deliveries']}"
        if m.get("key") is not None:
            line += f"  key {m['key']}"
        if m.get("headers"):
            line += "  headers " + ",".join(f"{k}={v}" for k, v in m["headers"].items())
        lines.append(line + f"  body {m['body']!r}")
    return "\n".join(lines)


def cmd_put(args) -> int:
    message = {"body": body_of(args.body)}
    for field, value in (("key", args.key), ("id", args.id), ("ttl_ms", args.ttl_ms), ("delay_ms", args.delay_ms)):
        if value is not None:
            message[field] = value
    if args.header:
        message["headers"] = dict(args.header)
    with target(args).client() as client:
        result = client.put_batch(args.queue, [message], durability=args.durability)
    m = result["messages"][0]
    emit(args, result, f"seq {m['seq']}" + (" (duplicate)" if m["duplicate"] else "")
         + (f" replaced {m['replaced_seq']}" if m["replaced_seq"] else ""))
    return 0


def cmd_receive(args) -> int:
    with target(args).client() as client:
        result = client.receive(args.queue, group=args.group, max=args.max, wait_ms=args.wait,
                                lease_ms=args.lease_ms)
    emit(args, result, show_messages(result["messages"], receipts=True) or "(nothing ready)")
    return 0


def cmd_settle(args) -> int:
    with target(args).client() as client:
        if args.command == "ack":
            result = client.ack(args.queue, args.receipts)
        elif args.command == "nack":
            result = client.nack(args.queue, args.receipts, delay_ms=args.delay_ms)
        else:
            result = client.extend(args.queue, args.receipts, lease_ms=args.lease_ms)
    done = {"ack": "acked", "nack": "nacked", "extend": "extended"}[args.command]
    emit(args, result, f"{done} {result[done]}" + (f", stale {result['stale']}" if result["stale"] else ""))
    return 0


def cmd_browse(args) -> int:
    with target(args).client() as client:
        result = client.browse(args.queue, group=args.group, from_seq=args.from_seq, limit=args.limit)
    emit(args, result, show_messages(result["messages"], receipts=False) or "(no messages)")
    return 0


def cmd_commit(args) -> int:
    with target(args).client() as client:
        result = client.commit(args.queue, args.group, args.seq)
    emit(args, result, f"acked {result['acked']}; cursor of {args.group} is {result['cursor']}")
    return 0


def cmd_tx(args) -> int:
    acks: dict[str, list] = {}
    for queue, receipt in args.ack or []:
        acks.setdefault(queue, []).append(receipt)
    puts: dict[str, list] = {}
    for queue, body in args.put or []:
        puts.setdefault(queue, []).append({"body": body_of(body)})
    if not acks and not puts:
        raise SystemExit("raftq tx: give at least one --ack QUEUE RECEIPT or --put QUEUE BODY")
    with target(args).client() as client:
        result = client.transaction(ack=[{"queue": q, "receipts": r} for q, r in acks.items()],
                                    put=[{"queue": q, "messages": m} for q, m in puts.items()])
    put_seqs = "; ".join(f"{p['queue']} seq {','.join(str(m['seq']) for m in p['messages'])}" for p in result["put"])
    emit(args, result, f"acked {result['acked']}" + (f", put {put_seqs}" if put_seqs else ""))
    return 0


def cmd_subscribe(args) -> int:
    """Messages pushed over the streaming wire (GET /v1/stream), printed as they come."""
    from ..client import BlockingConsumer
    where = target(args)
    seen = 0
    with BlockingConsumer(where.urls, args.queue, group=args.group, prefetch=args.prefetch, token=where.token,
                          cafile=where.cafile) as consumer:
        while args.count == 0 or seen < args.count:
            message = consumer.receive(timeout=args.idle)
            if message is None:
                break
            if not args.no_ack:
                message.ack()
            fields = {name: getattr(message, name) for name in
                      ("seq", "receipt", "body", "key", "headers", "deliveries", "put_at_ms")}
            emit(args, fields, show_messages([fields], receipts=args.no_ack))
            seen += 1
        consumer.flush()
    return 0


def add_parsers(sub, common) -> None:
    put = sub.add_parser("put", parents=[common], help="put one message (BODY is JSON, or else a string)")
    put.add_argument("queue")
    put.add_argument("body")
    put.add_argument("--key", help="replaces an unreceived message with the same key")
    put.add_argument("--id", help="idempotency id: a retry with it stores nothing new")
    put.add_argument("--header", action="append", type=header, metavar="NAME=VALUE")
    put.add_argument("--ttl-ms", type=int)
    put.add_argument("--delay-ms", type=int)
    put.add_argument("--durability", choices=("quorum", "all", "leader"))
    put.set_defaults(run=cmd_put)

    receive = sub.add_parser("receive", parents=[common], help="receive (lease) messages")
    receive.add_argument("queue")
    receive.add_argument("--group", default="default")
    receive.add_argument("--max", type=int, default=1)
    receive.add_argument("--wait", type=int, default=0, help="long-poll for up to this many ms")
    receive.add_argument("--lease-ms", type=int)
    receive.set_defaults(run=cmd_receive)

    for name, what in (("ack", "done with received messages"),
                       ("nack", "give received messages back (ready again, after --delay-ms)"),
                       ("extend", "push received messages' leases out")):
        p = sub.add_parser(name, parents=[common], help=what)
        p.add_argument("queue")
        p.add_argument("receipts", nargs="+")
        if name == "nack":
            p.add_argument("--delay-ms", type=int)
        if name == "extend":
            p.add_argument("--lease-ms", type=int, help="the new lease, from now (default: the queue's)")
        p.set_defaults(run=cmd_settle)

    browse = sub.add_parser("browse", parents=[common], help="stored messages a group has not acked, without leasing")
    browse.add_argument("queue")
    browse.add_argument("--group", default="default")
    browse.add_argument("--from-seq", type=int, default=0)
    browse.add_argument("--limit", type=int, default=100)
    browse.set_defaults(run=cmd_browse)

    commit = sub.add_parser("commit", parents=[common], help="ack every message up to SEQ for a group")
    commit.add_argument("queue")
    commit.add_argument("group")
    commit.add_argument("seq", type=int)
    commit.set_defaults(run=cmd_commit)

    tx = sub.add_parser("tx", parents=[common], help="acks and puts across queues, all or nothing")
    tx.add_argument("--ack", nargs=2, action="append", metavar=("QUEUE", "RECEIPT"))
    tx.add_argument("--put", nargs=2, action="append", metavar=("QUEUE", "BODY"))
    tx.set_defaults(run=cmd_tx)

    subscribe = sub.add_parser("subscribe", parents=[common],
                               help="messages pushed over the streaming wire as they come, acked unless --no-ack")
    subscribe.add_argument("queue")
    subscribe.add_argument("--group", default="default")
    subscribe.add_argument("--count", type=int, default=0, help="stop after this many (0: never)")
    subscribe.add_argument("--idle", type=float, default=None, help="stop after this many seconds without one")
    subscribe.add_argument("--prefetch", type=int, default=100, help="messages pushed before they are settled")
    subscribe.add_argument("--no-ack", action="store_true", help="leave them leased: they come back when it ends")
    subscribe.set_defaults(run=cmd_subscribe)
