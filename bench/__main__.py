"""python -m bench compare: raftq beside RabbitMQ and NATS, in one run.

    python -m bench compare [--systems raftq,raftq-http,rabbitmq,nats] [--reps 2] [--seconds 5]
                            [--backlog 100000] [--failovers 3] [--stored 1000000] [--out results]

RabbitMQ and NATS come from Debian's packages: run bench/peers/setup once.
The last line of output is one JSON object of the figures (raftq ÷ peer ratios
among them); report.md, report.json and PNG plots go to --out.
"""

from __future__ import annotations

import argparse
import json
import sys

SYSTEMS = ("raftq", "raftq-http", "rabbitmq", "nats")


def _systems(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = set(names) - set(SYSTEMS)
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"systems are a comma-separated subset of {', '.join(SYSTEMS)}")
    return names


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
    compare.add_argument("--out", default="results", help="parent folder of the results")
    args = parser.parse_args(argv)
    from bench.compare import run
    report = run(args)
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
