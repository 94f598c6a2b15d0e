"""bench/live_bytes_bench.py (issue 47's figure): a small run end to end on a real cluster, its
figures held to their targets. 200 entries of 256 KiB each keep one 100-byte message live;
128 MiB of puts that store nothing then carry every node's log through compactions: the
journal keeps their bodies, not their entries, and the disk stays within its bound."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.live_bytes_bench import TARGETS
from raftq.engine.relocation import SLACK_BYTES
from tests.test_backlog_bench import target_lines

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_a_small_run_meets_every_target_and_reads_every_body_back():
    done = subprocess.run([sys.executable, "bench/live_bytes_bench.py", "--entries", "200", "--churn-mib", "128"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["code_path"] == str(ROOT)
    assert figures["entries"] == 200 and figures["entries_mib"] == 50.0
    assert figures["bodies_intact"] is True
    assert figures["relocated_bodies"] >= 200 - SLACK_BYTES // (256 * 1024)    # (the slack's need no moving)
    verdicts = target_lines(done.stdout, figures, TARGETS)
    assert verdicts == {"disk_vs_live_bytes": True, "kept_vs_live_bytes": True}, done.stdout[-3000:]


def test_an_entry_larger_than_a_message_is_refused():
    done = subprocess.run([sys.executable, "bench/live_bytes_bench.py", "--entry-bytes", "1048577"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--entry-bytes is at most 1048576" in done.stderr
