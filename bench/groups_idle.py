"""Idle cost per Raft group: what a cluster of N nodes spends doing nothing,
with G = 1, 2, 4, 8 groups, side by side in one run (issue 24).

    .venv/bin/python bench/groups_idle.py [--groups 1,2,4,8] [--nodes 3] [--seconds 10] [--reps 3]

Every cluster is started at once and left idle (no client asks anything) for
SETTLE_S after its last node is ready, so that elections, the first
heartbeats and leader balancing are behind it; then, `--reps` times, each
cluster's CPU (every process of every node: supervisor, engines, fronts) is
read at the start and the end of the same `--seconds` window, so the
machine's load falls on every cluster alike. The figures are medians over
the windows, in CPU-seconds per 10 s, whole and by kind of process (the
processes name themselves, engine/lifetime.py); the cost per group is the
least-squares slope of the whole against G, and what is left at G = 0 (the
intercept) is what a node costs without its groups: fronts and supervisors.
Issue 24's target, G = 4 at 1.0 CPU-s per 10 s at most on a 3-node cluster,
is printed beside its figure. The last line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    # run as a script: this tree's code, here and in the nodes it starts
    sys.path.insert(0, str(ROOT))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])

from bench.measure import counts, cpu_by_process, group_pids, machine, process_name  # noqa: E402
from raftq.local import LocalCluster  # noqa: E402

SETTLE_S = 10.0
UP_S = 120.0
TARGET_G4_CPU_S_PER_10S = 1.0
KINDS = ("engines", "fronts", "supervisors", "other")


def kind_of(pid: int) -> str:
    name = process_name(pid) or ""
    if name.startswith("raftq-group-"):
        return "engines"
    if name.startswith("raftq-front-"):
        return "fronts"
    return "supervisors" if name == "raftq-node" else "other"


def processes(cluster: LocalCluster) -> list[int]:
    return group_pids([pid for pid in map(cluster.pid, cluster.ids) if pid is not None])


def idle_window(clusters: dict[int, LocalCluster], seconds: float) -> dict[int, dict[str, float]]:
    """Each cluster's CPU-seconds per 10 s by kind of process, over one window they share."""
    pids = {g: processes(c) for g, c in clusters.items()}
    before = {g: cpu_by_process(p) for g, p in pids.items()}
    time.sleep(seconds)
    after = {g: cpu_by_process(p) for g, p in pids.items()}
    spent = {}
    for g in clusters:
        by_kind = dict.fromkeys(KINDS, 0.0)
        for pid, cpu in before[g].items():
            if pid in after[g]:               # one gone since took its CPU along (none should)
                by_kind[kind_of(pid)] += (after[g][pid] - cpu) * 10 / seconds
        spent[g] = by_kind
    return spent


def slope_and_intercept(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares of ys = slope × xs + intercept."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / spread if spread else 0.0
    return slope, my - slope * mx


def measure(root: Path, groups: list[int], nodes: int, seconds: float, reps: int, log=print) -> dict:
    clusters = {g: LocalCluster.create(root / f"g{g}", nodes, groups=g) for g in groups}
    try:
        for cluster in clusters.values():
            cluster.start()
        for g, cluster in clusters.items():
            if cluster.wait_for_leader(UP_S) is None or not cluster.wait_all_ready(UP_S):
                raise RuntimeError(f"the cluster of {g} groups did not come up; see {cluster.root}")
        for g, cluster in clusters.items():
            kinds = [kind_of(pid) for pid in processes(cluster)]
            log(f"G = {g}: {len(kinds)} processes ({kinds.count('engines')} engines, "
                f"{kinds.count('fronts')} fronts, {kinds.count('supervisors')} supervisors)")
        time.sleep(SETTLE_S)
        windows = []
        for rep in range(reps):
            windows.append(idle_window(clusters, seconds))
            log(f"rep {rep + 1}: CPU-s per 10 s " + ", ".join(
                f"G = {g} {sum(spent.values()):.3f}" for g, spent in windows[-1].items()))
    finally:
        for cluster in clusters.values():
            cluster.close()
    whole = {g: statistics.median(sum(w[g].values()) for w in windows) for g in groups}
    by_kind = {g: {kind: round(statistics.median(w[g][kind] for w in windows), 3) for kind in KINDS}
               for g in groups}
    per_group, base = slope_and_intercept([float(g) for g in groups], [whole[g] for g in groups])
    figures = {"nodes": nodes, "seconds": seconds, "reps": reps, "machine": machine(),
               "cpu_s_per_10s": {str(g): round(whole[g], 3) for g in groups},
               "cpu_s_per_10s_by_kind": {str(g): by_kind[g] for g in groups},
               "per_group_cpu_s_per_10s": round(per_group, 3), "base_cpu_s_per_10s": round(base, 3),
               "per_engine_cpu_s_per_10s": {str(g): round(by_kind[g]["engines"] / (g * nodes), 3)
                                            for g in groups}}
    if 4 in groups and nodes == 3:
        figures["g4_target_met"] = whole[4] <= TARGET_G4_CPU_S_PER_10S
        log(f"target G = 4 <= {TARGET_G4_CPU_S_PER_10S} CPU-s per 10 s: {whole[4]:.3f}, "
            + ("met" if figures["g4_target_met"] else "not met"))
    log(f"per group {per_group:.3f} CPU-s per 10 s, base (fronts, supervisors) {base:.3f}")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=counts("Raft group"), default=[1, 2, 4, 8], help="the clusters' numbers of Raft groups")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each idle window")
    parser.add_argument("--reps", type=int, default=3, help="idle windows")
    args = parser.parse_args(argv)
    if len(args.groups) < 2 or args.nodes < 1 or args.seconds <= 0 or args.reps < 1:
        parser.error("--groups takes at least two counts (the cost per group is a slope), --nodes and --reps "
                     "are at least 1, --seconds above 0")
    root = Path(tempfile.mkdtemp(prefix="raftq-groups-idle-"))
    try:
        figures = measure(root, args.groups, args.nodes, args.seconds, args.reps)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
