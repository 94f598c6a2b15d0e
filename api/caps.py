"""The node's caps on what clients may make: queues, groups per queue, the
dedup window, staged writes (docs/security.md).

A cap that depends on the state is checked where the state is: the leader
puts the limit into the command (``max_queues``, a stage's ``caps``,
``dedup_max_bytes``) and the state machine applies it, the same on every
replica, so replicas started with other options still agree, and commands in
flight together cannot pass a cap between them. A ``stage_commit`` names
stages, not queues: only the state knows which queues it would make.

The group count alone is still checked here, on the leader, against the
state it has applied: concurrent ``add_group`` calls may pass it by as many
as are in flight together.
"""

from statemachine.staging import DEFAULT_STAGE_TTL_MS

from .errors import ApiError

# Commands that may create queues: each carries the cluster's queue cap.
CREATING_QUEUES = frozenset({"create_queue", "put", "tx", "stage_commit"})


def _refuse(what: str, cap: int, option: str):
    raise ApiError("limit_reached", f"{what} (limit {cap}, the node option --{option})",
                   headers={"Retry-After": "60"})


def prepare(limits, command: dict) -> None:
    """The checks that need no state, and the limits the state machine applies."""
    op = command["op"]
    config = command.get("config")
    if op in ("create_queue", "patch_queue") and isinstance(config, dict) \
            and (config.get("dedup_window_ms") or 0) > limits.max_dedup_window_ms:
        raise ApiError("bad_request", f"dedup_window_ms may be at most {limits.max_dedup_window_ms} "
                                      "(the node option --max-dedup-window-ms)")
    if op in CREATING_QUEUES:
        command["max_queues"] = limits.max_queues
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


async def check(node, limits, command: dict) -> None:
    """Every cap a command must pass before it is submitted (``prepare``'s, and
    the group count, which needs the applied state read)."""
    prepare(limits, command)
    if command["op"] != "add_group":
        return
    name = command["queue"]
    groups = (await node.read("usage", [name])).result["named"][name]
    if groups is not None and groups >= limits.max_groups_per_queue:
        _refuse(f"queue {name!r} has {groups} groups", limits.max_groups_per_queue, "max-groups-per-queue")
