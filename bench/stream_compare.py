"""This tree's streaming wire against another revision's, node and client both, in one run.

    .venv/bin/python -m bench.stream_compare [--baseline REV] [--candidate REV] [--reps 3]
                                             [--seconds 4] [--backlog 50000] [--only-w1]

Each revision is exported (``git archive``) to a scratch folder; the
candidate is the working tree unless named. Every repetition runs, in each
tree in turn (the order alternating, so drifting load on a shared machine
falls on both), a child process whose imports come from that tree: it starts
a fresh 3-node cluster of that tree and drives it with that tree's Producer
and Consumer exactly as ``python -m bench compare`` does (``bench.raftq_side``):
W1 (one message at a time: p50, p99), W2 (single messages through one
Producer: messages/s) and W3 (one Consumer draining a backlog: messages/s),
with the server's and the client's CPU per message. Figures are medians over
the repetitions; each ratio is candidate ÷ baseline (throughput above 1,
latency and CPU below 1 favour the candidate). The last line is one JSON
object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def log(message: str) -> None:
    print(message, flush=True)


def one_tree(seconds: float, backlog: int, only_w1: bool) -> dict:
    """In the child: this tree's cluster and clients (the tree is the working directory)."""
    sys.path.insert(0, os.getcwd())
    from bench.compare import _latency_figures, measured
    from bench.raftq_side import Raftq

    side = Raftq(Path(tempfile.mkdtemp(prefix="raftq-stream-compare-")))
    side.start()
    try:
        w1 = measured(side, side.w1, seconds)
        _latency_figures(w1, "latencies_ms")
        out = {"w1_p50_ms": w1["p50_ms"], "w1_p99_ms": w1["p99_ms"],
               "w1_server_cpu_us": w1["server_cpu_us_per_msg"]}
        if not only_w1:
            w2 = measured(side, side.w2, seconds)
            w3 = measured(side, side.w3, side.fill(backlog), backlog)
            out.update({"w2_msgs_per_s": w2["msgs_per_s"], "w2_server_cpu_us": w2["server_cpu_us_per_msg"],
                        "w2_client_cpu_us": w2["client_cpu_us_per_msg"], "w3_msgs_per_s": w3["msgs_per_s"],
                        "w3_server_cpu_us": w3["server_cpu_us_per_msg"],
                        "w3_client_cpu_us": w3["client_cpu_us_per_msg"]})
        return out
    finally:
        side.stop()
        shutil.rmtree(side.root, ignore_errors=True)


def export(rev: str, into: Path) -> Path:
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="raftq-stream-compare-trees-") as tmp:
        trees = {"baseline": export(args.baseline, Path(tmp) / "baseline"),
                 "candidate": export(args.candidate, Path(tmp) / "candidate") if args.candidate else ROOT}
        runs: dict[str, list[dict]] = {name: [] for name in trees}
        child = [sys.executable, str(Path(__file__).resolve()), "--child",
                 "--seconds", str(args.seconds), "--backlog", str(args.backlog)] + (["--only-w1"] if args.only_w1 else [])
        for rep in range(args.reps):
            order = list(trees) if rep % 2 == 0 else list(reversed(trees))
            for name in order:
                done = subprocess.run(child, cwd=trees[name], capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
                figures = json.loads(done.stdout.strip().splitlines()[-1])
                runs[name].append(figures)
                log(f"rep {rep} {name:<9} " + "  ".join(f"{k} {v:,.2f}" for k, v in figures.items()))
    result: dict = {"baseline": args.baseline, "candidate": args.candidate or "working tree", "reps": args.reps}
    for name, figures in runs.items():
        for key in figures[0]:
            result[f"{name}_{key}"] = round(statistics.median(f[key] for f in figures), 3)
    for key in runs["candidate"][0]:
        base = result[f"baseline_{key}"]
        result[f"{key}_ratio"] = round(result[f"candidate_{key}"] / base, 3) if base else None
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="HEAD", help="the git revision to compare against")
    parser.add_argument("--candidate", default=None, help="a git revision (default: the working tree)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="length of W1 and W2")
    parser.add_argument("--backlog", type=int, default=50_000, help="messages W3 drains")
    parser.add_argument("--only-w1", action="store_true", help="W1 alone (its tail needs many repetitions)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_tree(args.seconds, args.backlog, args.only_w1)))
        return
    figures = run(args)
    for key in sorted(k for k in figures if k.endswith("_ratio")):
        log(f"{key[:-6]:<20} candidate/baseline {figures[key]}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
