"""What a user's mistakes earn: a one-line error with the right status, never a traceback,
and nothing changed (issue 27, items 3 and 5)."""

import asyncio
import json
import os
import subprocess
import sys

import pytest

from raftq.client import AsyncClient, RaftqError
from tests.wire import call

pytestmark = pytest.mark.integration

NAME_RULE = "queue name must match"
# Names a URL cannot carry as they are: a space, a path separator, dot segments, a query.
UNSENDABLE_NAMES = ["my jobs", "a/b", ".", "..", "x?y", "tab\there"]


def cli(cluster, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAFTQ_URL": ",".join(cluster.urls), "RAFTQ_TOKEN": cluster.token}
    return subprocess.run([sys.executable, "-m", "raftq", *args], capture_output=True, text=True, env=env,
                          timeout=60)


def queue_names(cluster) -> set[str]:
    with cluster.client() as client:
        return {q["name"] for q in client.queues()["queues"]}


@pytest.mark.parametrize("name", UNSENDABLE_NAMES)
def test_a_name_the_server_refuses_is_a_one_line_cli_error(cluster3, name):
    done = cli(cluster3, "put", name, '{"x": 1}')
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"raftq: bad_request: {NAME_RULE} [A-Za-z0-9_][A-Za-z0-9._-]{{0,127}}"]
    assert "Traceback" not in done.stderr


def test_clients_quote_names_so_the_server_rule_answers(cluster3):
    before = queue_names(cluster3)
    with cluster3.client() as client:
        for name in UNSENDABLE_NAMES:
            with pytest.raises(RaftqError) as refused:
                client.put(name, {"x": 1})
            assert (refused.value.status, refused.value.code) == (400, "bad_request")
            assert NAME_RULE in refused.value.message
        # a dot inside a name is legal and must arrive as a dot
        assert client.put("dotted.name", 1)["messages"][0]["seq"] == 1
        assert client.browse("dotted.name")["messages"][0]["body"] == 1

    async def async_refusals():
        async with AsyncClient(cluster3.urls, token=cluster3.token) as client:
            codes = []
            for name in UNSENDABLE_NAMES:
                try:
                    await client.put(name, {"x": 1})
                except RaftqError as exc:
                    codes.append((exc.status, exc.code, NAME_RULE in exc.message))
            return codes

    assert asyncio.run(async_refusals()) == [(400, "bad_request", True)] * len(UNSENDABLE_NAMES)
    assert queue_names(cluster3) - before == {"dotted.name"}


def leader_url(cluster) -> str:
    return cluster.url(cluster.wait_for_leader(30))


def leased(cluster, queue: str) -> dict:
    with cluster.client() as client:
        client.put(queue, {"n": 1})
        return client.receive(queue, lease_ms=60_000)["messages"][0]


MALFORMED_RECEIPTS = ["garbage", "default:999:999", "1:default:1", "1:bad group:1:1", "1:default:1:x"]


@pytest.mark.parametrize("op", ["ack", "nack", "extend"])
def test_a_receipt_raftq_never_issued_is_400_invalid_receipt_and_changes_nothing(cluster3, op):
    queue = f"invalid-receipt-{op}"
    message = leased(cluster3, queue)
    url = leader_url(cluster3)
    for receipt in MALFORMED_RECEIPTS:
        bad = call("POST", f"{url}/v1/queues/{queue}/{op}", {"receipts": [message["receipt"], receipt]})
        assert (bad.status, bad.body["error"]) == (400, "invalid_receipt"), (receipt, bad)
        assert bad.body["invalid"] == [receipt]
    stats = call("GET", f"{url}/v1/queues/{queue}").body["stats"]
    assert (stats["in_flight"], stats["acked_total"]) == (1, 0)       # the good receipt was not used either
    done = call("POST", f"{url}/v1/queues/{queue}/{op}", {"receipts": [message["receipt"]]})
    assert done.status == 200
    # a lease that ended is still what it was: 409 stale_receipt
    if op != "extend":
        stale = call("POST", f"{url}/v1/queues/{queue}/{op}", {"receipts": [message["receipt"]]})
        assert (stale.status, stale.body["error"]) == (409, "stale_receipt")


def test_a_transaction_with_a_receipt_raftq_never_issued_is_400_and_changes_nothing(cluster3):
    message = leased(cluster3, "invalid-receipt-tx")
    url = leader_url(cluster3)
    bad = call("POST", f"{url}/v1/tx", {"ack": [{"queue": "invalid-receipt-tx",
                                                  "receipts": [message["receipt"], "nope"]}],
                                         "put": [{"queue": "invalid-receipt-tx-out", "messages": [{"body": 1}]}]})
    assert (bad.status, bad.body["error"], bad.body["invalid"]) == (400, "invalid_receipt", ["nope"])
    assert call("GET", f"{url}/v1/queues/invalid-receipt-tx").body["stats"]["in_flight"] == 1
    assert call("GET", f"{url}/v1/queues/invalid-receipt-tx-out").status == 404


def test_the_cli_says_invalid_receipt_in_one_line(cluster3):
    leased(cluster3, "invalid-receipt-cli")
    done = cli(cluster3, "ack", "invalid-receipt-cli", "not-a-receipt")
    assert done.returncode == 1 and done.stderr.startswith("raftq: invalid_receipt: ")
    assert len(done.stderr.strip().splitlines()) == 1
    shown = json.loads(cli(cluster3, "queue", "show", "invalid-receipt-cli", "--json").stdout)
    assert shown["stats"]["in_flight"] == 1
