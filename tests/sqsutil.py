"""A local cluster that speaks the SQS API, and boto3 clients for it."""

import dataclasses
import hashlib
import struct

import boto3
from botocore.config import Config

from raftq.engine.config import Sqs, SqsKey

ACCOUNT = "123456789012"
REGION = "us-east-1"
ADMIN = SqsKey("AKIATESTADMIN0000001", "admin-secret-for-tests-0123456789", "admin")
DATA = SqsKey("AKIATESTDATA00000001", "data-secret-for-tests-0123456789", "data")


def start_sqs_cluster(root, nodes: int = 3, keys=(ADMIN, DATA), **options):
    """A local cluster with these SQS keys; `options`: LocalCluster.create's (groups=4)."""
    from raftq.local import LocalCluster
    from tests.wire import register

    cluster = LocalCluster.create(root, nodes, **options)
    cluster.cfg = dataclasses.replace(cluster.cfg, sqs=Sqs(account=ACCOUNT, keys=tuple(keys)))
    cluster.write_config()
    register(cluster)
    try:
        cluster.start()
        if cluster.wait_for_leader(60) is None or not cluster.wait_all_ready(60):
            raise RuntimeError("the cluster did not come up")
    except BaseException:
        cluster.close()
        raise
    return cluster


def sqs_client(url: str, key: SqsKey = ADMIN, *, secret: str | None = None, attempts: int = 3, **config):
    """boto3's SQS client at one node, as an application would make it."""
    return boto3.session.Session().client(
        "sqs", endpoint_url=url, region_name=REGION, aws_access_key_id=key.access_key,
        aws_secret_access_key=secret or key.secret_key,
        config=Config(retries={"mode": "standard", "max_attempts": attempts}, read_timeout=40, **config))


def follower(cluster) -> str:
    leader = cluster.wait_for_leader(30)
    return next(nid for nid in cluster.ids if nid != leader)


def signed(url: str, body: bytes, headers: dict, key: SqsKey = ADMIN, *, method: str = "POST",
           secret: str | None = None, service: str = "sqs") -> dict:
    """`headers` with botocore's SigV4 signature of the request added."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest(method=method, url=url, data=body, headers=headers)
    SigV4Auth(Credentials(key.access_key, secret or key.secret_key), service, REGION).add_auth(request)
    return dict(request.headers.items())


JSON_TYPE = "application/x-amz-json-1.0"


def json_headers(action: str) -> dict:
    return {"Content-Type": JSON_TYPE, "X-Amz-Target": f"AmazonSQS.{action}"}


def md5_of_attributes(attributes: dict) -> str:
    """MD5OfMessageAttributes by AWS's documented encoding, written here apart
    from the node's: attributes by name, each its length-prefixed UTF-8 name
    and data type, a transport byte (1 string or number, 2 binary) and its
    length-prefixed value. `attributes`: name -> (data type, str or bytes)."""
    out = b""
    for name in sorted(attributes):
        data_type, value = attributes[name]
        out += struct.pack(">I", len(name.encode())) + name.encode()
        out += struct.pack(">I", len(data_type.encode())) + data_type.encode()
        raw, transport = (value, 2) if isinstance(value, bytes) else (value.encode(), 1)
        out += bytes([transport]) + struct.pack(">I", len(raw)) + raw
    return hashlib.md5(out).hexdigest()
