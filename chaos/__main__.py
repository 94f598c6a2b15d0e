"""python -m chaos: run a chaos campaign, re-check a saved history, or print a schedule.

    python -m chaos run --nodes 3|5 --minutes N [--groups G [--replicas R]] [--seed S] [--out results] [--load-at-birth]
    python -m chaos check results/<run>/history.jsonl
    python -m chaos plan --nodes 3 --seed S [--cycles 1]

`run` and `check` exit 0 when every property holds, 1 otherwise; their last
line of output is the summary as one JSON object.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from chaos.nemesis import KINDS, plan


def _kinds(value: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in value.split(",") if k.strip())
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    return kinds


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, not {value!r}")
    return number


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a campaign against a fresh local cluster")
    run.add_argument("--nodes", type=int, choices=(3, 5), default=3)
    length = run.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, help="inject faults for this long (default 1)")
    length.add_argument("--cycles", type=int, help="inject every fault kind this many times instead")
    run.add_argument("--seed", type=int, help="schedule seed (default: random, printed)")
    run.add_argument("--kinds", type=_kinds, default=KINDS, help="comma-separated fault kinds (default: all)")
    run.add_argument("--out", type=Path, default=Path("results"), help="parent folder of the results")
    run.add_argument("--groups", type=_positive, default=1,
                     help="Raft groups of the cluster (default 1); queues spread over them")
    run.add_argument("--replicas", type=_positive, help="members of each group but group 0 (default 3, at most the nodes)")
    run.add_argument("--backlog", type=_positive, default=None,
                     help="store this many messages before the faults and read them back after (default none)")
    run.add_argument("--load-at-birth", action="store_true",
                     help="start producers and consumers with the nodes, before any leader exists")
    check = sub.add_parser("check", help="judge a saved history again")
    check.add_argument("history", type=Path)
    show = sub.add_parser("plan", help="print the fault schedule a seed gives")
    show.add_argument("--nodes", type=int, choices=(3, 5), default=3)
    show.add_argument("--seed", type=int, required=True)
    show.add_argument("--cycles", type=int, default=1)
    show.add_argument("--kinds", type=_kinds, default=KINDS)
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: the runner's cleanup stops every process it started
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    if args.command == "plan":
        for fault in plan(args.seed, args.nodes, args.cycles, args.kinds):
            print(f"{fault.kind:<18} gap {fault.gap_s:4.2f}s hold {fault.hold_s:4.2f}s {fault.params}")
        return 0
    if args.command == "check":
        from chaos.checker import check as judge, render
        from chaos.history import load
        report = judge(load(args.history))
        print(render(report))
        return 0 if report.valid else 1
    from chaos.runner import Options, run as campaign
    if args.minutes is not None and args.minutes < 1:
        parser.error("--minutes must be at least 1")
    if args.replicas is not None and args.replicas > args.nodes:
        parser.error(f"--replicas must be at most --nodes ({args.nodes})")
    minutes = None if args.cycles is not None else (args.minutes if args.minutes is not None else 1.0)
    report = campaign(Options(nodes=args.nodes, minutes=minutes, cycles=args.cycles, seed=args.seed,
                              kinds=args.kinds, out=args.out, load_at_birth=args.load_at_birth,
                              groups=args.groups, replicas=args.replicas, backlog=args.backlog or 0))
    return 0 if report.valid else 1


if __name__ == "__main__":
    sys.exit(main())
