"""The quotas of principals that the state machine holds exactly: queues, and the bytes they store.

A command of a principal carries its name (``principal``) and its quotas as its front read them
(``quotas``; api/principals.py); a queue belongs to the principal whose command created it (a
dead-letter queue that a move creates, to its source's owner), and the machine remembers each
principal's quotas as its latest successful command here carried them (``carried``).

- **queues**: the queues a principal owns. With one Raft group the group's machine counts them;
  with several, group 0's catalog counts the names each principal placed (``names``, at
  ``assign``, which every new name of the cluster passes), so the count is the cluster's
  whichever groups the queues live in. A name counts until the catalog lets it go (seconds
  after its queue is deleted: docs/api.md, "Raft groups and routing").
- **stored_bytes**: the bytes the queues a principal owns store. Each group holds an equal
  share (``share``) of it for the queues it holds: the groups' logs are independent, so only
  a share per group holds exactly however many writes are in flight in all of them. A put
  into a queue is held to its owner's quota: the putter's own as its command carries it, or,
  into another principal's queue, the owner's as the owner's latest command here carried it.
  Only what a put adds counts (Queue.growth: a retried id adds nothing); moves inside a group
  (dead letters, redrives) are never refused.

Refusals are ``quota_exceeded`` naming the principal and the quota; nothing is changed.
"""

from __future__ import annotations

from .queue import Queue
from .results import QUOTA_EXCEEDED, error
from .validation import full_config


def share(total: int, group_count: int, group_id: int) -> int:
    """Group `group_id`'s share of a whole quota of `total` split over `group_count` groups: the
    shares add up to exactly `total` (the first ``total % group_count`` groups hold one more)."""
    return total // group_count + (1 if group_id < total % group_count else 0)


class Ownership:
    """name -> the principal owning it, and each principal's names (derived)."""

    def __init__(self):
        self.owners: dict[str, str] = {}
        self.owned: dict[str, set] = {}

    def own(self, name: str, principal: str | None) -> None:
        if principal is None or name in self.owners:
            return
        self.owners[name] = principal
        self.owned.setdefault(principal, set()).add(name)

    def forget(self, name: str) -> None:
        principal = self.owners.pop(name, None)
        if principal is not None:
            names = self.owned[principal]
            names.discard(name)
            if not names:
                del self.owned[principal]

    def count(self, principal: str | None) -> int:
        return len(self.owned.get(principal, ()))

    def to_state(self) -> list:
        return list(self.owners.items())

    @classmethod
    def from_state(cls, state) -> "Ownership":
        ownership = cls()
        for name, principal in state or ():
            ownership.own(name, principal)
        return ownership


class Quotas:
    def __init__(self):
        self.queues = Ownership()        # this group's queues
        self.names = Ownership()         # group 0's catalog names (several groups)
        self.carried: dict[str, dict] = {}

    def note(self, cmd: dict) -> None:
        """After a command applied: its principal's quotas, as it carried them."""
        principal = cmd.get("principal")
        if principal is not None and "quotas" in cmd:
            if cmd["quotas"]:
                self.carried[principal] = cmd["quotas"]
            else:
                self.carried.pop(principal, None)

    def of(self, principal: str | None, cmd: dict) -> dict:
        if principal is not None and principal == cmd.get("principal"):
            return cmd.get("quotas") or {}
        return self.carried.get(principal, {})

    def room_for_queues(self, ownership: Ownership, new: int, cmd: dict) -> dict | None:
        """None unless the command's principal would own more queues (names) than its quota."""
        principal = cmd.get("principal")
        limit = (cmd.get("quotas") or {}).get("queues")
        if new and limit is not None and ownership.count(principal) + new > limit:
            return _exceeded(principal, "queues", limit,
                             f"principal {principal!r} owns {ownership.count(principal)} queues and this would "
                             f"create {new} more (its queues quota is {limit})")
        return None

    def room_for_bytes(self, machine, batches: dict, cmd: dict) -> dict | None:
        """None unless the puts `batches` (queue -> messages) would grow the bytes an owner's
        queues in this group store past the owner's share of its stored_bytes quota."""
        growth: dict[str, int] = {}
        for name, messages in batches.items():
            owner = self.queues.owners.get(name) if name in machine.queues else cmd.get("principal")
            if owner is None or self.of(owner, cmd).get("stored_bytes") is None:
                continue
            queue = machine.queues.get(name) or Queue(name, full_config({}), 0)
            growth[owner] = growth.get(owner, 0) + queue.growth(messages)
        for owner, added in growth.items():
            limit = self.of(owner, cmd)["stored_bytes"]
            held = share(limit, machine.group_count, machine.group_id)
            stored = sum(machine.queues[name].rows.bytes for name in self.queues.owned.get(owner, ()))
            if added > 0 and stored + added > held:
                where = "" if machine.group_count == 1 else \
                    f" (Raft group {machine.group_id}'s share of {limit}: each of {machine.group_count} groups holds one)"
                return _exceeded(owner, "stored_bytes", held,
                                 f"the queues of principal {owner!r} store {stored} bytes and this would add {added} "
                                 f"(its stored_bytes quota is {held}{where}): nothing was stored")
        return None

    def to_state(self) -> dict:
        return {"queues": self.queues.to_state(), "names": self.names.to_state(),
                "carried": [[principal, quotas] for principal, quotas in self.carried.items()]}

    @classmethod
    def from_state(cls, state: dict | None) -> "Quotas":
        quotas = cls()
        if state is not None:
            quotas.queues = Ownership.from_state(state["queues"])
            quotas.names = Ownership.from_state(state["names"])
            quotas.carried = {principal: carried for principal, carried in state["carried"]}
        return quotas


def _exceeded(principal: str | None, quota: str, limit: int, message: str) -> dict:
    return error(QUOTA_EXCEEDED, message, principal=principal, quota=quota, limit=limit)
