"""The streaming wire (GET /v1/stream), through Producer/Consumer and raw frames,
against real node processes."""

import asyncio

import aiohttp
import cbor2
import pytest

from raftq.client import BlockingConsumer, Client, Consumer, Producer, RaftqError
from tests.conftest import clusters_of_one_and_four_groups

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=[1, 4], ids=["G1", "G4"])
def cluster3(request, tmp_path_factory):
    """The contract holds for a cluster of one Raft group and of four (issue 24)."""
    yield from clusters_of_one_and_four_groups(request, tmp_path_factory)


def run(coro):
    return asyncio.run(coro)


def leader_and_follower(cluster) -> tuple[str, str]:
    leader = cluster.wait_for_leader(30)
    follower = next(n for n in cluster.ids if n != leader)
    return cluster.url(leader), cluster.url(follower)


async def raw_session(url: str, token: str | None):
    session = aiohttp.ClientSession()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    ws = await session.ws_connect(url + "/v1/stream", headers=headers)
    hello = cbor2.loads((await ws.receive(timeout=10)).data)
    return session, ws, hello


async def next_frame(ws) -> dict:
    msg = await ws.receive(timeout=10)
    assert msg.type == aiohttp.WSMsgType.BINARY, msg
    return cbor2.loads(msg.data)


def test_publish_confirms_each_message_with_the_http_semantics(cluster3):
    async def scenario():
        async with Producer(cluster3.urls, token=cluster3.token, linger_ms=2) as producer:
            sent = [await producer.send("st-pub", {"n": i}) for i in range(500)]
            first = await asyncio.gather(*sent)
            again = await (await producer.send("st-pub", "dup", id="fixed-id"))
            repeat = await (await producer.send("st-pub", "dup", id="fixed-id"))
            v1 = await (await producer.send("st-pub", "v1", key="k"))
            v2 = await (await producer.send("st-pub", "v2", key="k"))
            raw = await (await producer.send("st-pub", b"\x00\xffbytes", headers={"h": "1"}))
        return first, again, repeat, v1, v2, raw
    first, again, repeat, v1, v2, raw = run(scenario())
    seqs = [r["seq"] for r in first]
    assert seqs == list(range(seqs[0], seqs[0] + 500))
    assert {r["duplicate"] for r in first} == {False} and {r["durability"] for r in first} == {"quorum"}
    assert repeat == {**again, "duplicate": True}
    assert v2["replaced_seq"] == v1["seq"]
    with Client(cluster3.urls, token=cluster3.token) as client:
        stored = client.browse("st-pub", limit=1000)["messages"]
    assert len(stored) == 500 + 1 + 1 + 1     # v1 was replaced by v2
    assert stored[-1]["body"] == b"\x00\xffbytes" and stored[-1]["headers"] == {"h": "1"}
    assert stored[-1]["seq"] == raw["seq"]


def test_a_refused_message_fails_alone(cluster3):
    async def scenario():
        async with Producer(cluster3.urls, token=cluster3.token, linger_ms=50) as producer:
            good = await producer.send("st-refuse", "ok")
            bad = await producer.send("st-refuse", "x", ttl_ms=-5)
            also_good = await producer.send("st-refuse", "ok too")
            return await asyncio.gather(good, bad, also_good, return_exceptions=True)
    good, bad, also_good = run(scenario())
    assert isinstance(bad, RaftqError) and bad.status == 400 and bad.code == "bad_request"
    assert also_good["seq"] == good["seq"] + 1


def test_consumer_credit_acks_and_nacks(cluster3):
    with Client(cluster3.urls, token=cluster3.token) as client:
        client.put_batch("st-credit", [{"body": i} for i in range(10)])

    async def scenario():
        async with Consumer(cluster3.urls, "st-credit", prefetch=3, token=cluster3.token) as consumer:
            first = [await consumer.receive(timeout=5) for _ in range(3)]
            assert await consumer.receive(timeout=0.5) is None      # no credit left
            first[0].ack()
            first[1].nack()
            await consumer.flush()
            more = [await consumer.receive(timeout=5) for _ in range(2)]
            return first, more
    first, more = run(scenario())
    assert [m.body for m in first] == [0, 1, 2]
    # the nacked message is ready again and keeps its seq, so it comes first
    assert [(m.body, m.deliveries) for m in more] == [(1, 2), (3, 1)]
    with Client(cluster3.urls, token=cluster3.token) as client:
        stats = client.queue("st-credit")["stats"]
    assert stats["acked_total"] == 1


def test_returned_credit_is_spent_in_batches_while_messages_are_out(cluster3):
    with Client(cluster3.urls, token=cluster3.token) as client:
        client.put_batch("st-credit-batch", [{"body": i} for i in range(20)])

    async def scenario():
        # prefetch 8: credit goes out in batches of 2 while any message is unsettled
        async with Consumer(cluster3.urls, "st-credit-batch", prefetch=8, token=cluster3.token) as consumer:
            first = [await consumer.receive(timeout=5) for _ in range(8)]
            first[0].ack()
            await consumer.flush()
            held_back = await consumer.receive(timeout=0.5)
            first[1].ack()
            await consumer.flush()
            pair = [await consumer.receive(timeout=5) for _ in range(2)]
            return first, held_back, pair
    first, held_back, pair = run(scenario())
    assert [m.body for m in first] == list(range(8))
    assert held_back is None              # one credit back, seven still out
    assert [m.body for m in pair] == [8, 9]


def test_blocking_consumer_iterates_and_acks(cluster3):
    with Client(cluster3.urls, token=cluster3.token) as client:
        client.put_batch("st-blocking", [{"body": i} for i in range(50)])
        with BlockingConsumer(cluster3.urls, "st-blocking", prefetch=20, token=cluster3.token) as consumer:
            seen = []
            for message in consumer:
                seen.append(message.body)
                message.ack()
                if len(seen) == 50:
                    break
            consumer.flush()
        assert seen == list(range(50))
        assert client.queue("st-blocking")["stats"]["depth"] == 0


def test_a_follower_names_the_leader_and_clients_follow(cluster3):
    leader_url, follower_url = leader_and_follower(cluster3)

    async def scenario():
        session, ws, hello = await raw_session(follower_url, cluster3.token)
        closed = await ws.receive(timeout=5)
        await session.close()
        async with Producer([follower_url], token=cluster3.token) as producer:
            confirm = await (await producer.send("st-follow", "via a follower"))
        return hello, closed, confirm
    hello, closed, confirm = run(scenario())
    assert hello["leader"] is False and hello["leader_url"] == leader_url
    assert closed.type == aiohttp.WSMsgType.CLOSE and closed.data == 4307
    assert confirm["seq"] >= 1


def test_bad_frames_get_clear_errors(cluster3):
    leader_url, _ = leader_and_follower(cluster3)

    async def scenario():
        session, ws, hello = await raw_session(leader_url, cluster3.token)
        try:
            await ws.send_bytes(cbor2.dumps([1, 2]))
            not_a_map = await next_frame(ws)
            await ws.send_bytes(cbor2.dumps({"op": "publish", "queue": "st-bad", "messages": [{"body": 1}]}))
            no_cid = await next_frame(ws)
            await ws.send_bytes(cbor2.dumps({"op": "publish", "queue": "../x",
                                             "messages": [{"cid": 7, "body": 1}]}))
            bad_queue = await next_frame(ws)
            await ws.send_bytes(cbor2.dumps({"op": "subscribe", "sub": 1, "queue": "st-missing"}))
            missing = await next_frame(ws)
            await ws.send_bytes(cbor2.dumps({"op": "ack", "rid": 3, "queue": "st-bad", "receipts": ["nope"]}))
            unknown_receipt = await next_frame(ws)
            await ws.send_bytes(b"\xff\xff not cbor")
            garbage = await next_frame(ws)
            closed = await ws.receive(timeout=5)
        finally:
            await session.close()
        return hello, not_a_map, no_cid, bad_queue, missing, unknown_receipt, garbage, closed
    hello, not_a_map, no_cid, bad_queue, missing, unknown_receipt, garbage, closed = run(scenario())
    assert hello["leader"] is True and hello["version"] == 1
    assert not_a_map["op"] == "error" and not_a_map["error"] == "bad_request"
    assert no_cid == {"op": "error", "error": "bad_request", "status": 400,
                      "message": "messages must be a non-empty list of maps, each with an integer cid"}
    assert bad_queue["op"] == "confirm" and bad_queue["results"] == []
    assert [(r["cid"], r["error"]) for r in bad_queue["refused"]] == [(7, "bad_request")]
    assert (missing["op"], missing["sub"], missing["error"], missing["status"]) == ("error", 1, "not_found", 404)
    assert unknown_receipt["op"] in ("settled", "error") and unknown_receipt["rid"] == 3
    assert garbage["op"] == "error" and garbage["error"] == "bad_request"
    assert closed.type == aiohttp.WSMsgType.CLOSE and closed.data == 4400


def test_a_consumer_of_a_missing_queue_is_told_so(cluster3):
    async def scenario():
        async with Consumer(cluster3.urls, "st-nothing-here", token=cluster3.token) as consumer:
            with pytest.raises(RaftqError) as refused:
                await consumer.receive(timeout=5)
            return refused.value
    refused = run(scenario())
    assert refused.status == 404 and refused.code == "not_found"


def test_a_failover_mid_stream_stores_every_message_once(fresh_cluster):
    cluster = fresh_cluster(3)
    total = 3000

    async def scenario():
        async with Producer(cluster.urls, token=cluster.token, window=200, retry_for=30) as producer:
            futures = []
            for i in range(total):
                futures.append(await producer.send("st-failover", i, id=f"m-{i}"))
                if i == total // 3:
                    cluster.kill(cluster.wait_for_leader(30))
            return await asyncio.gather(*futures)
    confirms = run(scenario())
    assert len(confirms) == total
    with Client(cluster.urls, token=cluster.token, retry_for=30) as client:
        stats = client.queue("st-failover")["stats"]
        stored = client.browse("st-failover", limit=10_000)["messages"]
    assert stats["depth"] == total
    assert sorted(m["body"] for m in stored) == list(range(total))
    assert len({c["seq"] for c in confirms}) == total
