"""The node's caps on what clients may make: queues, groups per queue, the
dedup window, staged writes, the bytes of messages stored (docs/security.md).

A cap that depends on the state is checked where the state is: the leader
puts the limit into the command (``max_queues``, ``add_group``'s
``max_groups``, a stage's ``caps``, ``dedup_max_bytes``, ``max_stored_bytes``) and the state machine
applies it, the same on every replica, so replicas started with other options
still agree, and commands in flight together cannot pass a cap between them.
A ``stage_commit`` names stages, not queues: only the state knows which
queues it would make.
"""

from raftq.statemachine.staging import DEFAULT_STAGE_TTL_MS

from .errors import ApiError

# Commands that may create queues: each carries the cluster's queue cap.
CREATING_QUEUES = frozenset({"create_queue", "put", "tx", "stage_commit"})
# Commands that store messages: each carries its group's share of the cluster's stored bytes.
STORING = frozenset({"put", "tx", "stage_commit"})


def catalog_names_limit(limits, group_count: int) -> int:
    """How many queue names the catalog of `group_count` groups may hold: ``--max-queues``
    for each group. A name stays in the catalog after its queue is deleted (it keeps its
    group for good), so with several groups this bounds the names ever used."""
    return limits.max_queues * group_count


def stored_bytes_share(limits, group_count: int) -> int | None:
    """The bytes of messages each Raft group may store: an equal share of --max-stored-bytes (the
    groups' logs are independent, so only a share per group holds exactly however many writes
    are in flight in all of them); None: no cap."""
    return limits.max_stored_bytes // group_count if limits.max_stored_bytes else None


def prepare(limits, command: dict, group_count: int = 1) -> None:
    """The checks that need no state, and the limits the state machine applies (in a cluster of
    `group_count` Raft groups)."""
    op = command["op"]
    config = command.get("config")
    if op in ("create_queue", "patch_queue") and isinstance(config, dict) \
            and (config.get("dedup_window_ms") or 0) > limits.max_dedup_window_ms:
        raise ApiError("bad_request", f"dedup_window_ms may be at most {limits.max_dedup_window_ms} "
                                      "(the node option --max-dedup-window-ms)")
    if op in CREATING_QUEUES:
        command["max_queues"] = limits.max_queues
    if op in STORING and limits.max_stored_bytes:
        command["max_stored_bytes"] = stored_bytes_share(limits, group_count)
    if op == "add_group":
        command["max_groups"] = limits.max_groups_per_queue
    if op == "stage_commit":
        command["max_producers"] = limits.max_producers
    if op in ("put", "tx"):
        # The state machine forgets a queue's oldest ids beyond this; carried in
        # the command so that every replica forgets the same ones.
        command["dedup_max_bytes"] = limits.max_dedup_bytes
    if op == "stage":
        ttl_ms = command.get("ttl_ms")
        if ttl_ms is not None and ttl_ms > limits.max_stage_ttl_ms:
            raise ApiError("bad_request", f"ttl_ms may be at most {limits.max_stage_ttl_ms} "
                                          "(the node option --max-stage-ttl-ms)")
        command.setdefault("ttl_ms", min(DEFAULT_STAGE_TTL_MS, limits.max_stage_ttl_ms))
        command["caps"] = {"stages": limits.max_stages, "bytes": limits.max_staged_bytes,
                           "producer_stages": limits.max_stages_per_producer,
                           "producer_bytes": limits.max_staged_bytes_per_producer,
                           "producer_messages": limits.max_staged_messages_per_producer}

