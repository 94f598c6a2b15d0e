"""The staged-write routes (/v1/producers/...) against a real 3-node cluster."""

import uuid

import pytest

from raftq.client import Client
from tests.wire import call

pytestmark = pytest.mark.integration


def auth(cluster) -> dict:
    return {"Authorization": f"Bearer {cluster.token}"} if cluster.token else {}


def leader_url(cluster) -> str:
    return cluster.url(cluster.wait_for_leader(30))


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def test_stage_then_commit_publishes_once_and_a_replay_answers_duplicate(cluster3):
    base, queue, producer = leader_url(cluster3), name("q"), name("p")
    staged = call("POST", f"{base}/v1/producers/{producer}/stage", headers=auth(cluster3),
                  body={"token": "t1", "chunk": 0, "queue": queue,
                        "messages": [{"body": {"n": 1}}, {"body_b64": "AAE=", "key": "k"}]})
    assert staged.status == 201 and staged.body == {"staged": 2, "chunks": 1}, staged
    staged = call("POST", f"{base}/v1/producers/{producer}/stage", headers=auth(cluster3), cbor=True,
                  body={"token": "t1", "chunk": 1, "queue": queue, "messages": [{"body": b"\xff"}]})
    assert staged.status == 201, staged
    assert call("GET", f"{base}/v1/queues/{queue}", headers=auth(cluster3)).status == 404   # nothing visible yet
    done = call("POST", f"{base}/v1/producers/{producer}/commit", headers=auth(cluster3),
                body={"batch": 3, "parts": [{"token": "t1", "chunks": 2}]})
    assert done.status == 200, done
    assert {k: done.body[k] for k in ("committed", "duplicate", "committed_batch", "put")} == {
        "committed": True, "duplicate": False, "committed_batch": 3, "put": 3}
    again = call("POST", f"{base}/v1/producers/{producer}/commit", headers=auth(cluster3),
                 body={"batch": 3, "parts": [{"token": "t1", "chunks": 2}]})
    assert again.status == 200 and again.body["duplicate"] is True, again
    page = call("GET", f"{base}/v1/queues/{queue}/messages?limit=10", headers=auth(cluster3), cbor=True).body
    assert [m["body"] for m in page["messages"]] == [{"n": 1}, b"\x00\x01", b"\xff"]
    info = call("GET", f"{base}/v1/producers/{producer}", headers=auth(cluster3)).body
    assert info == {"producer": producer, "committed_batch": 3, "expires_at": None, "staged_bytes": 0,
                    "stages": [], "auto_create": True}
    listed = call("GET", f"{base}/v1/producers", headers=auth(cluster3)).body["producers"]
    assert {"producer": producer, "committed_batch": 3, "stages": 0, "staged_bytes": 0,
            "staged_messages": 0, "raft_group": 0} in listed


def test_a_commit_of_a_missing_stage_is_a_conflict(cluster3):
    reply = call("POST", f"{leader_url(cluster3)}/v1/producers/{name('p')}/commit", headers=auth(cluster3),
                 body={"batch": 0, "parts": [{"token": "never", "chunks": 1}]})
    assert reply.status == 409 and reply.body["error"] == "conflict", reply


@pytest.mark.parametrize("path, body", [
    ("/v1/producers/bad%20name/stage", {"token": "t", "chunk": 0, "queue": "q", "messages": [{"body": 1}]}),
    ("/v1/producers/p/stage", {"token": "t", "chunk": 0, "queue": "q", "messages": [{"body": 1}], "extra": 1}),
    ("/v1/producers/p/stage", {"token": "t", "queue": "q", "messages": [{"body": 1}]}),
    ("/v1/producers/p/stage", {"token": "t", "chunk": 0, "queue": "q", "messages": []}),
    ("/v1/producers/p/commit", {"batch": "1", "parts": []}),
    ("/v1/producers/p/commit", [1]),
    ("/v1/producers/p/abort", {"tokens": [""]}),
])
def test_malformed_requests_are_bad_requests(cluster3, path, body):
    reply = call("POST", leader_url(cluster3) + path, body=body, headers=auth(cluster3))
    assert reply.status == 400 and reply.body["error"] == "bad_request", reply


def test_a_follower_redirects_staging_to_the_leader(cluster3):
    leader = cluster3.wait_for_leader(30)
    follower = next(n for n in cluster3.ids if n != leader)
    reply = call("POST", f"{cluster3.url(follower)}/v1/producers/p/stage", headers=auth(cluster3),
                 body={"token": "t", "chunk": 0, "queue": "q", "messages": [{"body": 1}]})
    assert reply.status == 307 and reply.headers["Location"].startswith(cluster3.url(leader)), reply


def test_the_client_stages_commits_aborts_and_deletes(cluster3):
    queue, producer = name("q"), name("p")
    with Client(cluster3.urls, token=cluster3.token, cbor=True) as client:
        client.stage(producer, "keep", 0, queue, [{"body": b"raw", "headers": {"h": "v"}}])
        client.stage(producer, "lose", 0, queue, [{"body": "never"}])
        assert client.abort_stages(producer, ["lose"]) == {"dropped": 1}
        assert client.commit_stages(producer, 0, [{"token": "keep", "chunks": 1}])["put"] == 1
        page = client.browse(queue, limit=10, consistency="any")
        assert [m["body"] for m in page["messages"]] in ([b"raw"], [])    # [] only if this replica lags
        assert page["applied_index"] >= 1
        assert [m["body"] for m in client.browse(queue, limit=10)["messages"]] == [b"raw"]
        assert client.delete_producer(producer) == {}
        assert client.producer(producer)["committed_batch"] is None
