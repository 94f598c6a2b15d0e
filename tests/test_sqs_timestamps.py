"""SQS's timestamps are wall time, also after every node was down (docs/guarantees.md, "Log time").

Log time pauses while no node leads, so a message's log time lags the wall
clock by every outage of the whole cluster; SQS shows the wall time of it
(statemachine/wall.py), as AWS shows its own clock's.
"""

import time

import pytest

from tests.sqsutil import sqs_client, start_sqs_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
OUTAGE_S = 5.0
CLOSE_MS = 1_000     # AWS's clocks and ours: within a second


def test_sent_created_and_first_received_times_keep_to_the_wall_clock_after_every_node_was_down(tmp_path):
    cluster = start_sqs_cluster(tmp_path / "stamps")
    try:
        sqs = sqs_client(cluster.url(cluster.wait_for_leader(30)))
        asked = time.time()
        url = sqs.create_queue(QueueName="stamps")["QueueUrl"]
        created_s = int(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["CreatedTimestamp"])[
            "Attributes"]["CreatedTimestamp"])
        assert asked - CLOSE_MS / 1000 <= created_s <= time.time()     # whole seconds, as AWS's
        sent = {"before": time.time() * 1000}
        sqs.send_message(QueueUrl=url, MessageBody="before")
        for nid in cluster.ids:
            cluster.kill(nid)
        time.sleep(OUTAGE_S)    # log time stands still; the wall clock does not
        # all but one back: a majority serves, and no node can find that every node runs this
        # release (api/features.py), so the stamps rest on the wall time recorded before
        for nid in cluster.ids[:-1]:
            cluster.start(nid)
        assert cluster.wait_for_leader(60) is not None
        sqs = sqs_client(cluster.url(cluster.wait_for_leader(30)), attempts=10)
        sent["after"] = time.time() * 1000
        sqs.send_message(QueueUrl=url, MessageBody="after")
        received_at = time.time() * 1000
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=2,
                                  MessageSystemAttributeNames=["All"])["Messages"]
        answered = time.time() * 1000
        stamps = {m["Body"]: m["Attributes"] for m in got}
        assert set(stamps) == {"before", "after"}
        for body, at in sent.items():
            shown = int(stamps[body]["SentTimestamp"])
            assert at - CLOSE_MS <= shown <= at + CLOSE_MS, (body, shown - at)
            first = int(stamps[body]["ApproximateFirstReceiveTimestamp"])
            assert received_at - CLOSE_MS <= first <= answered + CLOSE_MS, (body, first - received_at)
        assert int(stamps["after"]["SentTimestamp"]) >= created_s * 1000
    finally:
        cluster.close()
