"""bench/backlog_bench.py (issue 25's proof): what it refuses, how its target
lines are read, and its row in `bench compare`, prefixed `backlog_`. A tiny
run end to end on real clusters is part of the short real compare
(tests/test_bench_compare.py), which must end with every figure the issue
names.

Every target line must say of its figure what the figure says against the
target (`target_lines`), and the targets a run of any size is held to must
be met: the disk's. The others are stated for 10 M stored messages, where a
tiny run's figures are the processes' fixed costs spread over 2 000 (memory
and snapshot bytes per message), or are timings, which a benchmark reports
and a test does not judge."""

import re
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

from bench.compare import build_report

ROOT = Path(__file__).resolve().parents[1]
# What issue 25 asks the last line to hold, at least.
ISSUE_KEYS = ("rss_growth_b_per_msg", "rss_peak_vs_rest", "snapshot_b_per_msg", "restart_s",
              "consume_at_depth_vs_shallow", "disk_vs_live_bytes", "rss_growth_10k_bodies_b_per_msg")
HELD_AT_ANY_SIZE = ("disk_vs_live_bytes",)
TARGET_LINE = re.compile(r"target (\S+) +(\S+) +(.+?) +(met|not met)")


def target_lines(stdout: str, figures: dict, targets) -> dict:
    """Each target line's verdict, checked against its figure: the line names the figure the last
    line holds, the bench's own target, and says "met" exactly when the figures meet it."""
    verdicts = {}
    for line in stdout.splitlines():
        if not line.startswith("target "):
            continue
        key, figure, target, verdict = TARGET_LINE.fullmatch(line).groups()
        stated, met = next((stated, met) for name, stated, met in targets if name == key)
        assert figure == str(figures[key]) and target == stated, line
        assert verdict == ("met" if met(figures) else "not met") and figures["targets_met"][key] == met(figures), line
        verdicts[key] = verdict == "met"
    return verdicts


def test_a_backlog_too_small_to_consume_at_depth_is_refused():
    done = subprocess.run([sys.executable, "bench/backlog_bench.py", "--messages", "1999"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--messages must be at least 2000" in done.stderr


def test_a_dedup_window_under_a_second_is_refused():
    done = subprocess.run([sys.executable, "bench/backlog_bench.py", "--window-s", "0.5"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--window-s: seconds, at least 1" in done.stderr


def test_a_churn_body_outside_a_messages_sizes_is_refused():
    for size in ("0", "1048577", "big"):
        done = subprocess.run([sys.executable, "bench/backlog_bench.py", "--churn-bytes", size],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "--churn-bytes: bytes, from 1 to 1048576" in done.stderr, size


def test_compare_keeps_its_figures_and_adds_the_backlogs_prefixed():
    args = Namespace(reps=1, seconds=1.0, backlog=1000, w5_rate=500.0, scale=[1], groups=[1])
    about = {"machine": {"cores": 2, "cpu_count": 2, "load_avg_1m": 0.5},
             "described": {"raftq": {"label": "raftq", "durability": "majority fsynced"}}}
    raw = {"raftq": {"w2": [{"msgs_per_s": 30_000.0}]}}
    without = build_report(raw, {}, args, about)
    backlog = {"messages": 2000, "rss_growth_b_per_msg": 650.0, "machine": about["machine"],
               "targets_met": {"rss_growth_b_per_msg": False}}
    report = build_report(raw, {}, args, about, backlog)
    assert {k: v for k, v in report.items() if not k.startswith("backlog_")} == without
    assert report["backlog_messages"] == 2000 and report["backlog_rss_growth_b_per_msg"] == 650.0
    assert "backlog_machine" not in report
