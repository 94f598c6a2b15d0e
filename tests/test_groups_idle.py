"""bench/groups_idle.py: one tiny run of clusters of 1 and 2 Raft groups, idle
side by side, ending with its figures. No figure is held to a target here (the
machine is shared): the bench prints issue 24's target beside its figure."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_a_tiny_idle_run_counts_every_process_of_each_cluster_by_kind():
    done = subprocess.run([sys.executable, "bench/groups_idle.py", "--groups", "1,2", "--seconds", "2", "--reps", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # one engine per group on each node, one front and one supervisor per node
    assert "G = 1: 9 processes (3 engines, 3 fronts, 3 supervisors)" in done.stdout
    assert "G = 2: 12 processes (6 engines, 3 fronts, 3 supervisors)" in done.stdout
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(figures["cpu_s_per_10s"]) == {"1", "2"}
    for g, by_kind in figures["cpu_s_per_10s_by_kind"].items():
        assert by_kind["other"] == 0 and by_kind["engines"] > 0, g     # idle engines still send heartbeats
        assert sum(by_kind.values()) == pytest.approx(figures["cpu_s_per_10s"][g], abs=0.002)
    assert "per_group_cpu_s_per_10s" in figures and "base_cpu_s_per_10s" in figures


def test_one_group_count_is_refused_since_the_cost_per_group_is_a_slope():
    done = subprocess.run([sys.executable, "bench/groups_idle.py", "--groups", "4"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--groups takes at least two counts" in done.stderr
