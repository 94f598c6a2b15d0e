"""Which nodes hold each Raft group, and which of them should lead it. Pure:
the same node ids, group count and replica count give every node the same
answer, so no node has to ask another.

- Group 0, the catalog group, has every node as a member (it also holds queues).
- Groups 1..G-1 have R members each, taken in turn round the nodes, so each
  node holds within one of the mean number of replicas.
- Each group has a preference order of its members for leadership (its
  `members` tuple, first preferred). The first preferences spread ⌈G/N⌉ or
  ⌊G/N⌋ groups over each node; the second preference of the groups a node
  leads goes to whichever other member would then lead fewest, so that with
  that node down the first live preferences still spread evenly.

The engine's leader balancing (``engine.balance``) moves each group's
leadership to its first live, caught-up preference.

Growing or shrinking the cluster moves replicas (docs/architecture.md,
"Growing the cluster"): ``next_move`` plans the next one from the groups'
members as they stand and the nodes they should end on, ``moved`` applies
it, and ``ordered`` gives any groups' members an order of preference for
leadership, as ``place`` gives those it chose.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Placement:
    # members of each group, in order of preference for leadership
    groups: tuple[tuple[str, ...], ...]

    def members(self, group: int) -> tuple[str, ...]:
        return self.groups[group]

    def groups_of(self, node_id: str) -> list[int]:
        """The groups `node_id` is a member of, in order."""
        return [group for group, members in enumerate(self.groups) if node_id in members]

    def first_live(self, group: int, live: set[str]) -> str | None:
        """The member of `group` that should lead while only `live` nodes run."""
        return next((member for member in self.groups[group] if member in live), None)

    def held(self, nodes) -> dict[str, int]:
        """How many replicas of groups 1..G-1 each of `nodes` holds (every node holds group 0)."""
        return {node_id: sum(node_id in members for members in self.groups[1:]) for node_id in nodes}

    def leads(self, live: set[str]) -> dict[str, int]:
        """How many groups each live node should lead while only `live` nodes run."""
        counts = {node_id: 0 for node_id in sorted(live)}
        for group in range(len(self.groups)):
            leader = self.first_live(group, live)
            if leader is not None:
                counts[leader] += 1
        return counts


def place(node_ids: Sequence[str], groups: int, replicas: int) -> Placement:
    """The placement of `groups` groups over `node_ids` (in the cluster
    config's order), groups but group 0 with `replicas` members each.

    Two constructions, the first whose replicas spread within one:
    leadership first (each group's leader and stand-in chosen to spread,
    then the other members), else replicas first (members taken in turn
    round the nodes, then leaders and stand-ins among them). The first
    keeps the first live preferences within one with any one node down in
    every case measured; the second guarantees the replicas' spread, and
    the stand-ins' where every group has every node (replicas = N)."""
    nodes = list(node_ids)
    if not nodes or len(set(nodes)) != len(nodes):
        raise ValueError("placement needs distinct node ids")
    if groups < 1 or not 1 <= replicas <= len(nodes):
        raise ValueError("placement needs at least one group and 1 to N replicas")
    leaders_first = _leaders_first(nodes, groups, replicas)
    if _spread(leaders_first.held(nodes)) <= 1:
        return leaders_first
    return _replicas_first(nodes, groups, replicas)


def _spread(counts: dict[str, int]) -> int:
    return max(counts.values()) - min(counts.values())


def _leaders_first(nodes: list[str], groups: int, replicas: int) -> Placement:
    """Group g is led by node g mod N; its stand-in (second preference) is the
    other node that would then lead fewest were the leader down (water
    filling, ties: holding fewest replicas, then next round the nodes); the
    other members hold fewest replicas; a last pass moves a third-or-later
    preference from a node holding most to one holding fewest while it can."""
    count = len(nodes)
    rank = {node_id: i for i, node_id in enumerate(nodes)}
    leader = [nodes[group % count] for group in range(groups)]
    leads = {node_id: leader.count(node_id) for node_id in nodes}
    covered = {down: {node_id: 0 for node_id in nodes} for down in nodes}
    held = {node_id: 0 for node_id in nodes}
    member_lists = []
    for group in range(groups):
        first = leader[group]
        size = count if group == 0 else replicas

        def after(node_id: str, first=first) -> int:
            return (rank[node_id] - rank[first]) % count
        members = [first]
        if size >= 2:
            stand_in = min((n for n in nodes if n != first),
                           key=lambda n: (leads[n] + covered[first][n], held[n], after(n)))
            covered[first][stand_in] += 1
            members.append(stand_in)
        while len(members) < size:
            members.append(min((n for n in nodes if n not in members), key=lambda n: (held[n], after(n))))
        if group > 0:
            for node_id in members:
                held[node_id] += 1
        member_lists.append(members)
    while _spread(held) > 1:
        most, fewest = max(held, key=held.get), min(held, key=held.get)
        group = next((g for g in range(1, groups)
                      if most in member_lists[g][2:] and fewest not in member_lists[g]), None)
        if group is None:
            break
        members = member_lists[group]
        members[members.index(most)] = fewest
        held[most] -= 1
        held[fewest] += 1
    return Placement(groups=tuple(tuple(members) for members in member_lists))


def _replicas_first(nodes: list[str], groups: int, replicas: int) -> Placement:
    count = len(nodes)
    member_sets = [list(nodes)] + [[nodes[(k * replicas + j) % count] for j in range(replicas)]
                                   for k in range(groups - 1)]
    return ordered(nodes, member_sets)


def _first_preferences(nodes: list[str], member_sets: list[list[str]]) -> list[str]:
    """Each group's preferred leader, ⌈G/N⌉ or ⌊G/N⌋ groups per node. First
    each group takes the member leading fewest so far (groups with fewer
    members choose first, group 0, which may choose any node, last); then,
    while one node leads two more than another, leadership is shifted along
    a chain of groups (a group led by u with member v moves to v) from a
    node leading most to one leading fewest."""
    rank = {node_id: i for i, node_id in enumerate(nodes)}
    leads = {node_id: 0 for node_id in nodes}
    first: list[str] = [""] * len(member_sets)
    for group in sorted(range(len(member_sets)), key=lambda g: (len(member_sets[g]), -g)):
        choice = min(member_sets[group], key=lambda m: (leads[m], rank[m]))
        leads[choice] += 1
        first[group] = choice
    while max(leads.values()) - min(leads.values()) > 1:
        chain = _shift_chain(nodes, member_sets, first, leads)
        if chain is None:
            break
        for group, receiver in chain:
            leads[first[group]] -= 1
            leads[receiver] += 1
            first[group] = receiver
    return first


def _shift_chain(nodes, member_sets, first, leads) -> list[tuple[int, str]] | None:
    """Breadth first from the nodes leading most: the moves (group, new
    leader) that end at a node leading at least two fewer; None if none does."""
    most = max(leads.values())
    came_from: dict[str, tuple[int, str] | None] = {n: None for n in nodes if leads[n] == most}
    frontier = list(came_from)
    while frontier:
        following = []
        for node_id in frontier:
            for group, members in enumerate(member_sets):
                if first[group] != node_id:
                    continue
                for member in members:
                    if member in came_from:
                        continue
                    came_from[member] = (group, node_id)
                    if leads[member] <= most - 2:
                        chain, at = [], member
                        while came_from[at] is not None:
                            group_moved, giver = came_from[at]
                            chain.append((group_moved, at))
                            at = giver
                        return chain
                    following.append(member)
        frontier = following
    return None


def _second_preferences(nodes: list[str], member_sets: list[list[str]], first: list[str]) -> list[str | None]:
    """For the groups each node leads: who takes over when it is down. Each
    goes to the member that would then lead fewest (water filling), groups
    with the fewest choices first."""
    leads = {node_id: first.count(node_id) for node_id in nodes}
    rank = {node_id: i for i, node_id in enumerate(nodes)}
    second: list[str | None] = [None] * len(member_sets)
    for down in nodes:
        extra = {node_id: 0 for node_id in nodes}
        led = [g for g in range(len(member_sets)) if first[g] == down]
        for group in sorted(led, key=lambda g: (len(member_sets[g]), -g)):
            others = [m for m in member_sets[group] if m != down]
            if not others:
                continue
            choice = min(others, key=lambda m: (leads[m] + extra[m], rank[m]))
            extra[choice] += 1
            second[group] = choice
    return second


def for_cluster(cluster) -> Placement:
    """The placement of an ``engine.config.ClusterConfig``."""
    return place([spec.id for spec in cluster.nodes], cluster.groups, cluster.replicas_per_group)


# ---- moving replicas (issue 24, growing the cluster) ------------------------------------

@dataclass(frozen=True)
class Move:
    """One replica of `group` moves from `source` to `target`: add `target` to
    the group (it catches up by snapshot and log), then remove `source`. One
    at a time, so a group never has fewer than its R members caught up."""
    group: int
    source: str
    target: str


def next_move(node_ids: Sequence[str], members: Sequence[Sequence[str]]) -> Move | None:
    """The next replica to move so that groups 1..G-1 (`members[g]`, group 0
    ignored: it spans every node through its own membership change) end on
    `node_ids` only, spread within one replica per node; None when they are.

    First a replica on a node that is no longer in `node_ids` (a node being
    removed), to the node in `node_ids` holding fewest; then, while one node
    holds two more than another, one from a node holding most to one holding
    fewest. Each move takes the lowest group that allows it, ties between
    nodes go to the earlier in `node_ids`: the same question gets the same
    answer on every node. Growing (every node kept), no node both gains and
    loses a replica, so no move is wasted; a node leaving may force one
    (its group holds every node below its share), and measured over up to 8
    nodes, 32 groups and any replicas the moves are at most 1.5 times the
    replicas that change node."""
    nodes = list(node_ids)
    if not nodes or len(set(nodes)) != len(nodes):
        raise ValueError("moving replicas needs distinct node ids")
    for group, group_members in enumerate(members[1:], start=1):
        if len(group_members) > len(nodes):
            raise ValueError(f"group {group} has {len(group_members)} members; {len(nodes)} nodes cannot hold it")
    rank = {node_id: i for i, node_id in enumerate(nodes)}
    held = {node_id: 0 for node_id in nodes}
    for group_members in members[1:]:
        for member in group_members:
            if member in held:
                held[member] += 1

    def fewest_outside(group_members) -> str:
        return min((n for n in nodes if n not in group_members), key=lambda n: (held[n], rank[n]))
    evacuations = [Move(group, member, fewest_outside(group_members))
                   for group, group_members in enumerate(members[1:], start=1)
                   for member in group_members if member not in held]
    if evacuations:
        return min(evacuations, key=lambda move: (held[move.target], rank[move.target], move.group))
    most = max(nodes, key=lambda n: (held[n], -rank[n]))
    fewest = min(nodes, key=lambda n: (held[n], rank[n]))
    if held[most] - held[fewest] <= 1:
        return None
    # most holds more replicas than fewest, so some group has the one and not the other
    group = next(g for g in range(1, len(members)) if most in members[g] and fewest not in members[g])
    return Move(group, most, fewest)


def moved(members: Sequence[Sequence[str]], move: Move) -> list[tuple[str, ...]]:
    """`members` once `move` is done (the target takes the source's place)."""
    after = [tuple(group_members) for group_members in members]
    after[move.group] = tuple(move.target if member == move.source else member for member in after[move.group])
    return after


def ordered(node_ids: Sequence[str], members: Sequence[Sequence[str]]) -> Placement:
    """The placement of groups whose members are given (`members[0]` is
    group 0's: every node), each group's members put in an order of
    preference for leadership that spreads leaders over `node_ids` as
    ``place`` does with the members it chose itself."""
    nodes = list(node_ids)
    member_sets = [list(group_members) for group_members in members]
    first = _first_preferences(nodes, member_sets)
    second = _second_preferences(nodes, member_sets, first)
    groups = []
    for group, group_members in enumerate(member_sets):
        head = [first[group]] + ([second[group]] if second[group] is not None else [])
        groups.append(tuple(head + [m for m in group_members if m not in head]))
    return Placement(groups=tuple(groups))
