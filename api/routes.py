"""Every route once: method, path, handler, the role it needs, and what the
OpenAPI document (openapi.py) says about it.  app.py builds the router and
the auth check from this table, so the served document cannot drift from
what the node does.

Roles (docs/security.md): ``None`` is open to anyone (health, the API
document, the console's static files); ``data`` is queues' messages and
consumer groups, over HTTP or the stream; ``metrics`` is ``/metrics``;
``admin`` is queue configuration, redrive, membership, leadership,
verification and the console's event stream, and its token is also taken
wherever ``data`` or ``metrics`` is asked for.
"""

import re
from dataclasses import dataclass, field
from typing import Callable

from . import catalog_release, cluster, console, disk, events, messages, openapi_schemas as schemas, queues, staging, \
    stream
from .sqs import credentials as sqs_credentials, service as sqs

OPEN, DATA, METRICS, ADMIN = None, "data", "metrics", "admin"
# Signed with AWS Signature Version 4 by a key of [sqs] in cluster.toml, whose
# role the SQS endpoint checks per action (docs/sqs.md): no bearer token.
SIGV4 = "sigv4"
ACCEPTED = {DATA: ("data", "admin"), METRICS: ("metrics", "admin"), ADMIN: ("admin",)}


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Callable
    role: str | None
    summary: str
    ok: tuple[int, ...] = (200,)
    errors: tuple[int, ...] = ()         # besides those every route of its kind may answer
    body: dict | None = None             # JSON schema of the request body
    body_required: bool = False
    query: tuple[tuple[str, dict], ...] = field(default=())
    leader: bool = False                 # served by the leader: 307 / 503 from a follower

    @property
    def template(self) -> str:
        """The path without its parameters' patterns, as aiohttp's canonical form and OpenAPI name it."""
        return re.sub(r"\{(\w+):[^/]*\}", r"{\1}", self.path)


Q = "/v1/queues/{queue}"
SQS_QUEUE = "/{account:[0-9]{12}}/{queue}"
P = "/v1/producers/{producer}"
FORCE = ("force", {"type": "string", "enum": ["true"]})
CONSISTENCY = ("consistency", {"type": "string", "enum": ["leader", "strong", "any"]})

ROUTES = (
    Route("GET", "/health/live", cluster.live, OPEN, "The process serves HTTP"),
    Route("GET", "/health/ready", cluster.ready, OPEN, "This node follows a leader with a quorum",
          errors=(503,), query=(("groups", {"type": "string", "enum": ["true"]}),)),
    Route("GET", "/health/disk", disk.health, OPEN, "This node's free disk space, its watermark, and whether it is "
          "in disk alarm (writes to the Raft groups it holds refused, 507)"),
    Route("GET", "/v1/openapi.json", None, OPEN, "This document"),
    Route("GET", "/metrics", None, METRICS, "Prometheus metrics"),
    Route("GET", "/v1/cluster", cluster.show, ADMIN, "Members and their replication state"),
    Route("POST", "/v1/cluster/nodes", cluster.add_node, ADMIN, "Add a voter (to group 0, or to `group`: the "
          "replica mover's)", ok=(201, 200), errors=(409,), body=schemas.NEW_NODE, body_required=True,
          query=(FORCE, ("group", {"type": "integer", "minimum": 0})), leader=True),
    Route("DELETE", "/v1/cluster/nodes/{node}", cluster.remove_node, ADMIN, "Remove a voter (202: with several "
          "Raft groups, it leaves once its replicas moved away)", ok=(204, 202), errors=(404, 409),
          query=(FORCE, ("group", {"type": "integer", "minimum": 0})), leader=True),
    Route("POST", "/v1/cluster/verify", cluster.verify, ADMIN, "Compare every replica's state digest (of every "
          "Raft group, or of `group`)", query=(("group", {"type": "integer", "minimum": 0}),), leader=True),
    Route("POST", "/v1/cluster/leader", cluster.transfer_leadership, ADMIN,
          "Hand leadership to another voter", errors=(404,), body=schemas.LEADER, leader=True),
    Route("POST", "/v1/cluster/rebalance", cluster.rebalance, ADMIN,
          "Move each Raft group's leadership to its first live, caught-up preference now",
          query=(("group", {"type": "integer", "minimum": 0}),), leader=True),
    Route("POST", "/v1/cluster/catalog/release", catalog_release.release_names, ADMIN,
          "The name releaser's step on group 0's leader (node to node): forget names of deleted queues that "
          "`group` retired, once a replica of it says so", errors=(404, 409), body=schemas.RELEASE_NAMES,
          body_required=True, leader=True),
    Route("POST", catalog_release.RETIRING_PATH, catalog_release.read_retiring, ADMIN,
          "Which of `names` a replica of `group` holds retiring, and its fence (node to node: what group 0's "
          "leader checks a release against)", errors=(307, 404, 503), body=schemas.RETIRING,
          body_required=True, query=(("group", {"type": "integer", "minimum": 0}),)),
    Route("GET", "/v1/cluster/routing", cluster.routing, DATA,
          "Where each queue is served: every Raft group's members and leader, and queue -> group",
          errors=(404,), query=(("group", {"type": "integer", "minimum": 0}),)),
    Route("GET", "/v1/events", events.stream, ADMIN, "Server-sent events: what the console shows",
          query=(("interval_ms", {"type": "integer", "minimum": 250, "maximum": 60_000}),)),
    Route("GET", "/v1/cluster/checkpoints/{token}", cluster.checkpoint, ADMIN,
          "This replica's digest at a checkpoint (of group 0, or of `group`)", errors=(404,),
          query=(("group", {"type": "integer", "minimum": 0}),)),
    Route("GET", "/v1/queues", queues.list_all, DATA, "List queues (of every Raft group, or of `group`)",
          query=(CONSISTENCY, ("group", {"type": "integer", "minimum": 0})), leader=True),
    Route("PUT", Q, queues.create, ADMIN, "Create a queue", ok=(200, 201), errors=(409, 429, 507),
          body=schemas.QUEUE_CONFIG, leader=True),
    Route("PATCH", Q, queues.patch, ADMIN, "Change a queue's config", errors=(404,),
          body=schemas.QUEUE_CONFIG, body_required=True, leader=True),
    Route("GET", Q, queues.show, DATA, "A queue's config and stats", errors=(404,), query=(CONSISTENCY,),
          leader=True),
    Route("DELETE", Q, queues.delete, ADMIN, "Delete a queue", ok=(204,), errors=(404,), leader=True),
    Route("POST", Q + "/messages", messages.put, DATA, "Put messages", ok=(201, 202),
          errors=(404, 429, 507), body=schemas.PUT, body_required=True,
          query=(("durability", {"type": "string", "enum": ["quorum", "all", "leader"]}),
                 ("buffer", {"type": "string", "enum": ["allow"]})), leader=True),
    Route("GET", Q + "/messages", messages.browse, DATA, "Browse a group's messages without leasing",
          errors=(404,), query=(("group", schemas.NAME), ("from_seq", {"type": "integer", "minimum": 0}),
                                ("from_time_ms", {"type": "integer", "minimum": 0}),
                                ("limit", {"type": "integer", "minimum": 1, "maximum": 10_000}), CONSISTENCY),
          leader=True),
    Route("POST", Q + "/receive", messages.receive, DATA, "Lease ready messages (long poll)",
          errors=(404, 429), body=schemas.RECEIVE, leader=True),
    Route("POST", Q + "/ack", messages.ack, DATA, "Acknowledge leases", errors=(404, 409),
          body=schemas.RECEIPTS, body_required=True, leader=True),
    Route("POST", Q + "/nack", messages.nack, DATA, "Give leases back", errors=(404, 409),
          body=schemas.RECEIPTS, body_required=True, leader=True),
    Route("POST", Q + "/extend", messages.extend, DATA, "Extend leases", errors=(404, 409),
          body=schemas.RECEIPTS, body_required=True, leader=True),
    Route("GET", Q + "/groups", queues.list_groups, DATA, "List a queue's consumer groups", errors=(404,),
          query=(CONSISTENCY,), leader=True),
    Route("PUT", Q + "/groups/{group}", queues.add_group, DATA, "Add a consumer group", ok=(200, 201),
          errors=(404, 409, 429), body=schemas.GROUP, leader=True),
    Route("GET", Q + "/groups/{group}", queues.show_group, DATA, "A consumer group's cursor and stats",
          errors=(404,), query=(CONSISTENCY,), leader=True),
    Route("PATCH", Q + "/groups/{group}", queues.patch_group, DATA, "Pause, resume or rate-limit a consumer group",
          errors=(404, 409), body=schemas.PATCH_GROUP, body_required=True, leader=True),
    Route("DELETE", Q + "/groups/{group}", queues.delete_group, DATA, "Delete a consumer group", ok=(204,),
          errors=(404, 409), leader=True),
    Route("POST", Q + "/groups/{group}/seek", queues.seek_group, DATA, "Move a consumer group to a position: it "
          "replays the stored messages from there", errors=(404, 409), body=schemas.SEEK, body_required=True,
          leader=True),
    Route("POST", Q + "/groups/{group}/commit", messages.commit, DATA, "Move a group's cursor",
          errors=(404,), body=schemas.COMMIT, body_required=True, leader=True),
    Route("POST", Q + "/redrive", queues.redrive, ADMIN, "Move dead letters back to their queues",
          errors=(404, 409, 429), body=schemas.REDRIVE, leader=True),
    Route("POST", "/v1/tx", messages.transaction, DATA, "Acks and puts, all or nothing", ok=(200, 201),
          errors=(404, 409, 429, 507), body=schemas.TX, body_required=True, leader=True),
    Route("GET", "/v1/stream", stream.stream, DATA, "The streaming wire: a WebSocket of CBOR frames "
          "(docs/stream.md)", ok=(101,)),
    Route("GET", "/v1/producers", staging.list_all, DATA, "Producers with staged writes (Spark connector), of every "
          "Raft group or of `group`", query=(CONSISTENCY, ("group", {"type": "integer", "minimum": 0})), leader=True),
    Route("GET", P, staging.show, DATA, "One producer's stages and last committed batch", errors=(404,),
          leader=True),
    Route("DELETE", P, staging.delete, DATA, "Forget a producer's stages", ok=(204,), errors=(404,),
          leader=True),
    Route("POST", P + "/stage", staging.stage, DATA, "Stage messages for a later commit", ok=(200, 201),
          errors=(404, 409, 429, 507), body=schemas.ANY_OBJECT, body_required=True, leader=True),
    Route("POST", P + "/commit", staging.commit, DATA, "Publish staged messages at once, once per batch",
          ok=(200, 201), errors=(404, 409, 429, 507), body=schemas.ANY_OBJECT, body_required=True, leader=True),
    Route("POST", P + "/abort", staging.abort, DATA, "Drop staged messages", errors=(404, 409),
          body=schemas.ANY_OBJECT, body_required=True, leader=True),
    Route("GET", "/v1/sqs/keys", sqs_credentials.list_keys, ADMIN, "The SQS API's keys: each one's access key id, "
          "role and where it is kept (never a secret)", query=(CONSISTENCY,), leader=True),
    Route("POST", "/v1/sqs/keys", sqs_credentials.add_key, ADMIN, "Make an SQS key of `role`, kept by the cluster "
          "(its secret is in this answer only)", ok=(201,), errors=(409, 429), body=schemas.SQS_KEY,
          body_required=True, leader=True),
    Route("DELETE", "/v1/sqs/keys/{access_key}", sqs_credentials.remove_key, ADMIN,
          "Remove an SQS key the cluster keeps", errors=(404, 409), leader=True),
    Route("POST", "/", sqs.handle, SIGV4, "The SQS API: AWS JSON 1.0 (X-Amz-Target) or the query protocol "
          "(docs/sqs.md)", errors=(403, 413, 503)),
    Route("GET", "/", sqs.handle, SIGV4, "The SQS API's query protocol as a GET", errors=(403, 503)),
    Route("POST", SQS_QUEUE, sqs.handle, SIGV4, "The SQS API at a queue's URL", errors=(403, 413, 503)),
    Route("GET", SQS_QUEUE, sqs.handle, SIGV4, "The SQS API's query protocol at a queue's URL, as a GET",
          errors=(403, 503)),
    Route("GET", "/ui", console.root, OPEN, "The web console", ok=(302,)),
    Route("GET", "/ui/", console.asset, OPEN, "The web console's page"),
    Route("GET", "/ui/{name}", console.asset, OPEN, "The web console's files", errors=(404,)),
)
