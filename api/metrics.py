"""/metrics in Prometheus text format (prometheus-client), one registry per node.

Names follow Prometheus conventions: counters end in ``_total``, sizes in
``_bytes``, durations in ``_seconds``; a queue's counters count messages
(``raftq_queue_messages_<what>_total``).  With several Raft groups (issue
24) the node's figures without a label are its engine of group 0's (the
group every node is a member of, as ``/health/ready`` reports), each group
this node has an engine of has ``raftq_group_*{group}``, and the queues and
staged writes are those of all of them.  deploy/prometheus-alerts.yaml and
deploy/grafana-dashboard.json read these names; docs/operations.md lists them.
"""

import asyncio
import time

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from raftq.engine.outcome import CommitError

from .errors import ApiError

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Queues per engine read while a scrape gathers every queue's figures: with
# 10 000 queues one read would hold the engine's lock (and its applies)
# for about 0.1 s and encode 2 MB in one go.
STATS_PAGE = 500
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

QUEUE_GAUGES = (("depth", "depth", "Messages stored"),
                ("in_flight", "in_flight", "Leases held across the queue's groups"),
                ("delayed", "delayed", "Deliveries waiting for their time"),
                ("bytes", "stored_bytes", "Bytes of message bodies stored"),
                ("retained", "retained", "Messages every group is done with, kept for a replay (retention)"),
                ("retained_bytes", "retained_bytes", "Bytes of the retained messages"))
QUEUE_COUNTERS = (("put_total", "put", "Messages put"),
                  ("acked_total", "acked", "Messages acked"),
                  ("redelivered_total", "redelivered", "Messages delivered again"),
                  ("dead_lettered_total", "dead_lettered", "Messages moved to the dead-letter queue or dropped "
                                                           "after max_deliveries"),
                  ("expired_total", "expired", "Messages expired by TTL"),
                  ("dropped_total", "dropped", "Messages dropped by overflow"),
                  ("replaced_total", "replaced", "Messages replaced by a newer version of their key"),
                  ("redriven_total", "redriven", "Dead letters moved back to their source queue"))


def _summed(stats: list[dict]) -> dict:
    """The engines' counters (engine/node.py ``Node.stats``) for the whole node: every group's added up."""
    packings = [each["packing"] for each in stats]
    total = {field: sum(each[field] for each in stats) for field in stats[0] if field != "packing"}
    total["packing"] = {"entries": sum(p["entries"] for p in packings), **{
        part: {"bounds": packings[0][part]["bounds"],
               "counts": [sum(counts) for counts in zip(*(p[part]["counts"] for p in packings))],
               "sum": sum(p[part]["sum"] for p in packings)}
        for part in ("commands", "bytes")}}
    return total


class NodeCollector:
    """What the engine reported for this scrape (``Metrics.handler`` asks it
    first): nothing to keep in sync."""

    def __init__(self, engines: dict, buffer, disk, stored_limit: int, catalog_limit: int | None):
        self.engines = engines      # group id -> this node's engine of it
        self.node = engines[0]
        self.buffer = buffer
        self.disk = disk            # api/disk.py's DiskWatch
        self.stored_limit = stored_limit      # --max-stored-bytes (0: none)
        self.catalog_limit = catalog_limit    # None: one group, no catalog
        self.scrape: dict | None = None

    async def fetch(self) -> None:
        groups = sorted(self.engines)
        stats, statuses, queues, stagings, stored = await asyncio.gather(
            asyncio.gather(*(self.engines[g].stats() for g in groups)),
            asyncio.gather(*(self.engines[g].status() for g in groups)),
            asyncio.gather(*(self._queue_stats(self.engines[g]) for g in groups)),
            asyncio.gather(*(self.engines[g].read("staging_usage") for g in groups)),
            asyncio.gather(*(self.engines[g].read("stored_usage") for g in groups)))
        catalog = None if self.catalog_limit is None else (await self.node.read("catalog_usage")).result
        self.scrape = {"status": statuses[0], "stats": _summed(stats), "groups": dict(zip(groups, statuses)),
                       "queues": [queue for pages in queues for queue in pages],
                       "staging": {field: sum(usage.result[field] for usage in stagings)
                                   for field in ("bytes", "stages", "marks")},
                       "stored": {group: usage.result["bytes"] for group, usage in zip(groups, stored)},
                       "catalog": catalog}

    @staticmethod
    async def _queue_stats(engine) -> list:
        queues, after = [], ""
        while True:
            page = (await engine.read("all_queue_stats", after, STATS_PAGE)).result
            queues.extend(page)
            if len(page) < STATS_PAGE:
                return queues
            after = page[-1][0]

    def collect(self):
        if self.scrape is None:      # the registry's own describe() at registration
            return
        status, stats = self.scrape["status"], self.scrape["stats"]
        ready = status["leader_id"] is not None and status["quorum_ok"]
        yield GaugeMetricFamily("raftq_is_leader", "1 on the leader", value=int(status["role"] == "leader"))
        yield GaugeMetricFamily("raftq_ready", "1 while this node has a leader that hears from a majority",
                                value=int(ready))
        yield GaugeMetricFamily("raftq_cluster_voters", "Voters in the cluster, this node included",
                                value=1 + len(status["peers"]))
        yield GaugeMetricFamily("raftq_term", "Current Raft term", value=status["term"])
        yield GaugeMetricFamily("raftq_commit_index", "Raft commit index", value=status["commit_index"])
        yield GaugeMetricFamily("raftq_applied_index", "Last applied log index", value=status["applied_index"])
        yield GaugeMetricFamily("raftq_apply_lag_entries", "Committed entries not yet applied here",
                                value=max(0, status["commit_index"] - status["applied_index"]))
        yield CounterMetricFamily("raftq_became_leader", "Times this node won an election and became leader",
                                  value=stats["times_became_leader"])
        yield CounterMetricFamily("raftq_pre_votes_asked", "Times this node's election timeout ran out and it "
                                  "asked whether a majority would vote for it", value=status["pre_votes"]["asked"])
        yield CounterMetricFamily("raftq_pre_votes_won", "Times a majority said yes and this node stood for election",
                                  value=status["pre_votes"]["won"])
        yield CounterMetricFamily("raftq_quorum_step_downs", "Times this node stopped leading because no majority "
                                  "answered it within the election timeout (CheckQuorum)",
                                  value=status["quorum_step_downs"])
        yield CounterMetricFamily("raftq_raft_late_ticks", "Raft ticks that ran 0.1 s or more after they were due, "
                                  "every Raft group's on this node: a leader's late heartbeat costs it its lease, a "
                                  "later one an election (the engine's log says where the time went)",
                                  value=stats["late_ticks"])
        yield CounterMetricFamily("raftq_raft_late_ticks_seconds", "How late those ticks ran, in all",
                                  value=stats["late_ticks_seconds"])
        yield CounterMetricFamily("raftq_raft_ticks", "pysyncobj ticks group 0's engine ran (heartbeats, election "
                                  "deadlines, catch-up; none on a lone put's path, as leader or follower)",
                                  value=status["ticks"])
        yield CounterMetricFamily("raftq_raft_leader_ticks", "pysyncobj ticks group 0's engine ran while leading "
                                  "(heartbeats, catch-up, elections' aftermath; none on a lone put's path)",
                                  value=status["leader_ticks"])
        sent = CounterMetricFamily("raftq_raft_appends_sent", "Appends (heartbeats included) group 0's engine sent, "
                                   "by wire: binary to a peer that announced it, pickled to one of an older release",
                                   labels=["wire"])
        for wire, count in status["appends_sent"].items():
            sent.add_metric([wire], count)
        yield sent
        yield GaugeMetricFamily("raftq_raft_plain_entries", "1 while group 0's engine logs what it proposes without "
                                "pickle: every node runs a release that applies such entries (api/features.py)",
                                value=int(status["plain_entries"]))
        yield CounterMetricFamily("raftq_entries_applied", "Log entries applied by this node",
                                  value=stats["entries_applied"])
        yield GaugeMetricFamily("raftq_buffer_pending_bytes", "Bytes of buffered puts not forwarded yet",
                                value=self.buffer.pending_bytes)
        yield CounterMetricFamily("raftq_buffer_dead_lettered", "Buffered puts the leader refused for good",
                                  value=self.buffer.dead_lettered)
        yield GaugeMetricFamily("raftq_long_polls_waiting", "Receives waiting for a ready message",
                                value=stats["long_polls_waiting"])
        yield CounterMetricFamily("raftq_receives_with_a_put", "Waiting receives written in the log entry of "
                                  "a put to their queue, to lease its messages in the same Raft round",
                                  value=stats["receives_with_a_put"])
        yield CounterMetricFamily("raftq_damaged_records", "Stored records (log entries, kept entries, entries "
                                  "a snapshot carries) a read found damaged on this node's disk",
                                  value=stats["damaged_records"])
        yield CounterMetricFamily("raftq_repaired_records", "Damaged records written back from a replica's "
                                  "intact copy", value=stats["repaired_records"])
        yield CounterMetricFamily("raftq_scrub_passes", "Passes of the scrubber over every live entry, each read "
                                  "back and checked (--scrub-pass-hours)", value=stats["scrub_passes"])
        yield CounterMetricFamily("raftq_scrubbed_bytes", "Bytes of records the scrubber read back and checked",
                                  value=stats["scrubbed_bytes"])
        yield CounterMetricFamily("raftq_relocations", "relocate commands this node proposed as a leader: live "
                                  "bodies copied out of mostly-dead log entries (engine/relocation.py)",
                                  value=stats["relocations"])
        yield CounterMetricFamily("raftq_relocated_bodies", "Bodies those commands moved into their own entries",
                                  value=stats["relocated_bodies"])
        yield CounterMetricFamily("raftq_relocated_bytes", "Body bytes those commands moved",
                                  value=stats["relocated_bytes"])
        yield GaugeMetricFamily("raftq_journal_size_bytes", "Bytes of the Raft journal on disk",
                                value=status["log_size"])
        yield GaugeMetricFamily("raftq_journal_segments", "Segment files of the Raft journal",
                                value=status["log_segments"])
        yield GaugeMetricFamily("raftq_journal_kept_bytes", "Bytes of the compacted log entries the journal "
                                "keeps because stored bodies lie in them", value=status["log_kept_bytes"])
        yield CounterMetricFamily("raftq_journal_syncs", "Data syncs (fsync) of the journal",
                                  value=status["journal_syncs"])
        disk = self.disk.own
        yield GaugeMetricFamily("raftq_disk_free_bytes", "Bytes free on the data directory's file system "
                                "(for its owner's writes)", value=disk.free_bytes)
        yield GaugeMetricFamily("raftq_disk_capacity_bytes", "Size of the data directory's file system",
                                value=disk.capacity_bytes)
        yield GaugeMetricFamily("raftq_disk_watermark_bytes", "Free bytes below which this node is in disk alarm "
                                "(--disk-free-limit and its snapshots' size; 0: no alarm)",
                                value=disk.watermark_bytes)
        yield GaugeMetricFamily("raftq_disk_alarm", "1 while this node is in disk alarm: writes to the Raft groups "
                                "it holds are refused (507 insufficient_storage)", value=int(disk.alarm))
        yield GaugeMetricFamily("raftq_stored_bytes_limit", "Bytes of messages the cluster may store "
                                "(--max-stored-bytes; 0: no cap)", value=self.stored_limit)
        snapshot = status.get("snapshot") or {}
        yield GaugeMetricFamily("raftq_snapshot_size_bytes", "Size of the last snapshot",
                                value=snapshot.get("bytes") or 0)
        yield GaugeMetricFamily("raftq_snapshot_duration_seconds", "How long the last snapshot took",
                                value=snapshot.get("seconds") or 0)
        yield from self._groups()
        gauges = [(field, GaugeMetricFamily(f"raftq_queue_{name}", help_, labels=["queue"]))
                  for field, name, help_ in QUEUE_GAUGES]
        counters = [(field, CounterMetricFamily(f"raftq_queue_messages_{name}", help_, labels=["queue"]))
                    for field, name, help_ in QUEUE_COUNTERS]
        # read in pages of (name, stats): a queue deleted meanwhile is simply absent
        for queue, figures in self.scrape["queues"]:
            for field, family in gauges + counters:
                family.add_metric([queue], figures[field])
        for _, family in gauges + counters:
            yield family
        staging = self.scrape["staging"]
        yield GaugeMetricFamily("raftq_staged_bytes", "Bytes of staged writes held (each message's size plus "
                                "100), counted against --max-staged-bytes", value=staging["bytes"])
        yield GaugeMetricFamily("raftq_stages", "Stages held, counted against --max-stages",
                                value=staging["stages"])
        yield GaugeMetricFamily("raftq_producers", "Producers with a committed batch (high-water mark)",
                                value=staging["marks"])
        for name, help_, packing in (("raftq_log_entry_commands", "Commands packed per log entry",
                                      stats["packing"]["commands"]),
                                     ("raftq_log_entry_size_bytes", "Bytes per log entry", stats["packing"]["bytes"])):
            buckets = [(str(float(b)), c) for b, c in zip(packing["bounds"], packing["counts"])]
            buckets.append(("+Inf", stats["packing"]["entries"]))
            yield HistogramMetricFamily(name, help_, buckets=buckets, sum_value=packing["sum"])


    def _groups(self):
        """Each Raft group this node has an engine of, labelled by its id."""
        families = {name: GaugeMetricFamily(f"raftq_group_{name}", help_, labels=["group"]) for name, help_ in (
            ("is_leader", "1 where this node's engine of the group leads it"),
            ("term", "The group's current Raft term"), ("commit_index", "The group's Raft commit index"),
            ("applied_index", "The group's last log index applied here"),
            ("stored_bytes", "Bytes of messages the group's queues store, as this replica has applied them "
                             "(what --max-stored-bytes counts)"))}
        for group, status in self.scrape["groups"].items():
            label = [str(group)]
            families["is_leader"].add_metric(label, int(status["role"] == "leader"))
            for field in ("term", "commit_index", "applied_index"):
                families[field].add_metric(label, status[field])
            families["stored_bytes"].add_metric(label, self.scrape["stored"][group])
        yield from families.values()
        yield GaugeMetricFamily("raftq_groups_led", "Raft groups this node leads", value=sum(
            status["role"] == "leader" for status in self.scrape["groups"].values()))
        catalog = self.scrape["catalog"]
        if catalog is not None:
            yield GaugeMetricFamily("raftq_catalog_names", "Queue names in this node's replica of the catalog, "
                                    "the names of deleted queues included", value=catalog["names"])
            yield GaugeMetricFamily("raftq_catalog_names_limit", "Queue names the catalog may hold "
                                    "(--max-queues for each group)", value=self.catalog_limit)


class Metrics:
    def __init__(self, engines: dict, buffer, disk, stored_limit: int, catalog_limit: int | None):
        self.registry = CollectorRegistry()
        self.requests = Counter("raftq_http_requests", "HTTP requests", ["method", "route", "status"],
                                registry=self.registry)
        self.latency = Histogram("raftq_http_request_duration_seconds", "HTTP request latency", ["route"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.collector = NodeCollector(engines, buffer, disk, stored_limit, catalog_limit)
        self.registry.register(self.collector)
        self._rendering: asyncio.Future | None = None

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
        # Scrapes that arrive while one is rendered share its text: with 10 k
        # queues a render takes a while, and eight at once would take eight times.
        if self._rendering is None:
            self._rendering = asyncio.ensure_future(self._render())
            self._rendering.add_done_callback(lambda _: setattr(self, "_rendering", None))
        try:
            body = await asyncio.shield(self._rendering)
        except CommitError:
            raise ApiError("no_quorum", "this node's engine did not answer; retry",
                           headers={"Retry-After": "1"}) from None
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def _render(self) -> bytes:
        await self.collector.fetch()
        return generate_latest(self.registry)
