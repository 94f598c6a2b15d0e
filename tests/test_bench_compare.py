"""`python -m bench compare`: its report from synthetic figures, and one short
run against a real raftq cluster (the peers need Debian packages that CI does
not install; bench/peers/setup brings them for a real comparison)."""

import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from bench.compare import build_report, markdown

ROOT = Path(__file__).resolve().parents[1]


def runs(rate, p50=None, p99=None):
    figures = {"msgs_per_s": rate, "server_cpu_us_per_msg": 50.0, "client_cpu_us_per_msg": 10.0}
    if p50 is not None:
        figures.update(p50_ms=p50, p99_ms=p99)
    return [figures]


def raw(w1_p50, w2, w3, w4):
    return {"w1": runs(500, w1_p50, 3 * w1_p50), "w2": runs(w2), "w3": runs(w3),
            "w4": [{"median_s": w4, "lost": 0, "rounds_s": [w4]}], "w5": runs(None, 2.0, 9.0)}


class System:
    def __init__(self, name):
        self.name, self.label = name, name


def test_ratios_are_raftq_over_each_peer_from_the_same_run():
    report = build_report({"raftq": raw(1.0, 30_000, 40_000, 0.2), "rabbitmq": raw(2.0, 20_000, 35_000, 0.25),
                           "nats": raw(0.5, 10_000, 13_000, 6.0)},
                          {"rss_mib_max": 512.25, "rss_peak_mib": 1030.0, "restart_s": 7.5, "stored": 1_000_000,
                           "snapshot_settled": True},
                          Namespace(reps=2, seconds=5.0, backlog=100_000))
    assert report["w1_p50_vs_rabbitmq"] == 0.5
    assert report["w2_vs_rabbitmq"] == 1.5
    assert report["w2_vs_nats"] == 3.0
    assert report["w3_vs_rabbitmq"] == round(40_000 / 35_000, 3)
    assert report["w3_vs_nats"] == round(40_000 / 13_000, 3)
    assert report["w4_median_vs_rabbitmq"] == 0.8
    assert report["rss_1m_mib"] == 512.2 and report["restart_1m_s"] == 7.5
    assert report["rss_1m_snapshot_peak_mib"] == 1030.0
    assert report["acked_lost"] == {"raftq": 0, "rabbitmq": 0, "nats": 0}
    table = markdown(report, [System("raftq"), System("rabbitmq"), System("nats")])
    assert "| W2 pipelined single messages: msgs/s | 30,000 | 20,000 | 10,000 | 1.50 | 3.00 |" in table
    assert "does not fsync each message" in table


@pytest.mark.integration
def test_a_short_compare_of_raftq_alone_ends_with_its_figures(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bench", "compare", "--systems", "raftq", "--reps", "1", "--seconds", "0.5",
         "--backlog", "500", "--failovers", "1", "--stored", "2000", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    raftq = figures["systems"]["raftq"]
    assert raftq["w3"]["msgs_per_s"] > 0 and raftq["w2"]["msgs_per_s"] > 0
    assert raftq["w4"]["lost"] == 0 and len(raftq["w4"]["rounds_s"]) == 1
    assert figures["stored_for_rss"] == 2000 and figures["rss_1m_snapshot_peak_mib"] >= figures["rss_1m_mib"] > 0
    [out] = tmp_path.iterdir()
    assert {p.name for p in out.iterdir()} >= {"report.json", "report.md"}
