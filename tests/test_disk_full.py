"""A full disk (issue 47, finding 2): every write answered 2xx is kept, on every replica.

Each node's data directory is a small filesystem of its own, filled by writers
putting large batches until they are refused; then the filesystems grow, every
node is killed -9 and started again, and everything answered 2xx -- puts, acks,
an admin delete -- must be there. Replicas with equal disks fill up together, so
a write counted whole when only part of it reached the disk (a short write at
ENOSPC) is torn on every replica alike, and the restart's scan cuts it, and
everything after it, everywhere.
"""

import threading
import time

import pytest

from raftq.client import RaftqError
from raftq.local import LocalCluster
from tests.conftest import STARTED_CLUSTERS
from tests.tools import SmallFilesystem
from tests.waiting import wait_until
from tests.wire import register

pytestmark = pytest.mark.integration

DISK_MIB = 64
GROWN_MIB = 512
BODY_BYTES = 200_000
BATCH = 8
WRITERS = 3


class Writer(threading.Thread):
    """Puts batches of large messages, each with an id, until one is refused."""

    def __init__(self, cluster, name: str):
        super().__init__(daemon=True)
        self.cluster, self.name = cluster, name
        self.acked: set[str] = set()
        self.refusal: str | None = None

    def run(self):
        with self.cluster.client(retry_for=0, timeout=30) as client:
            for batch in range(10_000):
                ids = [f"{self.name}-{batch}-{n}" for n in range(BATCH)]
                try:
                    client.put_batch("jobs", [{"id": i, "body": i + ":" + "x" * BODY_BYTES} for i in ids])
                except (OSError, RaftqError) as exc:
                    self.refusal = str(exc)
                    return
                self.acked.update(ids)


def stored_ids(client, queue: str) -> list[str]:
    """The ids of every message `queue` holds that no group acked, from the bodies' prefixes."""
    ids, seq = [], 0
    while True:
        page = client.browse(queue, from_seq=seq, limit=20)
        if not page["messages"]:
            return ids
        ids += [m["body"].partition(":")[0] for m in page["messages"]]
        seq = page["messages"][-1]["seq"] + 1


def test_a_full_disk_loses_no_write_answered_2xx(tmp_path):
    # the disk alarm off: the disks fill up for real (a 64 MiB disk is below its default watermark)
    cluster = LocalCluster.create(tmp_path / "c", 3, node_args=("--disk-free-limit", "0"))
    register(cluster)
    STARTED_CLUSTERS.add(cluster)
    disks = []
    try:
        disks = [SmallFilesystem(cluster.root / nid, DISK_MIB) for nid in cluster.ids]
        cluster.start()
        assert cluster.wait_for_leader(60) and cluster.wait_all_ready(60)
        with cluster.client(retry_for=30, timeout=30) as client:
            client.put_batch("leased", [{"body": f"m{n}"} for n in range(5)])
            receipts = [m["receipt"] for m in client.receive("leased", max=5, lease_ms=600_000)["messages"]]
            assert len(receipts) == 5
            client.put("doomed", "to be deleted")

        writers = [Writer(cluster, f"w{n}") for n in range(WRITERS)]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join(timeout=300)
            assert not writer.is_alive(), "a writer was never refused: the disk did not fill up"
        acked = set().union(*(writer.acked for writer in writers))
        assert len(acked) * BODY_BYTES > DISK_MIB * 2**20 / 2, "the disks filled before half of them was written"

        # While the disks are full: an ack and an admin delete, each answered 2xx or refused.
        with cluster.client(retry_for=0, timeout=30) as client:
            try:
                acked_receipts = client.ack("leased", receipts)["acked"] == len(receipts)
            except (OSError, RaftqError):
                acked_receipts = False
            try:
                client.delete_queue("doomed")
                deleted = True
            except (OSError, RaftqError):
                deleted = False

        for disk in disks:
            disk.grow(GROWN_MIB)
        # Writes resume once there is room again (a follower takes the entries it could not write).
        with cluster.client(retry_for=30, timeout=30) as client:
            after = [f"after-{n}" for n in range(BATCH)]
            client.put_batch("jobs", [{"id": i, "body": i + ":" + "x" * BODY_BYTES} for i in after])
            acked.update(after)

        for nid in cluster.ids:
            cluster.kill(nid)
        cluster.start()
        assert cluster.wait_for_leader(60) and cluster.wait_all_ready(60)
        with cluster.client(retry_for=30, timeout=60) as client:
            stored = stored_ids(client, "jobs")
            missing = acked - set(stored)
            assert not missing, f"{len(missing)} of {len(acked)} acknowledged messages lost: {sorted(missing)[:16]}"
            assert len(stored) == len(set(stored)), "a message stored twice"
            stats = client.queue("leased")["stats"]
            if acked_receipts:
                assert stats["depth"] + stats["in_flight"] == 0, stats
            if deleted:
                with pytest.raises(RaftqError) as gone:
                    client.queue("doomed")
                assert gone.value.status == 404
        # every replica agrees
        wait_until(lambda: cluster.client(retry_for=30).verify()["agree"], 60, "the replicas to agree")
    finally:
        cluster.close()
        for disk in disks:
            disk.unmount()
