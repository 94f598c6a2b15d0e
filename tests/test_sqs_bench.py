"""`raftq bench --wire sqs`: boto3 against a real 3-node cluster, run as a user runs it."""

import json
import os
import subprocess
import sys

import pytest

from raftq.client import Client
from raftq.local import LocalCluster
from tests.sqsutil import start_sqs_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def raftq(*args, timeout=120) -> subprocess.CompletedProcess:
    """The CLI with only what its arguments name: no RAFTQ_* from the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTQ_")}
    return subprocess.run([sys.executable, "-m", "raftq", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_sqs_cluster(tmp_path_factory.mktemp("sqs-bench"))
    yield cluster
    cluster.close()


def test_every_message_sent_over_sqs_is_received_and_deleted(cluster):
    done = raftq("bench", "--wire", "sqs", "--cluster-dir", str(cluster.root), "--count", "300",
                 "--producers", "2", "--consumers", "2", "--size", "64", "--batch", "50",
                 "--queue", "sqs-bench", "--keep")
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    # --batch 50 is cut to SQS's 10: 150 messages per producer in 15 SendMessageBatch calls
    assert (figures["wire"], figures["batch"], figures["put_samples"]) == ("sqs", 10, 30)
    assert (figures["count"], figures["consumed"], figures["errors"]) == (300, 300, [])
    assert figures["put_msgs_per_s"] > 0 and figures["consume_msgs_per_s"] > 0
    assert set(figures["end_to_end_latency"]) == {"p50_ms", "p90_ms", "p99_ms", "max_ms"}
    assert 0 <= figures["end_to_end_latency"]["p50_ms"] <= figures["end_to_end_latency"]["max_ms"]
    with Client(cluster.urls, token=cluster.token) as client:
        stats = client.queue("sqs-bench")["stats"]
    assert (stats["put_total"], stats["acked_total"], stats["depth"], stats["in_flight"]) == (300, 300, 0, 0)


def test_a_cluster_toml_without_sqs_keys_is_one_clear_line_and_creates_nothing(cluster, tmp_path):
    keyless = LocalCluster.create(tmp_path / "keyless", 3)      # its cluster.toml only: never started
    done = raftq("bench", "--wire", "sqs", "--cluster-dir", str(keyless.root), "--url", cluster.urls[0],
                 "--token", cluster.token, "--queue", "never-made", "--count", "10")
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"raftq bench --wire sqs: {keyless.config_path} has no [[sqs.keys]]: add one (access_key, secret_key, "
        'role = "data"; docs/sqs.md), restart the nodes, and run it again']
    with Client(cluster.urls, token=cluster.token) as client:
        assert "never-made" not in [q["name"] for q in client.queues()["queues"]]


def test_an_sqs_body_shorter_than_its_text_send_time_is_refused(cluster):
    done = raftq("bench", "--wire", "sqs", "--cluster-dir", str(cluster.root), "--size", "11", "--count", "1")
    assert done.returncode != 0
    assert done.stderr.strip() == "raftq bench: --size must be at least 12 bytes on the sqs wire (the send time)"
