"""kill -9 of the leader while boto3 sends and receives through a follower,
with boto3's own retries: every message whose SendMessage succeeded is
received (an SQS standard queue may deliver one twice; none is lost), and a
FIFO queue's groups keep their order."""

import threading
import time

import pytest
from botocore.exceptions import ClientError, ConnectionError as BotoConnectionError

from tests.sqsutil import sqs_client, start_sqs_cluster

pytestmark = pytest.mark.timeout(400)
MESSAGES = 150


@pytest.mark.parametrize("fifo", [False, True], ids=["standard", "fifo"])
def test_kill_9_of_the_leader_loses_no_acknowledged_message(tmp_path, fifo):
    cluster = start_sqs_cluster(tmp_path)
    try:
        leader = cluster.wait_for_leader(30)
        survivor = next(nid for nid in cluster.ids if nid != leader)
        sqs = sqs_client(cluster.url(survivor), attempts=10)
        attributes = {"VisibilityTimeout": "3", **({"FifoQueue": "true"} if fifo else {})}
        url = sqs.create_queue(QueueName="failover.fifo" if fifo else "failover", Attributes=attributes)["QueueUrl"]
        acknowledged, received, failed_sends = set(), set(), []
        order: dict[str, list] = {}     # group -> the message numbers as received
        sending_done = threading.Event()

        def send():
            for i in range(MESSAGES):
                # a FIFO send retried across the failover is stored once: its deduplication id
                extra = {"MessageGroupId": f"g{i % 3}", "MessageDeduplicationId": f"m{i}"} if fifo else {}
                try:
                    sqs.send_message(QueueUrl=url, MessageBody=f"m{i}", **extra)
                    acknowledged.add(f"m{i}")
                except (ClientError, BotoConnectionError) as exc:   # its fate unknown: not counted
                    failed_sends.append((i, repr(exc)))
            sending_done.set()

        def consume(client, until: float):
            while time.monotonic() < until:
                try:
                    got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
                    for message in got.get("Messages", []):
                        received.add(message["Body"])
                        number = int(message["Body"][1:])
                        order.setdefault(f"g{number % 3}", []).append(number)
                        client.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
                except (ClientError, BotoConnectionError):
                    pass    # a delete lost in the failover: the message comes back, which is allowed
                if sending_done.is_set() and acknowledged <= received:
                    return

        sender = threading.Thread(target=send)
        consumer = threading.Thread(target=consume, args=(sqs_client(cluster.url(survivor), attempts=10),
                                                          time.monotonic() + 240))
        sender.start()
        consumer.start()
        while len(acknowledged) < MESSAGES // 3 and sender.is_alive():
            time.sleep(0.05)
        cluster.kill(leader)
        sender.join(240)
        consumer.join(240)
        assert not sender.is_alive() and not consumer.is_alive()
        assert cluster.wait_for_leader(30, among=[n for n in cluster.ids if n != leader]) is not None
        assert len(acknowledged) >= MESSAGES - 5, failed_sends   # boto3's retries rode out the failover
        assert acknowledged - received == set()
        if fifo:
            # each group in send order; a message whose delete was lost comes again before the next
            assert all(numbers == sorted(numbers) for numbers in order.values()), order
    finally:
        cluster.close()
