"""`raftq sqs key add|list|remove`: the SQS API's keys, kept by the cluster (docs/sqs.md).

`add` prints the key as the shell lines an AWS SDK or the AWS CLI reads it from, to be
evaluated where it is used (``eval "$(raftq sqs key add --role data)"``): the secret is in
that output and nowhere else, so it goes to no log unless the output is sent to one. It
returns once every node of the cluster takes the key.
"""

import time

from ..client import Client
from .connect import emit, table, target

# Any region will do: the nodes check the signature for the region a client signs with
REGION = "us-east-1"
EVERY_NODE_TAKES_IT_S = 10.0


def export_lines(key: dict, endpoint: str) -> str:
    """The shell lines that hand `key` and the endpoint to the AWS SDKs and CLI."""
    return "\n".join([f"export AWS_ACCESS_KEY_ID={key['access_key']}",
                      f"export AWS_SECRET_ACCESS_KEY={key['secret_key']}",
                      f"export AWS_ENDPOINT_URL_SQS={endpoint}",
                      f"export AWS_DEFAULT_REGION={REGION}"])


def add_key(client: Client, role: str, urls: list[str], token: str | None, cafile: str | None) -> dict:
    """A new key of `role`, once each node of `urls` lists it (its replica of group 0 applied it)."""
    key = client.add_sqs_key(role)
    deadline = time.monotonic() + EVERY_NODE_TAKES_IT_S
    for url in urls:
        with Client([url], token=token, cafile=cafile, retry_for=EVERY_NODE_TAKES_IT_S) as node:
            while key["access_key"] not in {k["access_key"] for k in node.sqs_keys(consistency="any")["keys"]}:
                if time.monotonic() > deadline:
                    raise SystemExit(f"raftq: SQS key {key['access_key']} was made, but {url} has not taken it "
                                     f"within {EVERY_NODE_TAKES_IT_S:g} s; see `raftq cluster status`")
                time.sleep(0.05)
    return key


def cmd_sqs_key(args) -> int:
    where = target(args)
    with where.client() as client:
        if args.action == "add":
            key = add_key(client, args.role, where.urls, where.token, where.cafile)
            emit(args, {**key, "endpoint": where.urls[0]}, export_lines(key, where.urls[0]))
        elif args.action == "list":
            view = client.sqs_keys()
            rows = [(k["access_key"], k["role"] or f"principal {k['principal']}'s rules", k["kept_by"])
                    for k in view["keys"]]
            emit(args, view, table(("access key", "role", "kept by"), rows) if rows else
                 "(no SQS keys: every SQS call is refused; raftq sqs key add --role admin makes one)")
        else:
            emit(args, client.remove_sqs_key(args.access_key), f"removed SQS key {args.access_key}")
    return 0


def add_parsers(sub, common) -> None:
    sqs = sub.add_parser("sqs", help="the SQS API's keys")
    things = sqs.add_subparsers(dest="thing", required=True)
    key = things.add_parser("key", help="make, list and remove SQS keys, kept by the cluster")
    actions = key.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", parents=[common], help="make a key and print the shell lines that hand it "
                                                           "to the AWS SDKs and CLI")
    add.add_argument("--role", choices=("admin", "data"), required=True,
                     help="data: send, receive, delete; admin: also create, configure and delete queues")
    actions.add_parser("list", parents=[common], help="every key's id, role and where it is kept")
    remove = actions.add_parser("remove", parents=[common], help="remove a key the cluster keeps")
    remove.add_argument("access_key")
    key.set_defaults(run=cmd_sqs_key)
