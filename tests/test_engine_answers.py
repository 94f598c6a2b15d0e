"""engine.node.Node, run in this process as a one-node group on 127.0.0.1:
what the answer to a proposer carries.

The state machine keeps a stored body as a reference into the log entry that
carried it (statemachine/bodies.py); the engine reads the bytes back where a
result is answered.
"""

import asyncio
import time

from raftq.engine.committer import GroupCommitter
from raftq.engine.config import ClusterConfig, NodeSpec
from raftq.engine.node import REPAIR_WAIT_S, Node
from raftq.engine.outcome import CommitError
from raftq.local import free_ports
from raftq.statemachine.bodies import BodyRef


async def leading(node: Node, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not node.is_leader():
        assert time.monotonic() < deadline, "the one-node group elected no leader"
        await asyncio.sleep(0.02)
    await node.settled()


def test_a_receive_answered_by_a_proposer_deposed_as_it_applied_carries_the_bodies(tmp_path, monkeypatch):
    """A leader paused and then resumed (a long GC, a VM stall, chaos's `pause`) can step down
    in the tick that applies entries of its own term, and pysyncobj still answers their
    proposer. The chaos suite caught a receive answered then with a body reference in place
    of the body (seed 3834275823): bodies were read only by a node that still led as it
    applied. The race is stood in for here by the one thing it changes, the role the node
    reports while it applies."""
    raft, http = free_ports(2)
    cluster = ClusterConfig(nodes=(NodeSpec(id="n1", raft=f"127.0.0.1:{raft}", http=f"127.0.0.1:{http}"),),
                            secret="test-cluster-secret")

    async def scenario():
        node = Node(cluster, "n1", tmp_path)
        await node.start()
        try:
            await leading(node)
            await node.submit({"op": "put", "queue": "q", "messages": [{"body": b"the body"}]})
            with monkeypatch.context() as deposed:
                deposed.setattr(node.consensus, "is_leader", lambda: False)
                return (await node.submit({"op": "receive", "queue": "q", "group": "default", "max": 1})).result
        finally:
            await node.close()

    received = asyncio.run(scenario())
    [message] = received["messages"]
    assert not isinstance(message["body"], BodyRef)
    assert message["body"] == b"the body"


def test_commands_whose_answer_raises_are_answered_and_free_their_slot_in_flight(tmp_path, monkeypatch):
    """Issue 47: a receive whose bodies could not be read (its answer raised in the tick that
    applied it) was never answered, and its entry's slot in flight in group commit never came
    back: after four, nothing was proposed again. Each is answered with the error now (500-class:
    an error of another kind than damage is this node's bug), and the slot is free."""
    raft, http = free_ports(2)
    cluster = ClusterConfig(nodes=(NodeSpec(id="n1", raft=f"127.0.0.1:{raft}", http=f"127.0.0.1:{http}"),),
                            secret="test-cluster-secret")
    slots = GroupCommitter(lambda *_: None).max_in_flight

    async def scenario():
        node = Node(cluster, "n1", tmp_path)
        await node.start()
        try:
            await leading(node)
            await node.submit({"op": "put", "queue": "q", "messages": [{"body": b"m%d" % n} for n in range(9)]})
            answers = []
            with monkeypatch.context() as broken:
                def unreadable(index):
                    raise RuntimeError("a read of the log that raises")
                broken.setattr(node.consensus, "entry_at", unreadable)
                for _ in range(slots + 1):
                    try:
                        await asyncio.wait_for(node.submit({"op": "receive", "queue": "q", "group": "default",
                                                            "max": 1}), 10)
                    except CommitError as exc:
                        answers.append(exc.code)
            received = await asyncio.wait_for(node.submit({"op": "receive", "queue": "q", "group": "default",
                                                           "max": 10}), 10)
            return answers, [m["body"] for m in received.result["messages"]]
        finally:
            await node.close()

    answers, bodies = asyncio.run(scenario())
    assert answers == ["internal"] * (slots + 1)
    assert bodies == [b"m%d" % n for n in range(slots + 1, 9)]


def test_a_receive_whose_body_no_replica_holds_intact_is_answered_damaged_and_the_log_goes_on(tmp_path):
    """A one-node group has no other copy to repair a damaged body from: the receive is answered
    `damaged` (a 503 at the door) once REPAIR_WAIT_S has passed, never served wrong bytes, and the
    node goes on taking writes."""
    raft, http = free_ports(2)
    cluster = ClusterConfig(nodes=(NodeSpec(id="n1", raft=f"127.0.0.1:{raft}", http=f"127.0.0.1:{http}"),),
                            secret="test-cluster-secret")

    async def scenario():
        node = Node(cluster, "n1", tmp_path)
        await node.start()
        try:
            await leading(node)
            await node.submit({"op": "put", "queue": "q", "messages": [{"body": "lorem ipsum"}]})
            journal = node.consensus._journal
            journal._recent.clear()            # as if later entries had pushed it out of memory
            (segment,) = sorted((tmp_path / "raft" / "journal").glob("seg-*.log"))
            data = segment.read_bytes()
            at = data.index(b"lorem ipsum") + 1
            with open(segment, "r+b") as f:
                f.seek(at)
                f.write(bytes([data[at] ^ 0x01]))
            started = time.monotonic()
            try:
                await node.submit({"op": "receive", "queue": "q", "group": "default", "max": 1})
                answer = "served"
            except CommitError as exc:
                answer = exc.code
            waited = time.monotonic() - started
            await node.submit({"op": "put", "queue": "q", "messages": [{"body": "after"}]})
            return answer, waited, node.consensus.damage_counts()
        finally:
            await node.close()

    answer, waited, counts = asyncio.run(scenario())
    assert answer == "damaged" and waited >= REPAIR_WAIT_S
    assert counts == (1, 0)
