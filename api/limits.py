"""A node's caps, and the help of the `raftq node` option each one is.

A module of its own, importing nothing but the standard library: the command
line builds `raftq node`'s options from it in every install, also one
with the client only (pyproject.toml: the server's dependencies are the
`server` extra), where the front's application cannot be imported.
"""

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Limits:
    """The node's caps (docs/security.md); each is a `raftq node` option of the same name."""
    max_request_bytes: int = 4 << 20
    max_long_polls: int = 1000
    max_long_polls_per_client: int = 500
    max_subscriptions_per_connection: int = 100
    max_connections: int = 2000
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    stream_write_stall_s: float = 30.0
    max_queues: int = 10_000
    max_groups_per_queue: int = 100
    max_dedup_bytes: int = 16 << 20
    max_dedup_window_ms: int = 86_400_000
    max_staged_bytes: int = 256 << 20
    max_staged_bytes_per_producer: int = 64 << 20
    max_stages: int = 10_000
    max_stages_per_producer: int = 2_000
    max_staged_messages_per_producer: int = 10_000
    max_stage_ttl_ms: int = 86_400_000
    max_producers: int = 10_000
    max_stored_bytes: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


LIMIT_HELP = {
    "max_request_bytes": "largest request body; a full log entry as JSON with base64 bodies fits",
    "max_long_polls": "receives waiting at once on this node; beyond, 429 too_many_waiters",
    "max_long_polls_per_client": "receives waiting at once on this node from one client address (HTTP "
                                 "waits and stream subscriptions); beyond, 429 too_many_waiters",
    "max_subscriptions_per_connection": "subscriptions of one streaming-wire connection; beyond, 429 "
                                        "limit_reached",
    "max_connections": "HTTP connections open at once; beyond, new ones are closed",
    "header_timeout_s": "seconds to send a request's headers, from connecting or from the last answer "
                        "(an idle keep-alive connection is closed after it too)",
    "body_timeout_s": "seconds to send a request's body",
    "stream_write_stall_s": "seconds a streaming-wire connection may take nothing of a frame waiting for it "
                            "before it is dropped",
    "max_queues": "queues in each Raft group (and, for each group, names in the catalog of several); "
                  "creating more is 429 limit_reached",
    "max_groups_per_queue": "consumer groups per queue; adding more is 429 limit_reached",
    "max_dedup_bytes": "bytes of message ids a queue keeps for deduplication; the oldest are forgotten "
                       "beyond it, before their window ends",
    "max_dedup_window_ms": "largest dedup_window_ms a queue may be given",
    "max_staged_bytes": "bytes of staged writes the cluster holds (each message's size plus 100); "
                        "a stage beyond is 429 limit_reached",
    "max_staged_bytes_per_producer": "bytes of staged writes one producer holds; a stage beyond is 429 "
                                     "limit_reached",
    "max_stages": "stages the cluster holds; a new stage beyond is 429 limit_reached",
    "max_stages_per_producer": "stages one producer holds; a new stage beyond is 429 limit_reached",
    "max_staged_messages_per_producer": "messages one producer holds staged, so also the most one commit "
                                        "publishes in one log entry; a stage beyond is 429 limit_reached",
    "max_stage_ttl_ms": "largest ttl_ms of a stage (400 beyond); also caps the default of an hour",
    "max_producers": "producers whose committed batch the cluster keeps; a first commit beyond is 429 "
                     "limit_reached",
    "max_stored_bytes": "bytes of messages the cluster stores (each counted as a queue's max_bytes counts it), "
                        "an equal share of it in each Raft group; a put, transaction or stage commit that would "
                        "store more is 507 insufficient_storage. 0: no cap (every node's disk alarm still stops "
                        "writes before its disk fills, --disk-free-limit)",
}
assert set(LIMIT_HELP) == {f for f in Limits.__dataclass_fields__}
