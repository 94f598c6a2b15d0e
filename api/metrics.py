"""/metrics in Prometheus text format (prometheus-client), one registry per node."""

import time

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class NodeCollector:
    """Read at scrape time from the node and its state machine: nothing to keep in sync."""

    def __init__(self, node):
        self.node = node

    def collect(self):
        status = self.node.status()
        yield GaugeMetricFamily("raftq_is_leader", "1 on the leader", value=int(status["role"] == "leader"))
        yield GaugeMetricFamily("raftq_term", "Current Raft term", value=status["term"])
        yield GaugeMetricFamily("raftq_commit_index", "Raft commit index", value=status["commit_index"])
        yield GaugeMetricFamily("raftq_applied_index", "Last applied log index", value=status["applied_index"])
        yield GaugeMetricFamily("raftq_apply_lag_entries", "Committed entries not yet applied here",
                                value=max(0, status["commit_index"] - status["applied_index"]))
        yield CounterMetricFamily("raftq_elections_won", "Times this node became leader",
                                  value=self.node.elections_seen)
        yield CounterMetricFamily("raftq_entries_applied", "Log entries applied by this node",
                                  value=self.node.entries_applied)
        yield GaugeMetricFamily("raftq_long_polls_waiting", "Receives waiting for a ready message",
                                value=self.node.long_polls_waiting())
        snapshot = status.get("snapshot") or {}
        yield GaugeMetricFamily("raftq_snapshot_bytes", "Size of the last snapshot",
                                value=snapshot.get("bytes") or 0)
        yield GaugeMetricFamily("raftq_snapshot_seconds", "Duration of the last snapshot",
                                value=snapshot.get("seconds") or 0)
        gauges = {name: GaugeMetricFamily(f"raftq_queue_{name}", help_, labels=["queue"]) for name, help_ in (
            ("depth", "Messages stored"), ("in_flight", "Leases held"), ("delayed", "Deliveries waiting for their time"),
            ("bytes", "Bytes of message bodies stored"))}
        counters = {name: CounterMetricFamily(f"raftq_queue_{name.removesuffix('_total')}", help_, labels=["queue"])
                    for name, help_ in (("put_total", "Messages put"), ("acked_total", "Messages acked"),
                                        ("redelivered_total", "Redeliveries"),
                                        ("dead_lettered_total", "Messages dead-lettered"),
                                        ("expired_total", "Messages expired by TTL"),
                                        ("dropped_total", "Messages dropped by overflow"))}
        for queue in self.node.read("list_queues")["queues"]:
            stats = self.node.read("queue_info", queue["name"])["stats"]
            for name, family in gauges.items():
                family.add_metric([queue["name"]], stats[name])
            for name, family in counters.items():
                family.add_metric([queue["name"]], stats[name])
        yield from gauges.values()
        yield from counters.values()


class Metrics:
    def __init__(self, node):
        self.registry = CollectorRegistry()
        self.requests = Counter("raftq_http_requests", "HTTP requests", ["method", "route", "status"],
                                registry=self.registry)
        self.latency = Histogram("raftq_http_request_seconds", "HTTP request latency", ["route"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.entry_commands = Histogram("raftq_log_entry_commands", "Commands packed per log entry",
                                        buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000),
                                        registry=self.registry)
        self.entry_bytes = Histogram("raftq_log_entry_bytes", "Bytes per log entry",
                                     buckets=(256, 1024, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20),
                                     registry=self.registry)
        self.registry.register(NodeCollector(node))

    def observe_entry(self, commands: int, size: int) -> None:
        self.entry_commands.observe(commands)
        self.entry_bytes.observe(size)

    def middleware(self):
        @web.middleware
        async def measure(request: web.Request, handler):
            started = time.perf_counter()
            route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
            status = 500
            try:
                response = await handler(request)
                status = response.status
                return response
            except web.HTTPException as exc:
                status = exc.status
                raise
            finally:
                self.requests.labels(request.method, route, str(status)).inc()
                self.latency.labels(route).observe(time.perf_counter() - started)
        return measure

    async def handler(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE})
