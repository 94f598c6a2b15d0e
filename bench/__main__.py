"""python -m bench compare: raftq beside RabbitMQ and NATS, in one run.

    python -m bench compare [--systems raftq,raftq-http,rabbitmq,nats,nats-lazy] [--reps 2] [--seconds 5]
                            [--backlog 100000] [--failovers 9] [--stored 1000000] [--w5-rate 5000]
                            [--scale 1,4,8] [--groups 1,8] [--backlog-messages 200000] [--backlog-big-messages 20000]
                            [--out results]

RabbitMQ comes from Debian's package, NATS from the `bench` extra: run
bench/peers/setup once.
The last line of output is one JSON object of the figures (raftq ÷ peer ratios
among them); report.md, report.json and PNG plots go to --out.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

from bench.backlog_bench import BODY, FILL_WINDOW_S, churn_size, message_count, window_seconds
from bench.measure import counts

SYSTEMS = ("raftq", "raftq-http", "rabbitmq", "nats", "nats-lazy")


def _systems(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = set(names) - set(SYSTEMS)
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"systems are a comma-separated subset of {', '.join(SYSTEMS)}")
    return names


def _rate(value: str) -> float:
    try:
        rate = float(value)
    except ValueError:
        rate = 0.0
    if not rate > 0:
        raise argparse.ArgumentTypeError("a rate is a number of messages per second above 0")
    return rate


def _backlog_count(value: str) -> int:
    count = message_count(value)
    if 0 < count < 2000:
        raise argparse.ArgumentTypeError("the backlog row takes 0 (skip it) or at least 2000 messages")
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    compare = sub.add_parser("compare", help="raftq, RabbitMQ and NATS side by side")
    compare.add_argument("--systems", type=_systems, default=list(SYSTEMS))
    compare.add_argument("--reps", type=int, default=2, help="interleaved repetitions of W1-W3 and W5")
    compare.add_argument("--seconds", type=float, default=5.0, help="length of each timed workload")
    compare.add_argument("--backlog", type=int, default=100_000, help="messages consumed in W3")
    compare.add_argument("--failovers", type=int, default=9,
                         help="W4 rounds per system (a median of few rounds moves a lot from run to run)")
    compare.add_argument("--stored", type=int, default=1_000_000,
                         help="messages raftq holds for the RSS and restart figures (0: skip)")
    compare.add_argument("--w5-rate", type=_rate, default=5000.0,
                         help="W5's one rate for every system, msgs/s (W5b: each at half its own maximum)")
    compare.add_argument("--scale", type=counts("client process"), default=[1, 4, 8],
                         help="W6's numbers of client processes, each producing to a queue of its own")
    compare.add_argument("--groups", type=counts("Raft group"), default=[1, 8],
                         help="raftq's W6 with each of these numbers of Raft groups (1: on the cluster of W1-W5; "
                              "each other G: a raftq-gG column, a cluster of its own up for W6 only)")
    compare.add_argument("--backlog-messages", type=_backlog_count, default=200_000,
                         help="raftq's backlog row (bench/backlog_bench.py): 100-byte messages stored (0: skip it)")
    compare.add_argument("--backlog-big-messages", type=message_count, default=20_000,
                         help="the backlog row's 10 KiB messages (0: none)")
    compare.add_argument("--backlog-churn-bytes", type=churn_size, default=len(BODY),
                         help="the body of the backlog row's puts that grow the log to a snapshot (its own size)")
    compare.add_argument("--backlog-window-s", type=window_seconds, default=FILL_WINDOW_S,
                         help="the backlog row's dedup window, which its memory at rest waits out")
    compare.add_argument("--out", default="results", help="parent folder of the results")
    args = parser.parse_args(argv)
    # A stop by SIGTERM unwinds like Ctrl-C, so every cluster started is stopped by PID on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    from bench.compare import run
    report = run(args)
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
