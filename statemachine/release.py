"""Letting the names of deleted queues leave the catalog, safely (issue 24).

With several Raft groups, group 0's catalog places each queue name in one
group, and routers (fronts' caches, group-0 replicas that lag, buffered
puts replayed later) act on views of it that may be old. A name can leave
the catalog only if no such view can then make its queue in its old group
while the catalog places it elsewhere. Each group's machine holds a
``NameRelease`` that fences them off:

1. ``retire``: a name deleted here (or placed here but never made: a
   creation the group refused, a dead-letter queue never needed), absent,
   named by no queue's ``dead_letter`` here and by no held stage, becomes
   *retiring*: from this entry on, no command makes it here;
2. group 0 releases it from the catalog (``Catalog.release``) in its log
   entry W;
3. ``released(W)``: the name stops retiring and the group's *fence* rises
   to W: a command that would make a queue here must carry the
   ``catalog_index`` of the view that routed it (the index of group 0's log
   that view was read at), at least W, so only a view that saw the release
   makes one, and such a view either lacks the name or holds its new
   placement. Log indexes are the same on every replica, so the fence is.

Group 0 takes a group's releases in turn (``Catalog.release``): the next
only once the group's fence, as the releaser read it with the names, has
reached the last, and each finishes once, so a releaser that stalled
between its steps releases nothing stale.

Group 0's leader releases only what a group retired (``release_refusal``):
the names and fence a release names must be the group's, as some replica
of it read them. A release by hand of a live queue's name would otherwise
let a router make that queue in a second group.

A command refused by the fence changed nothing: its router looks at the
catalog again and sends it where it now belongs.
"""

import itertools

from .results import WRONG_GROUP, error


class NameRelease:
    def __init__(self, group_id: int):
        self.group_id = group_id
        self.deleted: dict[str, None] = {}    # queues deleted here, neither made again nor retiring
        self.retiring: set[str] = set()
        self.fence = 0                         # group 0's log index a creating view must have read at

    def note_deleted(self, name: str) -> None:
        self.deleted[name] = None

    def note_created(self, name: str) -> None:
        self.deleted.pop(name, None)

    def refusal(self, name: str, catalog_index: int) -> dict | None:
        """Why a command routed by a view of the catalog at group 0's `catalog_index` may not make
        queue `name` here; None if it may."""
        if name in self.retiring:
            return error(WRONG_GROUP, f"queue name {name!r} is leaving group {self.group_id}'s part of the "
                                      "catalog: ask the catalog again", group=self.group_id, fence=self.fence,
                         queue=name)
        if catalog_index < self.fence:
            return error(WRONG_GROUP, f"the command was routed by the catalog at index {catalog_index}; group "
                                      f"{self.group_id} takes new queues from views at {self.fence} on: ask "
                                      "the catalog again", group=self.group_id, fence=self.fence, queue=name)
        return None

    def retire(self, names: list, held) -> list:
        """The names of `names` that may leave the catalog (none of them in `held`, the names
        this group holds or refers to), now retiring. A name need not have been a queue here:
        the catalog may have placed it for a creation this group refused, or for a dead-letter
        queue never made; the fence guards those alike."""
        retiring = [name for name in dict.fromkeys(names) if name not in held and name not in self.retiring]
        for name in retiring:
            self.deleted.pop(name, None)
            self.retiring.add(name)
        return retiring

    def released(self, names: list, index: int, in_turn: bool = False) -> bool:
        """Group 0 released `names` (those it held for this group) in its entry `index`; whether
        that finished it here. A release taken in turn (``Catalog.release``) finishes once: a
        late finish of one the fence has passed would let names retiring again since go
        while group 0 still places them here."""
        if in_turn and index <= self.fence:
            return False
        self.retiring.difference_update(names)
        self.fence = max(self.fence, index)
        return True

    def waiting(self, limit: int, held) -> list:
        """Up to `limit` names deleted here and not in `held`, oldest first: what a releaser
        retires next."""
        return list(itertools.islice((name for name in self.deleted if name not in held), limit))

    def to_state(self) -> list:
        return [list(self.deleted), sorted(self.retiring), self.fence]

    @classmethod
    def from_state(cls, group_id: int, state: list | None) -> "NameRelease":
        release = cls(group_id)
        if state is not None:
            deleted, retiring, release.fence = state
            release.deleted = dict.fromkeys(deleted)
            release.retiring = set(retiring)
        return release


def release_refusal(group: int, names: list, fence: int, seen: dict) -> str | None:
    """Why group 0 may not release `names` for `group` at `fence`, given `seen`, the group's
    ``names_retiring`` read of them on one of its replicas; None when it may.

    Only names retiring in a state of the group, with the fence of that same state, may go.
    Any replica's applied state will do, however far behind: a release since that state is
    in group 0's log at an index above its fence, so ``Catalog.release`` answers with that one,
    unfinished, rather than release names made again since."""
    missing = sorted(set(names) - set(seen["names"]))
    if missing:
        return f"group {group} has not retired {', '.join(map(repr, missing[:5]))}" + \
            (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    if seen["fence"] != fence:
        return f"group {group} retired them at fence {seen['fence']}, not {fence}"
    return None
