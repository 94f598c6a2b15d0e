"""Spark through a principal's token (issue 52: Spark is a door): a principal that may read
orders-* and write totals-* reads orders-eu and writes totals-eu exactly once through the
connector; a read or a write of a queue it has no rule for fails the job with the node's 403,
which names the action and the queue, asked once (a denial is final: no node is asked again)
and writing nothing; a revoked principal's next job fails on its token.
One Spark session (local[2]) and one 3-node cluster for the module.
"""

import pytest

from tests.sparkutil import name, options, require_spark, start_session
from tests.waiting import wait_until
from tests.wire import call

pytestmark = [pytest.mark.spark, pytest.mark.integration]

# What the connector needs (docs/spark.md, "Principals"): browse to read (receive too for a
# streaming read's group), producers and put to write.
RULES = [{"actions": ["receive", "browse"], "queues": ["orders-*"]},
         {"actions": ["producers", "put"], "queues": ["totals-*"]}]


@pytest.fixture(scope="module")
def spark():
    require_spark()
    session = start_session("local[2]", "raftq-principal-tests")
    yield session
    session.stop()


def admin(cluster) -> dict:
    return {"Authorization": f"Bearer {cluster.cfg.tokens.admin}"}


def make(cluster, principal: str) -> str:
    """A new principal with RULES; its token, once every node takes it."""
    made = call("POST", cluster.urls[0] + "/v1/principals", {"name": principal, "rules": RULES},
                headers=admin(cluster), follow=True)
    assert made.status == 201, made
    token = made.body["token"]
    for url in cluster.urls:
        wait_until(lambda: call("GET", url + "/v1/whoami", headers={"Authorization": f"Bearer {token}"}).status
                   == 200, 10, f"{url} to take principal {principal}")
    return token


def as_principal(cluster, queue: str, token: str, **extra) -> dict:
    return {**options(cluster, queue, **extra), "token": token}


def denials(cluster, principal: str, action: str) -> float:
    """Refusals of `action` to `principal`, counted over every node."""
    line = f'raftq_auth_denied_total{{action="{action}",principal="{principal}"}} '
    return sum(float(row.rsplit(" ", 1)[1]) for url in cluster.urls
               for row in call("GET", url + "/metrics", headers=admin(cluster)).raw.decode().splitlines()
               if row.startswith(line))


def stored(cluster, queue: str) -> list | None:
    """The queue's messages as the admin browses them; None when it does not exist."""
    page = call("GET", f"{cluster.urls[0]}/v1/queues/{queue}/messages?limit=10000", headers=admin(cluster),
                follow=True)
    return None if page.status == 404 else [m["body"] for m in page.body["messages"]]


def refusal(failure, action: str, queue: str) -> None:
    text = str(failure.value)
    assert f"403 forbidden: principal 'etl' may not {action} on queue '{queue}'" in text, text


def test_a_principal_reads_and_writes_its_queues_and_is_refused_the_others(spark, cluster3):
    orders, totals, billing = name("orders"), name("totals"), name("billing")
    boss = admin(cluster3)
    for queue in (orders, billing):
        assert call("POST", f"{cluster3.urls[0]}/v1/queues/{queue}/messages",
                    {"messages": [{"body": {"n": n}} for n in range(50)]}, headers=boss, follow=True).status == 201
    token = make(cluster3, "etl")
    # several partitions, so that pages are asked of every replica with the principal's token
    read = spark.read.format("raftq").options(**as_principal(cluster3, orders, token, partitionSize=20)).load()
    assert sorted(r.seq for r in read.collect()) == list(range(1, 51))
    read.selectExpr("body_json AS body").repartition(3).write.format("raftq").options(
        **as_principal(cluster3, totals, token)).mode("append").save()
    assert sorted(stored(cluster3, totals)) == sorted(f'{{"n":{n}}}' for n in range(50))

    before = {action: denials(cluster3, "etl", action) for action in ("browse", "producers")}
    with pytest.raises(Exception) as denied_read:
        spark.read.format("raftq").options(**as_principal(cluster3, billing, token)).load().count()
    refusal(denied_read, "browse", billing)
    frame = spark.createDataFrame([(f"row {n}",) for n in range(10)], "body string")
    with pytest.raises(Exception) as denied_write:
        frame.write.format("raftq").options(**as_principal(cluster3, billing, token)).mode("append").save()
    refusal(denied_write, "producers", billing)
    # Each asked once, of one node: a denial is not tried again elsewhere.
    assert {action: denials(cluster3, "etl", action) - before[action] for action in before} == \
        {"browse": 1, "producers": 1}
    assert len(stored(cluster3, billing)) == 50
    # the one producer is the write to totals, committed; the refused write staged nothing
    producers = call("GET", cluster3.urls[0] + "/v1/producers", headers=boss, follow=True).body["producers"]
    assert [(p["committed_batch"], p["stages"]) for p in producers] == [(0, 0)], producers


def test_a_page_the_principal_may_not_browse_is_refused_once_not_asked_of_every_replica(cluster3):
    """A partition's pages go to replicas first and move on from one that fails: a denial
    (rules changed, or the token revoked, after the job was planned) must end the task."""
    require_spark()
    from raftq.client import RaftqError
    from raftq.spark.options import read_options
    from raftq.spark.ranges import read_range, split

    queue = name("billing")
    call("POST", f"{cluster3.urls[0]}/v1/queues/{queue}/messages", {"messages": [{"body": 1}]},
         headers=admin(cluster3), follow=True)
    token = make(cluster3, "etl-pages")
    (partition,) = split(read_options(as_principal(cluster3, queue, token), streaming=False), 1, 2, 1)
    before = denials(cluster3, "etl-pages", "browse")
    with pytest.raises(RaftqError, match=f"403 forbidden: principal 'etl-pages' may not browse on queue '{queue}'"):
        list(read_range(partition))
    assert denials(cluster3, "etl-pages", "browse") - before == 1


def test_without_auto_create_a_writer_without_browse_is_checked_as_far_as_it_may_see(fresh_cluster):
    """The sink's check at .save(): on a node that makes no queue on a put it also asks whether
    the queue exists, which a writer without browse may not see; that is no reason to refuse it
    (its first stage then meets the 404 of a missing queue), a missing queue is one for the admin."""
    require_spark()
    from raftq.spark.options import OptionError, write_options
    from raftq.spark.source import _check_writable

    cluster = fresh_cluster(1, node_args=("--no-auto-create",))
    token = make(cluster, "etl-strict")

    def check(queue: str, token: str) -> None:
        _check_writable(write_options({**options(cluster, queue), "token": token}, streaming=False), "p")
    call("PUT", cluster.urls[0] + "/v1/queues/totals-eu", {}, headers=admin(cluster))
    check("totals-eu", token)
    check("totals-missing", token)
    with pytest.raises(OptionError, match="queue 'totals-missing' does not exist and the cluster does not create"):
        check("totals-missing", cluster.cfg.tokens.admin)


def test_a_revoked_principals_next_job_fails_on_its_token(spark, cluster3):
    orders = name("orders")
    call("POST", f"{cluster3.urls[0]}/v1/queues/{orders}/messages", {"messages": [{"body": 1}]},
         headers=admin(cluster3), follow=True)
    token = make(cluster3, "etl-revoked")
    planned = spark.read.format("raftq").options(**as_principal(cluster3, orders, token)).load()
    assert call("DELETE", cluster3.urls[0] + "/v1/principals/etl-revoked", headers=admin(cluster3),
                follow=True).status == 204
    for url in cluster3.urls:
        wait_until(lambda: call("GET", url + "/v1/whoami", headers={"Authorization": f"Bearer {token}"}).status
                   == 401, 10, f"{url} to refuse the revoked token")
    with pytest.raises(Exception, match="option token: the cluster refused it"):
        spark.read.format("raftq").options(**as_principal(cluster3, orders, token)).load()
    # a DataFrame loaded while the token was good: its job is planned now, and refused
    with pytest.raises(Exception, match="401 unauthorized"):
        planned.count()
    with pytest.raises(Exception, match="option token: the cluster refused it"):
        spark.createDataFrame([("x",)], "body string").write.format("raftq").options(
            **as_principal(cluster3, name("totals"), token)).mode("append").save()
