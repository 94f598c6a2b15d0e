"""Messages from a terminal: put, receive, ack, nack, extend, browse, commit, tx, subscribe."""

import argparse
import base64
import json
import sys

from raftq.wire_format import with_body_b64

from .connect import emit, target


class BodyError(Exception):
    """A message body given on the command line that is not what its flag says."""


def json_body(text: str):
    """BODY as JSON: a typo in it is an error, never silently a string."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BodyError(f"the body {text!r} is not JSON ({exc}); give --text to send it as a string, "
                        "--base64 for bytes, or --file PATH") from None


def body_of(args):
    """The message body as the flags say: JSON (default), --text, --base64 or --file (bytes)."""
    if args.file is not None:
        if args.body is not None:
            raise BodyError("give the body or --file, not both")
        try:
            with open(args.file, "rb") as source:
                return source.read()
        except OSError as exc:
            raise BodyError(f"cannot read --file {args.file}: {exc.strerror}") from None
    if args.body is None:
        raise BodyError("give the message body (JSON unless --text or --base64), or --file PATH")
    if args.text:
        return args.body
    if args.base64:
        try:
            return base64.b64decode(args.body, validate=True)
        except ValueError:
            raise BodyError(f"the body {args.body!r} is not base64") from None
    return json_body(args.body)


def header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"a header is NAME=VALUE, not {text!r}")
    return name, value


def show_messages(messages: list, *, receipts: bool) -> str:
    """One line of JSON per message (a byte body as body_b64), without receipts unless asked."""
    hidden = () if receipts else ("receipt",)
    return "\n".join(json.dumps({k: v for k, v in with_body_b64(m).items() if k not in hidden}) for m in messages)


def print_messages(args, result: dict, *, receipts: bool, none: str) -> None:
    """--json: the whole answer in one line; else a line of JSON per message, and `none`
    on stderr when there is none, so that stdout holds only JSON either way."""
    shown = {**result, "messages": [with_body_b64(m) for m in result["messages"]]}
    if args.json or shown["messages"]:
        emit(args, shown, show_messages(result["messages"], receipts=receipts))
    else:
        print(none, file=sys.stderr)


def cmd_put(args) -> int:
    try:
        message = {"body": body_of(args)}
    except BodyError as exc:
        print(f"raftq put: {exc}", file=sys.stderr)
        return 2
    for field, value in (("key", args.key), ("id", args.id), ("ttl_ms", args.ttl_ms), ("delay_ms", args.delay_ms),
                         ("priority", args.priority)):
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
    print_messages(args, result, receipts=True, none="(nothing ready)")
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
    print_messages(args, result, receipts=False, none="(no messages)")
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
        try:
            puts.setdefault(queue, []).append({"body": json_body(body)})
        except BodyError as exc:
            print(f"raftq tx: {exc}", file=sys.stderr)
            return 2
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
                      ("seq", "receipt", "body", "key", "headers", "deliveries", "put_at_ms", "priority")}
            emit(args, with_body_b64(fields), show_messages([fields], receipts=args.no_ack))
            seen += 1
        consumer.flush()
    return 0


def add_parsers(sub, common) -> None:
    put = sub.add_parser("put", parents=[common],
                         help="put one message (BODY is JSON; --text, --base64 or --file for anything else)")
    put.add_argument("queue")
    put.add_argument("body", nargs="?", help="the body, as JSON unless --text or --base64 says otherwise")
    kind = put.add_mutually_exclusive_group()
    kind.add_argument("--text", action="store_true", help="BODY is sent as a string, as it is")
    kind.add_argument("--base64", action="store_true", help="BODY is base64: the body is the bytes it decodes to")
    kind.add_argument("--file", metavar="PATH", help="the body is the bytes of this file (no BODY)")
    put.add_argument("--key", help="replaces an unreceived message with the same key")
    put.add_argument("--id", help="idempotency id: a retry with it stores nothing new")
    put.add_argument("--header", action="append", type=header, metavar="NAME=VALUE")
    put.add_argument("--ttl-ms", type=int)
    put.add_argument("--delay-ms", type=int)
    put.add_argument("--priority", type=int, help="0 (the default, the lowest) to 9: higher is received first")
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
                       ("nack", "give received messages back (ready again after --delay-ms, or as the "
                                "queue's back-off says)"),
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
    tx.add_argument("--put", nargs=2, action="append", metavar=("QUEUE", "BODY"), help="BODY is JSON")
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
