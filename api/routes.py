"""Every route once: method, path, handler, the action it needs, and what the
OpenAPI document (openapi.py) says about it.  app.py builds the router and
the auth check from this table, so the served document cannot drift from
what the node does.

Actions (statemachine/rules.py, docs/security.md "Principals"): ``None`` is
open to anyone (health, the API document, the console's static files);
``put``, ``receive``, ``browse``, ``admin`` (a queue's configuration),
``redrive`` and ``producers`` are checked on the path's queue (a route
without one: the caller holds it on some queue, and the handler checks each
queue the request names, or lists only the queues the caller has an action
on); ``metrics`` is reading the cluster's figures and state, ``cluster``
changing it (membership, leadership, verification, credentials). A tuple is
any one of its actions. The bootstrap tokens act as their role's rules: admin
everything, data the queue actions but admin and redrive, metrics ``metrics``.
"""

import re
from dataclasses import dataclass, field
from typing import Callable

from raftq.statemachine.rules import (ADMIN, BROWSE, CLUSTER, METRICS, PRODUCERS, PUT, QUEUE_ACTIONS, RECEIVE,
                                      REDRIVE)

from . import (catalog_release, cluster, connections, console, disk, events, messages, openapi_schemas as schemas,
               principal_routes, queues, staging, stream)
from .sqs import credentials as sqs_credentials, service as sqs

OPEN = None
# Signed with AWS Signature Version 4 by an SQS key, whose principal the SQS endpoint checks per
# action (docs/sqs.md): no bearer token.
SIGV4 = "sigv4"
# Any valid credential (who it is), and any queue action on some queue
AUTHENTICATED = "authenticated"
ANY_QUEUE = QUEUE_ACTIONS


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Callable
    action: str | tuple | None
    summary: str
    ok: tuple[int, ...] = (200,)
    errors: tuple[int, ...] = ()         # besides those every route of its kind may answer
    body: dict | None = None             # JSON schema of the request body
    body_required: bool = False
    query: tuple[tuple[str, dict], ...] = field(default=())
    leader: bool = False                 # served by the leader: 307 / 503 from a follower

    @property
    def actions(self) -> tuple:
        """The actions that admit a caller (any one of them)."""
        return self.action if isinstance(self.action, tuple) else (self.action,)

    @property
    def template(self) -> str:
        """The path without its parameters' patterns, as aiohttp's canonical form and OpenAPI name it."""
        return re.sub(r"\{(\w+):[^/]*\}", r"{\1}", self.path)


Q = "/v1/queues/{queue}"
SQS_QUEUE = "/{account:[0-9]{12}}/{queue}"
P = "/v1/producers/{producer}"
PRINCIPAL_PATH = "/v1/principals/{name}"
FORCE = ("force", {"type": "string", "enum": ["true"]})
CONSISTENCY = ("consistency", {"type": "string", "enum": ["leader", "strong", "any"]})

ROUTES = (
    Route("GET", "/health/live", cluster.live, OPEN, "The process serves HTTP"),
    Route("GET", "/health/ready", cluster.ready, OPEN, "This node follows a leader with a quorum",
          errors=(503,), query=(("groups", {"type": "string", "enum": ["true"]}),)),
    Route("GET", "/health/disk", disk.health, OPEN, "This node's free disk space, its watermark, and whether it is "
          "in disk alarm (writes to the Raft groups it holds refused, 507); with `alarm` and `wait_ms`, held until "
          "the alarm is not `alarm`, for `wait_ms` at most (how the nodes ask each other)", errors=(400,),
          query=(("alarm", {"type": "string", "enum": ["true", "false"]}),
                 ("wait_ms", {"type": "integer", "minimum": 1, "maximum": disk.MAX_HOLD_MS}))),
    Route("GET", "/v1/openapi.json", None, OPEN, "This document"),
    Route("GET", "/metrics", None, METRICS, "Prometheus metrics"),
    Route("GET", "/v1/cluster", cluster.show, METRICS, "Members and their replication state"),
    Route("POST", "/v1/cluster/nodes", cluster.add_node, CLUSTER, "Add a voter (to group 0, or to `group`: the "
          "replica mover's)", ok=(201, 200), errors=(409,), body=schemas.NEW_NODE, body_required=True,
          query=(FORCE, ("group", {"type": "integer", "minimum": 0})), leader=True),
    Route("DELETE", "/v1/cluster/nodes/{node}", cluster.remove_node, CLUSTER, "Remove a voter (202: with several "
          "Raft groups, it leaves once its replicas moved away)", ok=(204, 202), errors=(404, 409),
          query=(FORCE, ("group", {"type": "integer", "minimum": 0})), leader=True),
    Route("POST", "/v1/cluster/verify", cluster.verify, CLUSTER, "Compare every replica's state digest (of every "
          "Raft group, or of `group`)", query=(("group", {"type": "integer", "minimum": 0}),), leader=True),
    Route("POST", "/v1/cluster/leader", cluster.transfer_leadership, CLUSTER,
          "Hand leadership to another voter", errors=(404,), body=schemas.LEADER, leader=True),
    Route("POST", "/v1/cluster/rebalance", cluster.rebalance, CLUSTER,
          "Move each Raft group's leadership to its first live, caught-up preference now",
          query=(("group", {"type": "integer", "minimum": 0}),), leader=True),
    Route("POST", "/v1/cluster/catalog/release", catalog_release.release_names, CLUSTER,
          "The name releaser's step on group 0's leader (node to node): forget names of deleted queues that "
          "`group` retired, once a replica of it says so", errors=(404, 409), body=schemas.RELEASE_NAMES,
          body_required=True, leader=True),
    Route("POST", catalog_release.RETIRING_PATH, catalog_release.read_retiring, CLUSTER,
          "Which of `names` a replica of `group` holds retiring, and its fence (node to node: what group 0's "
          "leader checks a release against)", errors=(307, 404, 503), body=schemas.RETIRING,
          body_required=True, query=(("group", {"type": "integer", "minimum": 0}),)),
    Route("POST", connections.PATH, connections.leases, CLUSTER,
          "Hold, renew or release leases of principals' connections on group 0's leader, which counts each "
          "principal's connections for the cluster (node to node)", body=schemas.CONNECTION_LEASES,
          body_required=True, leader=True),
    Route("GET", "/v1/cluster/routing", cluster.routing, ANY_QUEUE,
          "Where each queue is served: every Raft group's members and leader, and queue -> group",
          errors=(404,), query=(("group", {"type": "integer", "minimum": 0}),)),
    Route("GET", "/v1/events", events.stream, METRICS, "Server-sent events: what the console shows",
          query=(("interval_ms", {"type": "integer", "minimum": 250, "maximum": 60_000}),)),
    Route("GET", "/v1/cluster/checkpoints/{token}", cluster.checkpoint, CLUSTER,
          "This replica's digest at a checkpoint (of group 0, or of `group`)", errors=(404,),
          query=(("group", {"type": "integer", "minimum": 0}),)),
    Route("GET", "/v1/queues", queues.list_all, ANY_QUEUE, "List queues (of every Raft group, or of `group`)",
          query=(CONSISTENCY, ("group", {"type": "integer", "minimum": 0})), leader=True),
    Route("PUT", Q, queues.create, ADMIN, "Create a queue", ok=(200, 201), errors=(409, 429, 507),
          body=schemas.QUEUE_CONFIG, leader=True),
    Route("PATCH", Q, queues.patch, ADMIN, "Change a queue's config", errors=(404,),
          body=schemas.QUEUE_CONFIG, body_required=True, leader=True),
    Route("GET", Q, queues.show, BROWSE, "A queue's config and stats", errors=(404,), query=(CONSISTENCY,),
          leader=True),
    Route("DELETE", Q, queues.delete, ADMIN, "Delete a queue", ok=(204,), errors=(404,), leader=True),
    Route("POST", Q + "/messages", messages.put, PUT, "Put messages", ok=(201, 202),
          errors=(404, 429, 507), body=schemas.PUT, body_required=True,
          query=(("durability", {"type": "string", "enum": ["quorum", "all", "leader"]}),
                 ("buffer", {"type": "string", "enum": ["allow"]})), leader=True),
    Route("GET", Q + "/messages", messages.browse, BROWSE, "Browse a group's messages without leasing",
          errors=(404,), query=(("group", schemas.NAME), ("from_seq", {"type": "integer", "minimum": 0}),
                                ("from_time_ms", {"type": "integer", "minimum": 0}),
                                ("limit", {"type": "integer", "minimum": 1, "maximum": 10_000}), CONSISTENCY),
          leader=True),
    Route("POST", Q + "/receive", messages.receive, RECEIVE, "Lease ready messages (long poll)",
          errors=(404, 429), body=schemas.RECEIVE, leader=True),
    Route("POST", Q + "/ack", messages.ack, RECEIVE, "Acknowledge leases", errors=(404, 409),
          body=schemas.RECEIPTS, body_required=True, leader=True),
    Route("POST", Q + "/nack", messages.nack, RECEIVE, "Give leases back", errors=(404, 409),
          body=schemas.RECEIPTS, body_required=True, leader=True),
    Route("POST", Q + "/extend", messages.extend, RECEIVE, "Extend leases", errors=(404, 409),
          body=schemas.RECEIPTS, body_required=True, leader=True),
    Route("GET", Q + "/groups", queues.list_groups, BROWSE, "List a queue's consumer groups", errors=(404,),
          query=(CONSISTENCY,), leader=True),
    Route("PUT", Q + "/groups/{group}", queues.add_group, RECEIVE, "Add a consumer group", ok=(200, 201),
          errors=(404, 409, 429), body=schemas.GROUP, leader=True),
    Route("GET", Q + "/groups/{group}", queues.show_group, BROWSE, "A consumer group's cursor and stats",
          errors=(404,), query=(CONSISTENCY,), leader=True),
    Route("PATCH", Q + "/groups/{group}", queues.patch_group, RECEIVE, "Pause, resume or rate-limit a consumer group",
          errors=(404, 409), body=schemas.PATCH_GROUP, body_required=True, leader=True),
    Route("DELETE", Q + "/groups/{group}", queues.delete_group, RECEIVE, "Delete a consumer group", ok=(204,),
          errors=(404, 409), leader=True),
    Route("POST", Q + "/groups/{group}/seek", queues.seek_group, RECEIVE, "Move a consumer group to a position: it "
          "replays the stored messages from there", errors=(404, 409), body=schemas.SEEK, body_required=True,
          leader=True),
    Route("POST", Q + "/groups/{group}/commit", messages.commit, RECEIVE, "Move a group's cursor",
          errors=(404,), body=schemas.COMMIT, body_required=True, leader=True),
    Route("POST", Q + "/redrive", queues.redrive, REDRIVE, "Move dead letters back to their queues",
          errors=(404, 409, 429), body=schemas.REDRIVE, leader=True),
    Route("POST", "/v1/tx", messages.transaction, (PUT, RECEIVE), "Acks and puts, all or nothing", ok=(200, 201),
          errors=(404, 409, 429, 507), body=schemas.TX, body_required=True, leader=True),
    Route("GET", "/v1/stream", stream.stream, (PUT, RECEIVE), "The streaming wire: a WebSocket of CBOR frames "
          "(docs/stream.md)", ok=(101,)),
    Route("GET", "/v1/producers", staging.list_all, PRODUCERS, "Producers with staged writes (Spark connector), of "
          "every Raft group or of `group`", query=(CONSISTENCY, ("group", {"type": "integer", "minimum": 0})), leader=True),
    Route("GET", P, staging.show, PRODUCERS, "One producer's stages and last committed batch", errors=(404,),
          leader=True),
    Route("DELETE", P, staging.delete, PRODUCERS, "Forget a producer's stages", ok=(204,), errors=(404,),
          leader=True),
    Route("POST", P + "/stage", staging.stage, PRODUCERS, "Stage messages for a later commit", ok=(200, 201),
          errors=(404, 409, 429, 507), body=schemas.ANY_OBJECT, body_required=True, leader=True),
    Route("POST", P + "/commit", staging.commit, PRODUCERS, "Publish staged messages at once, once per batch",
          ok=(200, 201), errors=(404, 409, 429, 507), body=schemas.ANY_OBJECT, body_required=True, leader=True),
    Route("POST", P + "/abort", staging.abort, PRODUCERS, "Drop staged messages", errors=(404, 409),
          body=schemas.ANY_OBJECT, body_required=True, leader=True),
    Route("GET", "/v1/sqs/keys", sqs_credentials.list_keys, CLUSTER, "The SQS API's keys: each one's access key id, "
          "role and where it is kept (never a secret)", query=(CONSISTENCY,), leader=True),
    Route("POST", "/v1/sqs/keys", sqs_credentials.add_key, CLUSTER, "Make an SQS key of `role`, kept by the cluster "
          "(its secret is in this answer only)", ok=(201,), errors=(409, 429), body=schemas.SQS_KEY,
          body_required=True, leader=True),
    Route("DELETE", "/v1/sqs/keys/{access_key}", sqs_credentials.remove_key, CLUSTER,
          "Remove an SQS key the cluster keeps", errors=(404, 409), leader=True),
    Route("GET", "/v1/principals", principal_routes.list_all, CLUSTER, "Every principal the cluster keeps: rules, "
          "quotas, SQS access keys (never a secret)", query=(CONSISTENCY,), leader=True),
    Route("POST", "/v1/principals", principal_routes.create, CLUSTER, "Make a principal: its token (and SQS key) "
          "are in this answer only", ok=(201,), errors=(409, 429), body=schemas.NEW_PRINCIPAL, body_required=True,
          leader=True),
    Route("GET", "/v1/audit", principal_routes.audit, CLUSTER, "Credential changes (as this node's replica of "
          "group 0 applied them) and the requests this node refused",
          query=(("limit", {"type": "integer", "minimum": 1, "maximum": 500}),)),
    Route("GET", PRINCIPAL_PATH, principal_routes.show, CLUSTER, "One principal", errors=(404,), leader=True),
    Route("PATCH", PRINCIPAL_PATH, principal_routes.change, CLUSTER, "Change a principal's rules or quotas, give it "
          "a new token or an SQS key (in this answer only)", errors=(404, 409, 429), body=schemas.PRINCIPAL_CHANGE,
          body_required=True, leader=True),
    Route("DELETE", PRINCIPAL_PATH, principal_routes.remove, CLUSTER, "Revoke a principal: every node refuses it "
          "within a second", ok=(204,), errors=(404,), leader=True),
    Route("GET", "/v1/whoami", principal_routes.whoami, AUTHENTICATED, "The caller's principal: its name, rules "
          "and quotas"),
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
