"""engine/relocation.py on a one-node group run in this process on 127.0.0.1 (as
tests/test_engine_answers.py runs one): which entries a compaction's plan copies live bodies
out of, and what the journal keeps once the next compaction follows."""

import asyncio
import time

from raftq.engine.config import ClusterConfig, NodeSpec
from raftq.engine.node import Node
from raftq.local import free_ports
from raftq.engine.relocation import TAKE_S
from tests.test_engine_answers import leading

BIG = 64 * 1024


async def until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "gave up waiting"
        await asyncio.sleep(0.05)


def test_a_compaction_plans_copies_out_of_mostly_dead_entries_only_and_the_next_one_drops_them(tmp_path):
    raft, http = free_ports(2)
    cluster = ClusterConfig(nodes=(NodeSpec(id="n1", raft=f"127.0.0.1:{raft}", http=f"127.0.0.1:{http}"),),
                            secret="test-cluster-secret")

    async def submitted(node, op: str, **fields) -> tuple[dict, int]:
        committed = await node.submit({"op": op, **fields})
        assert "error" not in committed.result, committed.result
        return committed.result, committed.index

    async def scenario():
        node = Node(cluster, "n1", tmp_path)
        await node.start()
        try:
            await leading(node)
            # an entry left with one small message live, its large one acked
            _, mostly_dead = await submitted(node, "put", queue="q",
                                             messages=[{"body": "keep me"}, {"body": "b" * BIG}])
            taken, _ = await submitted(node, "receive", queue="q", group="default", max=2, lease_ms=3_600_000)
            await submitted(node, "ack", queue="q", receipts=[taken["messages"][1]["receipt"]])
            # an entry all of whose bodies stay, and one of empty bodies (moving them would cost more than it takes)
            _, all_live = await submitted(node, "put", queue="q", messages=[{"body": "l" * 4_000}] * 4)
            _, empty = await submitted(node, "put", queue="q", messages=[{"body": ""}] * 1_000)
            node.relocator.allow(True)
            node.relocator.slack_bytes = 0        # (a few KiB stored: plan whatever is kept)
            assert await node.consensus.force_snapshot()
            assert node.machine.live_entry_indexes() == [mostly_dead, all_live, empty]
            assert node.consensus.status()["log_kept_bytes"] > BIG, "the entry of the put is kept, whole"

            await until(lambda: node.relocator.bodies == 1)
            [moved_to] = sorted(set(node.machine.live_entry_indexes()) - {all_live, empty})
            assert moved_to > empty
            stored = node.read("browse", "q", "default", 0, 2_000)["messages"]
            assert [m["body"] for m in stored] == ["keep me"] + ["l" * 4_000] * 4 + [""] * 1_000
            assert node.relocator.commands == 1 and node.relocator.bytes == len("keep me")

            # the next compaction drops the old entry, and plans nothing more
            assert await node.consensus.force_snapshot()
            assert node.consensus.stored_bytes(mostly_dead) is None, "the entry of the put is gone"
            assert node.consensus.status()["log_kept_bytes"] < BIG
            await asyncio.sleep(2 * TAKE_S)
            assert node.relocator.commands == 1
            return [m["body"] for m in node.read("browse", "q", "default", 0, 1)["messages"]]
        finally:
            await node.close()

    assert asyncio.run(scenario()) == ["keep me"]
