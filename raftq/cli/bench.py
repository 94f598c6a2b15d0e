"""`raftq bench`: a quick load generator (like `nats bench`).

Producers put `--count` messages of `--size` bytes into a fresh queue while
consumers receive and ack them; it prints rates and latency percentiles, the
last line one JSON object of every figure.  A body starts with its send time,
so a consumer measures put-to-receive latency.  `--wire http` puts in batches
of `--batch` and receives by long poll (put latency is per call);
`--wire stream` publishes with confirms and consumes pushed messages over
GET /v1/stream (put latency is send-to-confirm per message); `--wire sqs`
speaks the SQS API with boto3, one client per thread: SendMessageBatch of
`--batch` (at most 10, SQS's limit), ReceiveMessage long polls of 10 and
DeleteMessageBatch, signed with a key of the local cluster.toml's [sqs]
(put latency is per call).
"""

import asyncio
import base64
import json
import math
import struct
import threading
import time
import uuid

from raftq.engine.config import SqsKey

from .connect import target

STAMP = struct.Struct("<d")
TEXT_STAMP_SIZE = len(base64.b64encode(bytes(STAMP.size)))
SQS_BATCH_MAX = 10
SQS_REGION = "us-east-1"        # any: the nodes check the signature for the region it names


def text_stamped(padding: str) -> str:
    """An SQS body, which must be text: the send time in base64, then the padding."""
    return base64.b64encode(STAMP.pack(time.time())).decode() + padding


def text_sent_at(body: str) -> float:
    return STAMP.unpack(base64.b64decode(body[:TEXT_STAMP_SIZE]))[0]


def percentiles(samples: list[float]) -> dict:
    """p50/p90/p99/max in milliseconds."""
    if not samples:
        return {}
    ordered = sorted(samples)
    at = lambda p: ordered[max(0, math.ceil(p * len(ordered)) - 1)]  # noqa: E731
    return {"p50_ms": round(at(0.50) * 1000, 2), "p90_ms": round(at(0.90) * 1000, 2),
            "p99_ms": round(at(0.99) * 1000, 2), "max_ms": round(ordered[-1] * 1000, 2)}


class Run:
    def __init__(self, args, where, queue: str, sqs_endpoint: str | None = None):
        self.args, self.where, self.queue = args, where, queue
        self.sqs_endpoint = sqs_endpoint
        self.lock = threading.Lock()
        self.put_latencies: list[float] = []
        self.end_to_end: list[float] = []
        self.consumed = 0
        self.errors: list[str] = []
        self.deadline = time.monotonic() + args.timeout

    def produce(self, count: int) -> None:
        padding = b"\0" * max(0, self.args.size - STAMP.size)
        try:
            with self.where.client() as client:
                while count > 0 and time.monotonic() < self.deadline:
                    batch = min(self.args.batch, count)
                    started = time.perf_counter()
                    client.put_batch(self.queue, [STAMP.pack(time.time()) + padding for _ in range(batch)])
                    elapsed = time.perf_counter() - started
                    with self.lock:
                        self.put_latencies.append(elapsed)
                    count -= batch
        except Exception as exc:   # reported, not raised: the other workers finish the run
            self.errors.append(f"producer: {exc}")

    def consume(self) -> None:
        try:
            with self.where.client() as client:
                while time.monotonic() < self.deadline:
                    with self.lock:
                        if self.consumed >= self.args.count:
                            return
                    got = client.receive(self.queue, max=min(1000, self.args.batch * 10), wait_ms=500)["messages"]
                    now = time.time()
                    if not got:
                        continue
                    client.ack(self.queue, [m["receipt"] for m in got])
                    with self.lock:
                        self.end_to_end.extend(now - STAMP.unpack_from(m["body"])[0] for m in got)
                        self.consumed += len(got)
        except Exception as exc:
            self.errors.append(f"consumer: {exc}")

    async def produce_stream(self, count: int) -> None:
        from ..client import Producer
        padding = b"\0" * max(0, self.args.size - STAMP.size)
        try:
            async with Producer(self.where.urls, token=self.where.token, cafile=self.where.cafile) as producer:
                confirms = []
                for _ in range(count):
                    if time.monotonic() > self.deadline:
                        break
                    started = time.perf_counter()
                    confirm = await producer.send(self.queue, STAMP.pack(time.time()) + padding)
                    confirm.add_done_callback(
                        lambda _, started=started: self.put_latencies.append(time.perf_counter() - started))
                    confirms.append(confirm)
                await producer.flush()
                self.errors.extend(f"producer: {c.exception()}" for c in confirms if c.exception())
        except Exception as exc:
            self.errors.append(f"producer: {exc}")

    async def consume_stream(self) -> None:
        from ..client import Consumer
        try:
            async with Consumer(self.where.urls, self.queue, token=self.where.token,
                                cafile=self.where.cafile) as consumer:
                while self.consumed < self.args.count and time.monotonic() < self.deadline:
                    message = await consumer.receive(timeout=0.5)
                    if message is None:
                        continue
                    self.end_to_end.append(time.time() - STAMP.unpack_from(message.body)[0])
                    self.consumed += 1
                    consumer.ack(message)
                await consumer.flush()
        except Exception as exc:
            self.errors.append(f"consumer: {exc}")

    def sqs_client(self):
        """boto3's SQS client, one per thread (a client is not safe to share between threads)."""
        import boto3
        from botocore.config import Config
        key = sqs_key(self.where.sqs)
        return boto3.session.Session().client(
            "sqs", endpoint_url=self.sqs_endpoint, region_name=SQS_REGION, verify=self.where.cafile,
            aws_access_key_id=key.access_key, aws_secret_access_key=key.secret_key,
            config=Config(retries={"mode": "standard", "max_attempts": 5}))

    @property
    def sqs_queue_url(self) -> str:
        return f"{self.sqs_endpoint}/{self.where.sqs.account}/{self.queue}"

    def produce_sqs(self, count: int) -> None:
        padding = "x" * max(0, self.args.size - TEXT_STAMP_SIZE)
        try:
            client = self.sqs_client()
            while count > 0 and time.monotonic() < self.deadline:
                batch = min(self.args.batch, count)
                entries = [{"Id": str(i), "MessageBody": text_stamped(padding)} for i in range(batch)]
                started = time.perf_counter()
                failed = client.send_message_batch(QueueUrl=self.sqs_queue_url, Entries=entries).get("Failed", [])
                elapsed = time.perf_counter() - started
                with self.lock:
                    self.put_latencies.append(elapsed)
                    self.errors.extend(f"producer: {f['Code']}: {f.get('Message', '')}" for f in failed)
                count -= batch
        except Exception as exc:
            self.errors.append(f"producer: {exc}")

    def consume_sqs(self) -> None:
        try:
            client = self.sqs_client()
            while time.monotonic() < self.deadline:
                with self.lock:
                    if self.consumed >= self.args.count:
                        return
                got = client.receive_message(QueueUrl=self.sqs_queue_url, MaxNumberOfMessages=SQS_BATCH_MAX,
                                             WaitTimeSeconds=1).get("Messages", [])
                now = time.time()
                if not got:
                    continue
                failed = client.delete_message_batch(QueueUrl=self.sqs_queue_url, Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)]).get("Failed", [])
                with self.lock:
                    self.end_to_end.extend(now - text_sent_at(m["Body"]) for m in got)
                    self.consumed += len(got)
                    self.errors.extend(f"consumer: {f['Code']}: {f.get('Message', '')}" for f in failed)
        except Exception as exc:
            self.errors.append(f"consumer: {exc}")

    def run_stream(self, shares: list[int]) -> tuple[float, float]:
        """Both sides on one event loop; (seconds to produce, seconds to consume)."""
        async def main():
            started = time.perf_counter()
            consumers = [asyncio.create_task(self.consume_stream()) for _ in range(self.args.consumers)]
            await asyncio.gather(*(self.produce_stream(n) for n in shares))
            produced_in = time.perf_counter() - started
            await asyncio.gather(*consumers)
            return produced_in, time.perf_counter() - started
        return asyncio.run(main())

    def run_threads(self, produce, consume, shares: list[int]) -> tuple[float, float]:
        """A thread per producer and consumer; (seconds to produce, seconds to consume)."""
        producers = [threading.Thread(target=produce, args=(n,)) for n in shares]
        consumers = [threading.Thread(target=consume) for _ in range(self.args.consumers)]
        started = time.perf_counter()
        for thread in producers + consumers:
            thread.start()
        for thread in producers:
            thread.join()
        produced_in = time.perf_counter() - started
        for thread in consumers:
            thread.join()
        return produced_in, time.perf_counter() - started


def sqs_key(sqs) -> SqsKey:
    """A data key if there is one (all the bench's SQS calls need), else an admin key."""
    return next((key for key in sqs.keys if key.role == "data"), sqs.keys[0])


def check_sqs(where) -> None:
    """Exits with one line saying what is missing before anything is created."""
    if where.config_path is None:
        raise SystemExit("raftq bench --wire sqs: it signs with a key of the cluster's cluster.toml, and none was "
                         "found: name its directory with --cluster-dir (or RAFTQ_CLUSTER_DIR)")
    if not where.sqs.keys:
        raise SystemExit(f"raftq bench --wire sqs: {where.config_path} has no [[sqs.keys]]: add one (access_key, "
                         f"secret_key, role = \"data\"; docs/sqs.md), restart the nodes, and run it again")
    try:
        import boto3  # noqa: F401
    except ImportError:
        raise SystemExit("raftq bench --wire sqs: it needs boto3 (pip install boto3)") from None


def leader_url(where, admin) -> str:
    """The leader's URL: any node takes SQS calls, but a follower forwards each one
    to the leader, a hop the native clients save by following its redirects."""
    view = admin.cluster()
    address = next((n["http_addr"] for n in view["nodes"] if n["id"] == view.get("leader")), None)
    return where.urls[0] if address is None else f"{where.urls[0].split('://')[0]}://{address}"


def cmd_bench(args) -> int:
    least = TEXT_STAMP_SIZE if args.wire == "sqs" else STAMP.size
    if args.size < least:
        raise SystemExit(f"raftq bench: --size must be at least {least} bytes on the {args.wire} wire (the send time)")
    where = target(args)
    if args.wire == "sqs":
        check_sqs(where)
        args.batch = min(args.batch, SQS_BATCH_MAX)
    queue = args.queue or f"bench-{uuid.uuid4().hex[:8]}"
    with where.client() as admin:
        admin.create_queue(queue)
        run = Run(args, where, queue, leader_url(where, admin) if args.wire == "sqs" else None)
    shares = [args.count // args.producers + (1 if i < args.count % args.producers else 0)
              for i in range(args.producers)]
    if args.wire == "stream":
        produced_in, consumed_in = run.run_stream(shares)
    elif args.wire == "sqs":
        produced_in, consumed_in = run.run_threads(run.produce_sqs, run.consume_sqs, shares)
    else:
        produced_in, consumed_in = run.run_threads(run.produce, run.consume, shares)
    if not args.keep:
        with where.client() as admin:
            admin.delete_queue(queue)
    figures = {
        "queue": queue, "wire": args.wire, "producers": args.producers, "consumers": args.consumers,
        "size": args.size, "batch": args.batch, "count": args.count,
        "put_msgs_per_s": round(args.count / produced_in, 1) if not run.errors else None,
        "put_samples": len(run.put_latencies), "put_latency": percentiles(run.put_latencies),
        "consumed": run.consumed,
        "consume_msgs_per_s": round(run.consumed / consumed_in, 1) if args.consumers else None,
        "end_to_end_latency": percentiles(run.end_to_end),
        "errors": run.errors[:5],
    }
    print(f"put      {args.count} x {args.size} B by {args.producers} producer(s) over {args.wire}"
          + (f", batch {args.batch}" if args.wire != "stream" else "") + ": "
          f"{figures['put_msgs_per_s']} msgs/s; put latency {figures['put_latency']}")
    if args.consumers:
        print(f"consume  {run.consumed} by {args.consumers} consumer(s): {figures['consume_msgs_per_s']} msgs/s; "
              f"put-to-receive {figures['end_to_end_latency']}")
    for error in run.errors[:5]:
        print(f"error    {error}")
    print(json.dumps(figures))
    return 1 if run.errors or (args.consumers and run.consumed < args.count) else 0


def add_parser(sub, common) -> None:
    bench = sub.add_parser("bench", parents=[common], help="a quick load generator: rates and latency percentiles")
    bench.add_argument("--producers", type=int, default=1)
    bench.add_argument("--consumers", type=int, default=1)
    bench.add_argument("--count", type=int, default=10_000, help="messages in all")
    bench.add_argument("--size", type=int, default=128, help="bytes per message body")
    bench.add_argument("--batch", type=int, default=1, help="messages per put (http; sqs: at most 10)")
    bench.add_argument("--wire", choices=("http", "stream", "sqs"), default="http",
                       help="HTTP calls, the streaming wire (confirms, pushed messages), or the SQS API (boto3, "
                            "a key of cluster.toml's [sqs])")
    bench.add_argument("--queue", help="default: a fresh bench-<random> queue, deleted afterwards")
    bench.add_argument("--keep", action="store_true", help="keep the queue afterwards")
    bench.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")
    bench.set_defaults(run=cmd_bench)
