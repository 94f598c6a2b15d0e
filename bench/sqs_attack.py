"""What an attacker could make a node do at the SQS door (issue 49), this tree beside another
revision, in one run.

    .venv/bin/python -m bench.sqs_attack [--baseline REV] [--connections 250] [--long-polls 100]

Both revisions run as 3-node clusters with the same SQS keys, on this machine at the same
time, the baseline from a detached git worktree. Against each, in turn:

- body flood: `--connections` connections without credentials, each declaring and sending
  4 MiB - 1 byte of body but the last, and stalling: the resident memory of the leader's
  fronts before, while they stall and once they closed (MiB), and the tracebacks its log
  gained;
- form parse: one signed query-protocol call of 1.39 M empty fields (4 MiB): seconds to its
  answer, and the slowest `GET /health/live` of the same node meanwhile;
- forwarding: `--long-polls` ReceiveMessage long polls (20 s) through one follower, each from
  its own loopback address, then a SendMessage of another client through the same follower:
  seconds to its answer (the baseline's waited for a connection of a pool of 100).

Ratios are this tree's figure over the baseline's. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raftq.engine.config import Sqs, SqsKey  # noqa: E402
from raftq.local import LocalCluster  # noqa: E402

# The last commit before issue 49's security fixes.
DEFAULT_BASELINE = "4d6e7f1"
KEY = SqsKey("AKIABENCHATTACK00001", "bench-attack-secret-0123456789", "admin")
ACCOUNT = "123456789012"
BODY = (4 << 20) - 1


def log(message: str) -> None:
    print(message, flush=True)


def signed(url: str, body: bytes, headers: dict) -> dict:
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    request = AWSRequest(method="POST", url=url, data=body, headers=headers)
    SigV4Auth(Credentials(KEY.access_key, KEY.secret_key), "sqs", "us-east-1").add_auth(request)
    return dict(request.headers.items())


def fronts_rss_mib(cluster: LocalCluster, node_id: str) -> float:
    """The resident memory of the node's front processes (its supervisor's children named raftq-front)."""
    total = 0
    for task in Path("/proc").iterdir():
        if not task.name.isdigit():
            continue
        try:
            stat = (task / "stat").read_text()
            if int(stat.rpartition(")")[2].split()[1]) != cluster.pid(node_id) or "raftq-front" not in stat:
                continue
            rss = next(line for line in (task / "status").read_text().splitlines() if line.startswith("VmRSS"))
        except (OSError, StopIteration, ValueError):
            continue
        total += int(rss.split()[1])
    return round(total / 1024, 1)


def request_head(url: str, headers: dict, length: int) -> bytes:
    parts = urlsplit(url)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k.lower() not in ("host", "content-length"))
    return (f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\n{head}Content-Length: {length}\r\n"
            "\r\n").encode()


async def body_flood(cluster: LocalCluster, node_id: str, connections: int) -> dict:
    url = cluster.url(node_id)
    parts = urlsplit(url)
    tracebacks = cluster.log_path(node_id).read_text().count("Traceback")
    before = fronts_rss_mib(cluster, node_id)
    head = request_head(url + "/", {"Content-Type": "application/x-amz-json-1.0",
                                    "X-Amz-Target": "AmazonSQS.ListQueues"}, BODY)
    block = b"x" * 65536
    writers = []

    async def one():
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        writers.append(writer)
        writer.write(head)
        sent = 0
        try:
            while sent < BODY - 1:          # all of it but the last byte
                writer.write(block[:min(len(block), BODY - 1 - sent)])
                sent += len(block)
                await asyncio.wait_for(writer.drain(), 30)
        except (asyncio.TimeoutError, ConnectionError):
            pass
    await asyncio.gather(*(one() for _ in range(connections)))
    await asyncio.sleep(3)
    during = fronts_rss_mib(cluster, node_id)
    for writer in writers:
        writer.close()
    await asyncio.sleep(10)          # what the front does with the bodies it was reading, and logs
    after = fronts_rss_mib(cluster, node_id)
    return {"flood_rss_before_mib": before, "flood_rss_during_mib": during, "flood_rss_after_mib": after,
            "flood_tracebacks": cluster.log_path(node_id).read_text().count("Traceback") - tracebacks}


async def form_parse(cluster: LocalCluster, node_id: str) -> dict:
    url = cluster.url(node_id)
    body = b"Action=ListQueues" + b"&a=" * 1_390_000
    headers = signed(url + "/", body, {"Content-Type": "application/x-www-form-urlencoded"})
    parts = urlsplit(url)
    slowest = 0.0
    done = asyncio.Event()

    async def probe():
        nonlocal slowest
        while not done.is_set():
            started = time.monotonic()
            reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
            writer.write(f"GET /health/live HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n".encode())
            await reader.read()
            writer.close()
            slowest = max(slowest, time.monotonic() - started)
            await asyncio.sleep(0.05)
    prober = asyncio.create_task(probe())
    await asyncio.sleep(0.3)
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(request_head(url + "/", headers, len(body)) + body)
    await reader.readline()
    answered = time.monotonic() - started
    writer.close()
    done.set()
    await prober
    return {"form_answer_s": round(answered, 3), "form_slowest_live_s": round(slowest, 3)}


async def forwarding(cluster: LocalCluster, long_polls: int) -> dict:
    import boto3
    leader = cluster.wait_for_leader(30)
    follower = cluster.url(next(n for n in cluster.ids if n != leader))
    sqs = boto3.client("sqs", endpoint_url=follower, region_name="us-east-1", aws_access_key_id=KEY.access_key,
                       aws_secret_access_key=KEY.secret_key)
    polled = sqs.create_queue(QueueName="attack-polled")["QueueUrl"]
    other = sqs.create_queue(QueueName="attack-other")["QueueUrl"]
    parts = urlsplit(follower)
    raw = json.dumps({"QueueUrl": polled, "WaitTimeSeconds": 20}).encode()
    headers = signed(follower + "/", raw, {"Content-Type": "application/x-amz-json-1.0",
                                           "X-Amz-Target": "AmazonSQS.ReceiveMessage"})
    polls = []
    for i in range(long_polls):
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port,
                                                       local_addr=(f"127.0.{3 + i // 200}.{10 + i % 200}", 0))
        writer.write(request_head(follower + "/", headers, len(raw)) + raw)
        polls.append(writer)
    await asyncio.sleep(2)
    started = time.monotonic()
    await asyncio.to_thread(sqs.send_message, QueueUrl=other, MessageBody="meanwhile")
    answered = time.monotonic() - started
    for writer in polls:
        writer.close()
    return {"forwarded_send_s": round(answered, 3)}


async def run(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="raftq-sqs-attack-") as tmp:
        tmp = Path(tmp)
        tree = tmp / "baseline-tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), args.baseline],
                       check=True, capture_output=True)
        os.chdir(tmp)            # `python -m raftq` puts the working directory first on sys.path
        clusters: dict[str, LocalCluster] = {}
        figures: dict = {"baseline": args.baseline, "connections": args.connections, "long_polls": args.long_polls}
        try:
            for name, code in (("baseline", tree), ("current", ROOT)):
                cluster = LocalCluster.create(tmp / name, 3, env={**os.environ, "PYTHONPATH": str(code)})
                cluster.cfg = dataclasses.replace(cluster.cfg, sqs=Sqs(ACCOUNT, (KEY,)))
                cluster.write_config()
                cluster.start()
                clusters[name] = cluster
            for name, cluster in clusters.items():
                if cluster.wait_for_leader(60) is None or not cluster.wait_all_ready(60):
                    raise SystemExit(f"{name} did not come up; see {cluster.root}")
            for name, cluster in clusters.items():
                leader = cluster.wait_for_leader(30)
                measured = {**await body_flood(cluster, leader, args.connections),
                            **await form_parse(cluster, leader),
                            **await forwarding(cluster, args.long_polls)}
                log(f"{name:<8} " + "  ".join(f"{k} {v}" for k, v in measured.items()))
                figures.update({f"{name}_{k}": v for k, v in measured.items()})
        finally:
            for cluster in clusters.values():
                cluster.close()
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
    for key in ("flood_rss_during_mib", "flood_rss_after_mib", "form_answer_s", "form_slowest_live_s",
                "forwarded_send_s"):
        base = figures[f"baseline_{key}"]
        figures[f"{key}_ratio"] = round(figures[f"current_{key}"] / base, 3) if base else None
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="the git revision to compare against")
    parser.add_argument("--connections", type=int, default=250)
    parser.add_argument("--long-polls", type=int, default=100)
    figures = asyncio.run(run(parser.parse_args()))
    for key in sorted(k for k in figures if k.endswith("_ratio")):
        log(f"{key[:-6]:<24} current/baseline {figures[key]}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
