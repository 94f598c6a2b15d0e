"""What an idle 3-node cluster costs as its Raft groups grow.

    .venv/bin/python -m bench.groups_idle [--groups 1,2,4,8] [--seconds 10] [--dir /tmp]

For each G, one cluster at a time: 3 nodes with G groups (3 replicas each,
so every node runs an engine per group), started, left until every group
has a leader and the leaders have spread, then measured while nothing is
asked of it: CPU seconds per 10 s, summed over every process of the three
nodes (supervisors, engines, fronts). The cost per group is the slope of a
least-squares line through the points. The issue's target: G = 4 at most
1.0 CPU-s per 10 s on the 2-core machine. The last line printed is one
JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench.measure import cpu_seconds, group_pids, machine
from raftq.local import LocalCluster

SETTLE_S = 3.0          # after the leaders spread: the balancers' last transfers, first snapshots


def group_list(value: str) -> list[int]:
    try:
        groups = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        groups = []
    if not groups or any(g < 1 for g in groups):
        raise argparse.ArgumentTypeError("groups are a comma-separated list of whole numbers from 1")
    return groups


def leaders_spread(cluster: LocalCluster) -> bool:
    """Every group of every node has a leader, and the leaders spread within one over the nodes."""
    views = [cluster.ready_view(node_id, groups=True) for node_id in cluster.ids]
    if not all(view and view.get("ready") and len(view.get("raft_groups", {})) == cluster.cfg.groups
               for view in views):
        return False
    leaders = {group: entry["leader"] for view in views for group, entry in view["raft_groups"].items()
               if entry["role"] == "leader"}
    if len(leaders) != cluster.cfg.groups:
        return False
    counts = [list(leaders.values()).count(node_id) for node_id in cluster.ids]
    return max(counts) - min(counts) <= 1


def idle_cost(root: Path, groups: int, seconds: float) -> float:
    """CPU seconds per 10 s of an idle 3-node cluster of `groups` groups."""
    cluster = LocalCluster.create(root, 3, groups=groups)
    try:
        cluster.start()
        deadline = time.monotonic() + 120
        while not leaders_spread(cluster):
            if time.monotonic() > deadline:
                raise RuntimeError(f"G={groups}: the leaders did not spread within 120 s; see {root}")
            time.sleep(0.2)
        time.sleep(SETTLE_S)
        supervisors = [cluster.pid(node_id) for node_id in cluster.ids]
        before = cpu_seconds(group_pids(supervisors))
        time.sleep(seconds)
        return (cpu_seconds(group_pids(supervisors)) - before) * 10 / seconds
    finally:
        cluster.close()


def slope(points: dict[int, float]) -> float | None:
    if len(points) < 2:
        return None
    xs, ys = list(points), list(points.values())
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=group_list, default=[1, 2, 4, 8])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--dir", default=None, help="where the clusters live (default: a temporary directory)")
    args = parser.parse_args()
    costs = {}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="groups-idle-") as tmp:
        for groups in args.groups:
            costs[groups] = idle_cost(Path(tmp) / f"g{groups}", groups, args.seconds)
            print(f"G={groups}: {costs[groups]:.3f} CPU-s per 10 s idle (3 nodes, every process)", flush=True)
    per_group = slope(costs)
    if per_group is not None:
        print(f"each group adds {per_group:.3f} CPU-s per 10 s (least squares over G)", flush=True)
    print(json.dumps({"idle_cpu_s_per_10s": {str(g): round(c, 3) for g, c in costs.items()},
                      "per_group_cpu_s_per_10s": None if per_group is None else round(per_group, 3),
                      "seconds": args.seconds, "machine": machine()}))


if __name__ == "__main__":
    main()
