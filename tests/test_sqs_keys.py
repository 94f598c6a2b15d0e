"""SQS keys without hand-editing (issue 49): `raftq sqs key add|list|remove` and `raftq up --sqs`
make keys of AWS's shape that the cluster keeps, sealed, in group 0's log; each takes effect on
every node without a restart, and its secret is printed where it is asked for and stored
nowhere else."""

import os
import re
import signal
import stat

import pytest
from botocore.exceptions import ClientError

from tests.sqsutil import start_sqs_cluster, sqs_client
from tests.test_cli import Lines, raftq, secrets_of, start_up, stop_everything
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_sqs_cluster(tmp_path_factory.mktemp("sqs-keys"), groups=2)
    yield cluster
    cluster.close()


def exported(text: str) -> dict:
    return dict(re.findall(r"^export (AWS_[A-Z_]+)=(\S+)$", text, re.M))


def client_of(env: dict, url: str, **config):
    from raftq.engine.config import SqsKey
    return sqs_client(url, SqsKey(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], "?"), attempts=1, **config)


def refused_everywhere(cluster, env: dict) -> bool:
    for url in cluster.urls:
        try:
            client_of(env, url).list_queues()
            return False
        except ClientError as exc:
            assert exc.response["Error"]["Code"] == "InvalidClientTokenId", exc.response
    return True


def test_a_key_made_by_the_cli_works_on_every_node_at_once_and_is_stored_nowhere_in_the_clear(cluster):
    admin = exported(raftq("sqs", "key", "add", "--role", "admin", "--cluster-dir", str(cluster.root)).stdout)
    data = exported(raftq("sqs", "key", "add", "--role", "data", "--cluster-dir", str(cluster.root)).stdout)
    for env in (admin, data):
        assert re.fullmatch(r"AKIA[A-Z2-7]{16}", env["AWS_ACCESS_KEY_ID"]), env
        assert re.fullmatch(r"[A-Za-z0-9+/]{40}", env["AWS_SECRET_ACCESS_KEY"]), env
        assert env["AWS_ENDPOINT_URL_SQS"] in cluster.urls and env["AWS_DEFAULT_REGION"]
    queue = client_of(admin, cluster.urls[0]).create_queue(QueueName="made-by-a-kept-key")["QueueUrl"]
    for url in cluster.urls:      # no node was restarted
        client_of(data, url).send_message(QueueUrl=queue, MessageBody=url)
    with pytest.raises(ClientError) as denied:
        client_of(data, cluster.urls[1]).create_queue(QueueName="not-for-a-data-key")
    assert denied.value.response["Error"]["Code"] == "AccessDenied"
    listed = raftq("sqs", "key", "list", "--cluster-dir", str(cluster.root)).stdout
    for env, role in ((admin, "admin"), (data, "data")):
        assert re.search(rf"^{env['AWS_ACCESS_KEY_ID']}\s+{role}\s+cluster$", listed, re.M), listed
    assert re.search(r"^AKIATESTDATA00000001\s+data\s+cluster\.toml$", listed, re.M), listed
    # the secrets are in what the CLI printed, and in no file of the cluster: logs, journal, snapshots
    for env in (admin, data):
        secret = env["AWS_SECRET_ACCESS_KEY"].encode()
        holding = [path for path in cluster.root.rglob("*") if path.is_file() and secret in path.read_bytes()]
        assert holding == [], holding
        assert secret.decode() not in listed
    raftq("sqs", "key", "remove", data["AWS_ACCESS_KEY_ID"], "--cluster-dir", str(cluster.root))
    wait_until(lambda: refused_everywhere(cluster, data), 10, "every node to refuse the removed key")
    assert client_of(admin, cluster.urls[2]).list_queues()["QueueUrls"]
    gone = raftq("sqs", "key", "remove", data["AWS_ACCESS_KEY_ID"], "--cluster-dir", str(cluster.root), check=False)
    assert gone.returncode == 1 and "not_found" in gone.stderr
    kept_in_file = raftq("sqs", "key", "remove", "AKIATESTDATA00000001", "--cluster-dir", str(cluster.root),
                         check=False)
    assert kept_in_file.returncode == 1 and "cluster.toml" in kept_in_file.stderr


def test_up_with_sqs_makes_an_admin_and_a_data_key_and_says_where_sqs_is(tmp_path):
    data_dir = tmp_path / "up"
    proc, output = start_up(data_dir, "--sqs")
    try:
        assert "cluster up" in output, output
        files = {role: data_dir / f"sqs-{role}.env" for role in ("admin", "data")}
        assert re.search(r"sqs: +on at http://127\.0\.0\.1:\d+ \(any node\)", output), output
        for path in files.values():
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and str(path) in output
        admin, data = (exported(files[role].read_text()) for role in ("admin", "data"))
        # `. sqs-admin.env && aws sqs create-queue ...`, as the banner says, then the data key
        queue = client_of(admin, admin["AWS_ENDPOINT_URL_SQS"]).create_queue(QueueName="jobs")["QueueUrl"]
        client_of(data, data["AWS_ENDPOINT_URL_SQS"]).send_message(QueueUrl=queue, MessageBody="hi")
        # its output goes to files (make up > up.log): no secret in it
        printed = Lines(proc, output)
        leaked = [s for s in [*secrets_of(data_dir), admin["AWS_SECRET_ACCESS_KEY"], data["AWS_SECRET_ACCESS_KEY"]]
                  if s and s in printed.text]
        assert leaked == [], printed.text
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        # a second `raftq up --sqs` keeps the keys it made
        proc, output = start_up(data_dir, "--sqs")
        assert "cluster up" in output, output
        assert exported(files["data"].read_text()) == data
        client_of(data, data["AWS_ENDPOINT_URL_SQS"]).send_message(QueueUrl=queue, MessageBody="again")
    finally:
        stop_everything(proc, data_dir)

