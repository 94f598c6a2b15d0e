"""The checker: judges a chaos history (chaos/history.py) against raftq's promises.

Theory of operation
-------------------
Clients see only real time: an operation took effect at some instant between
its invocation and its completion, and an `info` operation may have taken
effect at any instant after its invocation, or never. Every property below is
stated so that it is violated only when *no* choice of such instants explains
what the clients saw; a report of a violation is therefore a proof, never a
suspicion, and a quiet checker is evidence in proportion to the faults the run
went through.

Leases need one more fact, which raftq promises (docs/guarantees.md, "Log
time"): log time never runs faster than real time, so a lease of `lease_ms`
granted by a receive invoked at real time t holds at least until t + lease_ms,
unless the holder ends it sooner (a nack; an ack ends it for good). A node whose clock runs fast or jumps would break exactly this, and the
double-lease check is how that shows.

Properties (each gets a verdict; the run is valid only if all hold):
- acked_puts_delivered: every put answered ok is received, in every group of
  its queue, by the workload or by the drain after healing (no loss); and no
  message is received that no put attempted, or whose every attempt certainly
  failed.
- no_double_lease: two deliveries of one message in one group never
  overlap: one lease must be able to end (lease_ms after its receive was
  invoked, or at a nack of it) before the other could have begun.
- ack_needs_live_lease: an ack succeeds only while its lease lives. It is dead
  once another delivery of the message has completed after this one, once its
  own nack succeeded, or once an earlier ack of it succeeded.
- acks_durable: a message whose ack succeeded in a group is never handed out
  to that group again by a receive invoked after the ack's answer.
- per_producer_order: one producer's successive puts to a queue get growing
  seqs, and in a group their first deliveries (deliveries == 1) come in put
  order, priorities aside: a later message of the same or a lower priority
  (a put's `priority`, 0 when it gives none) is not handed out for the first
  time strictly before an earlier one, still never delivered, was. A later
  message of a higher priority may go first: that is what priorities are for.
- backoff_respected: in a queue with a back-off policy (the setup's
  `backoff`, without jitter: the workload's), the (n+1)-th delivery of a
  message in a group comes no sooner than the policy's delay after the n-th
  could have ended (its lease's end, lease_ms after its receive was invoked,
  or a nack of it): its receive completes at least min(max_ms, initial_ms ×
  factor^(n−1)) after that. Log time never runs faster than real time, and
  the delay runs on log time from the delivery's end, so a redelivery sooner
  in real time is a delay cut short.
- idempotent_once: a put id maps to one seq, however often it was retried.
- replicas_agree: after healing, POST /v1/cluster/verify and
  `raftq cluster verify` both find every replica at one digest.
- log_time_not_ahead: log time (the state machine's clock, which leases,
  delays and dedup windows are measured in) never advances faster than real
  time. Sampled through put_at_ms: for puts A and B, A answered before B was
  sent, put_at(B) - put_at(A) <= B's completion - A's invocation. The design
  promises it ("a clock jump cannot expire leases early"); when it breaks,
  double leases follow, and this names the moment and the serving node.
- log_time_not_behind_at_birth: a brand-new cluster's log time starts from
  real time, not from 0: no put acknowledged before the first fault is
  stamped more than BIRTH_SLACK_MS before the instant it was sent (read from
  the wall clock the history was started at, `wall_ms_at_t0` in the setup).
  Faults are left out because log time rightly pauses while a cluster has no
  leader. A put stamped from 0 would carry a TTL, lease or dedup window that
  ended the moment log time caught up with the wall clock.
- no_stale_reads: a `consistency=leader` or `strong` read (queue stats or
  browse) that was invoked after a put to its queue was acknowledged reflects
  it: the read's `last_seq` is at least that put's seq. An isolated leader
  that kept answering after a new leader acknowledged writes would break it;
  the nemesis asks isolated leaders for reads until they refuse.
- log_never_shrinks: no node's log ends below an index it had committed, or
  that the leader had counted as acknowledged by it and committed (sampled
  from /health/ready and /v1/cluster), and no node logs that a conflict
  truncated applied entries. One exception, which raftq promises instead
  (docs/guarantees.md, "Storage faults"): a node that found damage at
  start-up gives up the damaged entry and those after it up to the highest
  index it shows it held durably (its own snapshot damaged: from entry 1),
  and says so (its log line, `GIVE_UP`),
  and neither votes nor stands until its log holds that index again; its
  log may then end anywhere from the entry before the damage on, below any
  floor up to that index, from the moment it said so.
- nodes_never_fail: no node process exits unless the nemesis stopped it, and
  none logs a CRITICAL line (raftq logs CRITICAL only for broken invariants),
  but for the line each sync the nemesis made fail obliges it to log (the
  fault's `sync_failed`: a failed fsync is fatal, and says so).
- bodies_as_put: no body served differs from what was put. Every body a
  receive served (the workload's and the drain's) is the body of the put of
  its message: the put acknowledged with its seq, or else the puts attempted
  with the id the body names; and the backlog read back has no changed body.
  A flipped byte served as if it were good (bit rot, a misdirected write,
  a record read without its checksum) breaks it.
- writes_resume: after each fault ends, a put sent to each Raft group after
  the end is acknowledged within WRITES_RESUME_S (the nemesis probes every
  group right after each fault, so there is always one to judge). A leader
  wedged by what it cannot read, a disk alarm that never clears, an engine
  never started again would break it. The time each fault took is reported.
- leaders_rebalanced: after each fault ends (the nemesis healed it and every
  node is back), every Raft group has a leader and the nodes' counts of
  groups led differ by at most one, within REBALANCE_S. Judged from the
  monitor's /health/ready samples of every node, each taken after the end:
  a group's leader is the member claiming it in the highest term, and the
  counts are over the nodes that answered. With one group this is "a leader
  again within REBALANCE_S"; with several it is the leader balancing of
  issue 24 (each group's leader hands over to its first live preference).
  The time each fault took is reported.
- queue_in_one_group: with several Raft groups, a churner makes and deletes
  queues of a few names all through the faults, so their names leave the
  catalog and come back placed anew; once the faults are over each of them
  is in one group, the one the catalog places it in, or in none with its
  name gone from the catalog (read from every group's list and the
  catalog, asked again for up to a minute while the releaser finishes). A
  queue in two groups, or one the catalog forgot, would fail it. With one
  group there is no catalog and no churner.

Measurements (reported, never judged): failover after a leader is killed,
isolated, paused or terminated, for each Raft group it led (from the instant
the fault was applied to the first acknowledged put to one of that group's
queues sent after it had taken effect), and per group;
how soon an isolated leader refuses writes; time to replace a slow leader;
put latency under a slow follower against fault-free windows.
"""

from __future__ import annotations

import bisect
import json
import re
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

from chaos.history import Op, ops as pair_ops

EXAMPLES = 5
FAILOVER_MARKS = ("kill", "isolate")  # what the headline failover figures cover
REFUSALS = (307, 503)
TRUNCATION_MARKERS = ("truncates applied entries", "truncating already-applied")
# What a node logs when it gives up entries to damage found at start-up (engine/storage/journal.py;
# engine/raft/node.py when it is its own snapshot):
# the entries, and the index it must hold again before it votes
GIVE_UP = re.compile(r"This node gives up entries (\d+) to (\d+) and takes them again from the leader")
STALE_READER = "stale-read"  # the process names of reads sent to an isolated leader
CLOCK_RESOLUTION_MS = 2  # put_at_ms is whole milliseconds; history times are rounded to microseconds
BIRTH_SLACK_MS = 1000
REBALANCE_S = 5.0   # leaders spread again (max - min <= 1) within this long of a fault's end
WRITES_RESUME_S = 10.0   # a write acknowledged in every Raft group within this long of a fault's end
# What a node logs, CRITICAL, when a sync fails (engine/storage/records.py, `fatal`): obliged to, not a bug
SYNC_FAILURE_MARKER = "this process stops, to recover from what is on disk"
UNRECORDED = object()   # a delivery whose body the history does not hold (an older history)


def placed_alone(where: dict) -> bool:
    """A churn queue held by the group the catalog places it in alone, or by none and unplaced."""
    return where["groups"] == ([] if where["catalog"] is None else [where["catalog"]])


@dataclass
class Verdict:
    name: str
    ok: bool
    violations: int = 0
    detail: str = ""
    examples: list = field(default_factory=list)

    def line(self) -> str:
        status = "PASS" if self.ok else "FAIL"
        return f"{status}  {self.name:<22} {self.detail}"


@dataclass
class Delivery:
    queue: str
    group: str
    seq: int
    receipt: str
    id: str | None
    deliveries: int
    lease_ms: int
    op: Op
    put_at_ms: int | None = None
    body: Any = UNRECORDED


@dataclass
class Report:
    verdicts: list[Verdict]
    summary: dict[str, Any]

    @property
    def valid(self) -> bool:
        return all(v.ok for v in self.verdicts)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def replicas_agree_in(result: dict) -> bool:
    """Whether a POST /v1/cluster/verify answer shows, in each Raft group, every replica's digest
    and all of them one: judged from the digests, not from the answer's own verdict."""
    return all(None not in answer["digests"].values() and len(set(answer["digests"].values())) == 1
               for answer in result.get("groups", [result]))


def group_states(view: dict) -> dict[int, dict]:
    """A node's /health/ready answer: its state of each Raft group it serves (role, term)."""
    if view.get("raft_groups"):
        return {int(group): state for group, state in view["raft_groups"].items()}
    return {0: {"role": view.get("role"), "term": view.get("term")}}   # a node of one group


def leaders(views: dict[str, dict]) -> dict[int, str]:
    """Raft group -> its leader, from the nodes' /health/ready answers: the node that
    claims it in the highest term (a leader cut off may still claim an older one)."""
    best: dict[int, tuple[int, str]] = {}
    for node, view in views.items():
        for group, state in group_states(view).items():
            term = state.get("term") or 0
            if state.get("role") == "leader" and (group not in best or term > best[group][0]):
                best[group] = (term, node)
    return {group: node for group, (_, node) in best.items()}


def leads(views: dict[str, dict], raft_groups: int) -> dict[str, int] | None:
    """How many Raft groups each answering node leads; None while a group has no leader."""
    led = leaders(views)
    if any(group not in led for group in range(raft_groups)):
        return None
    counts = {node: 0 for node in views}
    for node in led.values():
        counts[node] += 1
    return counts


def balanced(views: dict[str, dict], raft_groups: int) -> bool:
    """Every group led, and the answering nodes lead within one of each other (issue 24)."""
    counts = leads(views, raft_groups)
    return counts is not None and max(counts.values()) - min(counts.values()) <= 1


def _ahead_of_real_time(samples: list[tuple[Op, int]]) -> list[dict]:
    """Puts of one log time stamped further ahead of an earlier put than real time allows."""
    # B is ahead of A when put_at(B) - 1000*B.complete > put_at(A) - 1000*A.invoke
    # for an A answered before B was sent: keep the smallest right-hand side so far.
    by_complete = sorted(samples, key=lambda s: s[0].complete_t)
    earliest: tuple[float, Op, int] | None = None
    known = 0
    bad = []
    for b, at_b in sorted(samples, key=lambda s: s[0].invoke_t):
        while known < len(by_complete) and by_complete[known][0].complete_t < b.invoke_t:
            a, at_a = by_complete[known]
            known += 1
            slack = at_a - 1000 * a.invoke_t
            if earliest is None or slack < earliest[0]:
                earliest = (slack, a, at_a)
        if earliest is None:
            continue
        ahead = at_b - 1000 * b.complete_t - earliest[0]
        if ahead > CLOCK_RESOLUTION_MS:
            a, at_a = earliest[1], earliest[2]
            bad.append({"ahead_ms": round(ahead), "earlier_put": {"id": a.value["id"], "node": a.node,
                                                                  "invoke_t": a.invoke_t, "put_at_ms": at_a},
                        "later_put": {"id": b.value["id"], "node": b.node, "invoke_t": b.invoke_t,
                                      "complete_t": b.complete_t, "put_at_ms": at_b}})
    return bad


class Checker:
    def __init__(self, events: Iterable[dict]):
        self.events = list(events)
        self.ops = pair_ops(self.events)
        setups = [e for e in self.events if e["type"] == "setup"]
        self.setup = setups[-1] if setups else {"queues": {}}
        self.groups: dict[str, list[str]] = self.setup.get("queues", {})
        self.by_f: dict[str, list[Op]] = defaultdict(list)
        for o in self.ops:
            self.by_f[o.f].append(o)
        self.puts = self.by_f["put"]
        self.deliveries = self._deliveries()
        self.by_message: dict[tuple, list[Delivery]] = defaultdict(list)
        # by (queue, receipt): each Raft group's state machine makes its own receipts
        self.by_receipt: dict[tuple[str, str], Delivery] = {}
        for d in self.deliveries:
            self.by_message[(d.queue, d.group, d.seq)].append(d)
            self.by_receipt[(d.queue, d.receipt)] = d
        self.settled = self._settlements()
        self.nemesis = [e for e in self.events if e["type"] == "nemesis"]
        routings = [e for e in self.events if e["type"] == "routing"]
        # queue -> Raft group, as the cluster assigned them (a history of one group has none)
        self.raft_group_of: dict[str, int] = routings[-1]["queues"] if routings else {}
        self.raft_groups: int = self.setup.get("raft_groups", 1)
        self.give_ups = self._give_ups()

    # ---- derived views ---------------------------------------------------------------
    def _deliveries(self) -> list[Delivery]:
        out = []
        for o in self.by_f["receive"]:
            if not o.ok:
                continue
            v = o.value
            for m in o.result.get("messages", []):
                out.append(Delivery(v["queue"], v["group"], m["seq"], m["receipt"], m.get("id"),
                                    m.get("deliveries", 1), v["lease_ms"], o, m.get("put_at_ms"),
                                    m["body"] if "body" in m else UNRECORDED))
        return out

    def _settlements(self) -> dict[tuple[str, str], dict[str, list[Op]]]:
        """(queue, receipt) -> {"ack"|"nack": [ops that may have applied to it], "ack_ok"|"nack_ok": [...]}."""
        out: dict[tuple[str, str], dict[str, list[Op]]] = defaultdict(lambda: defaultdict(list))
        for f in ("ack", "nack"):
            for o in self.by_f[f]:
                stale = set((o.result or {}).get("stale", [])) if o.ok else set()
                for r in o.value["receipts"]:
                    if o.type == "info" or (o.ok and r not in stale):
                        out[(o.value["queue"], r)][f].append(o)
                    if o.ok and r not in stale:
                        out[(o.value["queue"], r)][f + "_ok"].append(o)
        return out

    # ---- properties ----------------------------------------------------------------------
    def acked_puts_delivered(self) -> tuple[Verdict, list[dict]]:
        attempted: dict[tuple, list[Op]] = defaultdict(list)
        for o in self.puts:
            attempted[(o.value["queue"], o.value["id"])].append(o)
        acked = {k for k, attempts in attempted.items() if any(a.ok for a in attempts)}
        received = {(d.queue, d.group, d.id) for d in self.deliveries}
        lost = []
        for queue, mid in sorted(acked):
            missing = [g for g in self.groups.get(queue, ["default"]) if (queue, g, mid) not in received]
            if missing:
                lost.append({"queue": queue, "id": mid, "groups": missing})
        phantom = []
        for d in self.deliveries:
            attempts = attempted.get((d.queue, d.id))
            if not attempts:
                phantom.append({"queue": d.queue, "id": d.id, "seq": d.seq, "why": "never put"})
            elif all(a.type == "fail" for a in attempts):
                phantom.append({"queue": d.queue, "id": d.id, "seq": d.seq, "why": "every put failed"})
        drains = [e for e in self.events if e["type"] == "note" and e.get("what") == "drain"]
        drained = bool(drains) and all(e.get("complete") for e in drains)
        detail = (f"{len(acked)} acked puts, {len(lost)} lost, {len(phantom)} phantom deliveries"
                  + ("" if drained else "; queues NOT fully drained after healing"))
        v = Verdict("acked_puts_delivered", not lost and not phantom, len(lost) + len(phantom), detail,
                    (lost + phantom)[:EXAMPLES])
        return v, lost

    def _lease_end_lower_bound(self, d: Delivery) -> float:
        """The earliest real time this delivery's lease could have ended."""
        end = d.op.invoke_t + d.lease_ms / 1000
        for nack in self.settled.get((d.queue, d.receipt), {}).get("nack", []):
            end = min(end, nack.invoke_t)
        return end

    def no_double_lease(self) -> Verdict:
        bad = []
        for (queue, group, seq), ds in self.by_message.items():
            for i, a in enumerate(ds):
                for b in ds[i + 1:]:
                    a_then_b = a.op.invoke_t < b.op.complete_t and b.op.complete_t >= self._lease_end_lower_bound(a)
                    b_then_a = b.op.invoke_t < a.op.complete_t and a.op.complete_t >= self._lease_end_lower_bound(b)
                    if not (a_then_b or b_then_a):
                        bad.append({"queue": queue, "group": group, "seq": seq,
                                    "first": self._describe(a), "second": self._describe(b)})
        return Verdict("no_double_lease", not bad, len(bad),
                       f"{len(self.deliveries)} deliveries, {len(bad)} overlapping lease pairs", bad[:EXAMPLES])

    @staticmethod
    def _describe(d: Delivery) -> dict:
        return {"receipt": d.receipt, "process": d.op.process, "invoke_t": d.op.invoke_t,
                "complete_t": d.op.complete_t, "lease_ms": d.lease_ms, "deliveries": d.deliveries}

    def ack_needs_live_lease(self) -> Verdict:
        bad = []
        checked = 0
        for (queue, receipt), settled in self.settled.items():
            a = self.by_receipt.get((queue, receipt))
            if a is None:
                continue
            others = [b for b in self.by_message[(a.queue, a.group, a.seq)] if b.receipt != receipt]
            for ack in settled.get("ack_ok", []):
                checked += 1
                why = None
                for b in others:
                    if a.op.complete_t < b.op.invoke_t and b.op.complete_t < ack.invoke_t:
                        why = f"redelivered to {b.op.process} before the ack was sent"
                for nack in settled.get("nack_ok", []):
                    if nack.complete_t < ack.invoke_t:
                        why = "its own nack had already succeeded"
                for earlier in settled["ack_ok"]:
                    if earlier is not ack and earlier.complete_t < ack.invoke_t:
                        why = "an earlier ack of the same receipt had already succeeded"
                if why:
                    bad.append({"queue": queue, "receipt": receipt, "ack_op": ack.op, "ack_invoke_t": ack.invoke_t,
                                "why": why})
        return Verdict("ack_needs_live_lease", not bad, len(bad),
                       f"{checked} successful acks, {len(bad)} on dead leases", bad[:EXAMPLES])

    def acks_durable(self) -> Verdict:
        bad = []
        for key, ds in self.by_message.items():
            acked_at = min((ack.complete_t for d in ds for ack in self.settled.get((d.queue, d.receipt), {}).get("ack_ok", [])),
                           default=math.inf)
            for d in ds:
                if d.op.invoke_t > acked_at:
                    bad.append({"queue": key[0], "group": key[1], "seq": key[2], "acked_at": acked_at,
                                "redelivered": self._describe(d)})
        return Verdict("acks_durable", not bad, len(bad),
                       f"{len(bad)} deliveries after a successful ack", bad[:EXAMPLES])

    def per_producer_order(self) -> Verdict:
        producer_of, priority_of = {}, {}
        sequences: dict[tuple, list[tuple[float, str, int]]] = defaultdict(list)
        for o in self.puts:
            producer_of[(o.value["queue"], o.value["id"])] = o.value["producer"]
            priority_of[(o.value["queue"], o.value["id"])] = o.value.get("priority", 0)
            if o.ok:
                sequences[(o.value["producer"], o.value["queue"])].append((o.invoke_t, o.value["id"],
                                                                           o.result["seq"]))
        bad = []
        for (producer, queue), puts in sequences.items():
            puts.sort()
            for (_, id1, s1), (_, id2, s2) in zip(puts, puts[1:]):
                if id1 != id2 and s2 <= s1:
                    bad.append({"producer": producer, "queue": queue, "why": "put seq went backwards",
                                "earlier": [id1, s1], "later": [id2, s2]})
        firsts: dict[tuple, list[Delivery]] = defaultdict(list)
        for d in self.deliveries:
            producer = producer_of.get((d.queue, d.id))
            if d.deliveries == 1 and producer is not None:
                firsts[(producer, d.queue, d.group)].append(d)
        for (producer, queue, group), ds in firsts.items():
            ds.sort(key=lambda d: d.seq, reverse=True)
            # per priority, the higher-seq first delivery that completed earliest
            earliest: dict[int, Delivery] = {}
            for d in ds:
                priority = priority_of[(d.queue, d.id)]
                later = min((e for p, e in earliest.items() if p <= priority), key=lambda e: e.op.complete_t,
                            default=None)
                if later is not None and d.op.invoke_t > later.op.complete_t:
                    bad.append({"producer": producer, "queue": queue, "group": group,
                                "why": "a later message, of no higher priority, was first handed out before "
                                       "an earlier one",
                                "earlier": self._describe(d) | {"seq": d.seq, "priority": priority},
                                "later": self._describe(later) | {"seq": later.seq,
                                                                  "priority": priority_of[(later.queue, later.id)]}})
                if priority not in earliest or d.op.complete_t < earliest[priority].op.complete_t:
                    earliest[priority] = d
        return Verdict("per_producer_order", not bad, len(bad),
                       f"{sum(len(p) for p in sequences.values())} acked puts in {len(sequences)} "
                       f"producer/queue streams, {len(bad)} out of order", bad[:EXAMPLES])

    def backoff_respected(self) -> Verdict:
        policies = self.setup.get("backoff") or {}
        bad, judged = [], 0
        for (queue, group, seq), ds in self.by_message.items():
            policy = policies.get(queue)
            if policy is None:
                continue
            by_count = {d.deliveries: d for d in ds}
            for n, d in sorted(by_count.items()):
                after = by_count.get(n + 1)
                if after is None:
                    continue
                judged += 1
                delay_ms = min(policy["max_ms"], policy["initial_ms"] * policy["factor"] ** (n - 1))
                earliest = self._lease_end_lower_bound(d) + (delay_ms - CLOCK_RESOLUTION_MS) / 1000
                if after.op.complete_t < earliest:
                    bad.append({"queue": queue, "group": group, "seq": seq, "delivery": n, "delay_ms": delay_ms,
                                "ended_no_sooner_than": self._lease_end_lower_bound(d),
                                "next": self._describe(after)})
        return Verdict("backoff_respected", not bad, len(bad),
                       f"{judged} redeliveries after a back-off, {len(bad)} too soon", bad[:EXAMPLES])

    def idempotent_once(self) -> Verdict:
        seqs: dict[tuple, set[int]] = defaultdict(set)
        retried = 0
        for o in self.puts:
            if o.ok:
                seqs[(o.value["queue"], o.value["id"])].add(o.result["seq"])
                retried += bool(o.result.get("duplicate"))
        for d in self.deliveries:
            if d.id is not None:
                seqs[(d.queue, d.id)].add(d.seq)
        bad = [{"queue": q, "id": mid, "seqs": sorted(s)} for (q, mid), s in seqs.items() if len(s) > 1]
        return Verdict("idempotent_once", not bad, len(bad),
                       f"{len(seqs)} ids ({retried} answered as duplicates), {len(bad)} stored twice",
                       bad[:EXAMPLES])

    def backlog_intact(self) -> Verdict:
        """Every message of the backlog stored before the faults is there after them, once, as put
        (chaos/backlog.py); a run without a backlog passes."""
        filled = [e for e in self.events if e["type"] == "backlog"]
        if not filled:
            return Verdict("backlog_intact", True, 0, "no backlog in this run")
        stored = filled[-1]["count"]
        reads = [e for e in self.events if e["type"] == "backlog_read"]
        if not reads:
            return Verdict("backlog_intact", False, 1, f"{stored} messages stored before the faults, never read back")
        read = reads[-1]
        bad = read["missing"] + read["wrong"] + read["twice"]
        return Verdict("backlog_intact", bad == 0 and read["intact"] == stored, bad,
                       f"{stored} messages stored before the faults: {read['intact']} read back intact, "
                       f"{read['missing']} missing, {read['wrong']} changed, {read['twice']} twice",
                       read["examples"][:EXAMPLES])

    def queue_in_one_group(self) -> Verdict:
        placements = [e for e in self.events if e["type"] == "placement"]
        if not placements:
            return Verdict("queue_in_one_group", True, 0, "one Raft group: no catalog, no churn")
        seen = placements[-1]["queues"]
        if "unread" in seen:
            return Verdict("queue_in_one_group", False, 1,
                           f"where the churn queues are was never read: {seen['unread']}")
        churns = [e for e in self.events if e["type"] == "churn"]
        answers = churns[-1]["answers"] if churns else {}
        bad = [{"queue": queue, **where} for queue, where in sorted(seen.items()) if not placed_alone(where)]
        live = sum(1 for where in seen.values() if where["groups"])
        return Verdict("queue_in_one_group", not bad, len(bad),
                       f"{len(seen)} churn queues ({sum(n for a, n in answers.items() if a.startswith('put 20'))} "
                       f"puts and {answers.get('delete 204', 0)} deletes done): {live - len(bad)} live in their "
                       f"catalog group alone, {len(seen) - live} gone with their names", bad[:EXAMPLES])

    def replicas_agree(self) -> Verdict:
        found = {}
        for f in ("verify", "verify-cli"):
            attempts = self.by_f[f]
            last = attempts[-1] if attempts else None
            if last is None:
                found[f] = "not run"
            elif not last.ok:
                found[f] = f"{last.type}: {last.error}"
            elif f == "verify":
                found[f] = "agree" if replicas_agree_in(last.result) else f"{last.result.get('verdict')}: {last.result}"
            else:
                found[f] = "agree" if last.result.get("exit") == 0 else \
                    f"exit {last.result.get('exit')}: {last.result.get('output', '')[-300:]}"
        ok = all(v == "agree" for v in found.values())
        return Verdict("replicas_agree", ok, 0 if ok else 1,
                       "; ".join(f"{k}: {v}" for k, v in found.items()))

    def log_time_not_ahead(self) -> Verdict:
        samples = self._put_at()
        bad = []
        # each Raft group keeps its own log time
        for raft_group in sorted({self.raft_group_of.get(o.value["queue"], 0) for o, _ in samples}):
            bad += _ahead_of_real_time([(o, at) for o, at in samples
                                        if self.raft_group_of.get(o.value["queue"], 0) == raft_group])
        bad.sort(key=lambda x: x["later_put"]["invoke_t"])
        # Once log time has jumped, every later put is ahead of the earlier ones:
        # show where it first happened and where it was worst.
        worst = sorted(bad, key=lambda x: -x["ahead_ms"])
        first = (f", first at {bad[0]['later_put']['complete_t']:.2f}s on {bad[0]['later_put']['node']}, "
                 f"worst {worst[0]['ahead_ms']} ms") if bad else ""
        return Verdict("log_time_not_ahead", not bad, len(bad),
                       f"{len(samples)} puts with a known log time, {len(bad)} ahead of real time{first}",
                       (bad[:2] + worst[:EXAMPLES - 2]) if bad else [])

    def _put_at(self) -> list[tuple[Op, int]]:
        """Acknowledged first puts of a message, each with the log time it was stamped with."""
        put_at = {(d.queue, d.id): d.put_at_ms for d in self.deliveries if d.put_at_ms is not None}
        samples = []
        for o in self.puts:
            at = put_at.get((o.value["queue"], o.value["id"]))
            if o.ok and at is not None and not o.result.get("duplicate"):
                samples.append((o, at))
        return samples

    def log_time_not_behind_at_birth(self) -> Verdict:
        wall_at_t0 = self.setup.get("wall_ms_at_t0")
        if wall_at_t0 is None:
            return Verdict("log_time_not_behind_at_birth", False, 1,
                           "the history has no wall clock to compare with (setup.wall_ms_at_t0)")
        first_fault = min((e["t"] for e in self.nemesis if e.get("f") == "start"), default=math.inf)
        samples = [(o, at) for o, at in self._put_at() if o.invoke_t < first_fault]
        bad = []
        for o, at in samples:
            behind = wall_at_t0 + 1000 * o.invoke_t - at
            if behind > BIRTH_SLACK_MS:
                bad.append({"behind_ms": round(behind), "id": o.value["id"], "node": o.node,
                            "invoke_t": o.invoke_t, "put_at_ms": at})
        return Verdict("log_time_not_behind_at_birth", not bad, len(bad),
                       f"{len(samples)} puts before the first fault with a known log time, "
                       f"{len(bad)} stamped over {BIRTH_SLACK_MS} ms before they were sent",
                       sorted(bad, key=lambda x: -x["behind_ms"])[:EXAMPLES])

    def no_stale_reads(self) -> tuple[Verdict, dict]:
        acked: dict[str, list[tuple[float, int]]] = defaultdict(list)
        for o in self.puts:
            if o.ok and o.result.get("seq") is not None:
                acked[o.value["queue"]].append((o.complete_t, o.result["seq"]))
        floors = {}     # queue -> (completion times, highest seq acknowledged by then)
        for queue, puts in acked.items():
            puts.sort()
            times, highest, top = [], [], 0
            for t, seq in puts:
                top = max(top, seq)
                times.append(t)
                highest.append(top)
            floors[queue] = (times, highest)
        reads = [o for o in self.by_f["read"] if o.ok and o.value.get("consistency") in ("leader", "strong")]
        bad = []
        for o in reads:
            times, highest = floors.get(o.value["queue"], ([], []))
            known = bisect.bisect_left(times, o.invoke_t)   # puts answered strictly before the read began
            if known and (o.result.get("last_seq") or 0) < highest[known - 1]:
                bad.append({"queue": o.value["queue"], "process": o.process, "node": o.node,
                            "consistency": o.value["consistency"], "kind": o.value.get("kind"),
                            "invoke_t": o.invoke_t, "last_seq": o.result.get("last_seq"),
                            "acked_seq": highest[known - 1]})
        isolated = sum(1 for o in reads if o.process.startswith(STALE_READER))
        counts = {"reads_checked": len(reads), "isolated_leader_reads": isolated}
        return Verdict("no_stale_reads", not bad, len(bad),
                       f"{len(reads)} leader/strong reads ({isolated} answered by an isolated leader), "
                       f"{len(bad)} missing an acknowledged put", bad[:EXAMPLES]), counts

    def log_never_shrinks(self) -> Verdict:
        samples = [o for o in self.ops if o.ok and o.f in ("ready", "cluster")]
        # Floors are learnt from completed samples and applied to samples invoked
        # after that, so the two readings cannot have been taken the other way round.
        pending = sorted(samples, key=lambda o: o.complete_t)
        learnt = 0
        best: dict[str, tuple[int, str, float]] = {}
        bad = []
        for o in sorted(samples, key=lambda o: o.invoke_t):
            while learnt < len(pending) and pending[learnt].complete_t < o.invoke_t:
                s = pending[learnt]
                learnt += 1
                for node, index, source in self._floors(s):
                    if index > best.get(node, (-1,))[0]:
                        best[node] = (index, source, s.complete_t)
            if o.f == "ready" and o.result.get("last_log_index") is not None:
                floor = best.get(o.node)
                if floor and o.result["last_log_index"] < floor[0] \
                        and not self._given_up(o.node, o.complete_t, o.result["last_log_index"], floor[0]):
                    bad.append({"node": o.node, "t": o.invoke_t, "last_log_index": o.result["last_log_index"],
                                "floor": floor[0], "floor_from": floor[1], "floor_known_at": floor[2]})
        truncations = [e for e in self.events if e["type"] == "log"
                       and any(m in e.get("line", "") for m in TRUNCATION_MARKERS)]
        bad += [{"node": e.get("node"), "log": e["line"][:300]} for e in truncations]
        given_up = sum(len(g) for g in self.give_ups.values())
        return Verdict("log_never_shrinks", not bad, len(bad),
                       f"{len(samples)} index samples, {len(truncations)} truncation log lines, "
                       + (f"{given_up} give-ups of damaged entries, " if given_up else "")
                       + f"{len(bad)} violations", bad[:EXAMPLES])

    def _give_ups(self) -> dict[str, list[tuple[float, int, int]]]:
        """node -> (history time, first entry, index to regain) of each give-up of entries to damage
        it logged (the time from the line's wall clock; unknown: from the start)."""
        wall_at_t0 = self.setup.get("wall_ms_at_t0")
        out = defaultdict(list)
        for e in self.events:
            found = GIVE_UP.search(e.get("line", "")) if e["type"] == "log" else None
            if found:
                t = (e["ts"] * 1000 - wall_at_t0) / 1000 if e.get("ts") is not None and wall_at_t0 else -math.inf
                out[e.get("node")].append((t, int(found.group(1)), int(found.group(2))))
        return out

    def _given_up(self, node: str, t: float, last: int, floor: int) -> bool:
        """Whether `node`'s log ending at `last`, below `floor`, in a reading answered at `t`, is what
        a give-up it logged before then allows: the log from the entry before the damage on, a
        floor it must regain."""
        return any(said <= t and first - 1 <= last and floor <= regain
                   for said, first, regain in self.give_ups.get(node, ()))

    def nodes_never_fail(self) -> Verdict:
        crashes = [{"node": e["node"], "t": e["t"], "exit_code": e.get("exit_code")}
                   for e in self.events if e["type"] == "crash"]
        obliged: dict[str, int] = defaultdict(int)   # node -> syncs the nemesis made fail there
        for e in self.nemesis:
            if e.get("f") == "stop":
                for node, failed in e["value"].get("sync_failed", {}).items():
                    obliged[node] += failed
        critical, reported = [], 0
        for e in self.events:
            if e["type"] != "log" or e.get("level") != "critical" \
                    or any(m in e.get("line", "") for m in TRUNCATION_MARKERS):
                continue
            if SYNC_FAILURE_MARKER in e.get("line", "") and obliged[e.get("node")] > 0:
                obliged[e.get("node")] -= 1
                reported += 1
                continue
            critical.append({"node": e.get("node"), "log": e.get("line", "")[:300]})
        bad = crashes + critical
        return Verdict("nodes_never_fail", not bad, len(bad),
                       f"{len(crashes)} unexpected exits, {len(critical)} critical log lines"
                       + (f" ({reported} more reporting a sync the nemesis failed)" if reported else ""),
                       bad[:EXAMPLES])

    def bodies_as_put(self) -> tuple[Verdict, int]:
        """Every served body is the body of its message's put; returns the verdict and how many
        bodies were changed."""
        by_seq: dict[tuple[str, int], Any] = {}
        by_id: dict[tuple[str, str], list] = defaultdict(list)
        for o in self.puts:
            if "body" not in o.value:
                continue
            by_id[(o.value["queue"], o.value["id"])].append(o.value["body"])
            if o.ok and not o.result.get("duplicate"):
                by_seq[(o.value["queue"], o.result["seq"])] = o.value["body"]
        changed, compared = [], 0
        for d in self.deliveries:
            if d.body is UNRECORDED:
                continue
            compared += 1
            named = d.body.get("id") if isinstance(d.body, dict) else None
            put = by_seq.get((d.queue, d.seq), UNRECORDED)
            if put is UNRECORDED:
                put = next((b for b in by_id.get((d.queue, named), []) if b == d.body), None)
            if put != d.body:
                changed.append({"queue": d.queue, "group": d.group, "seq": d.seq, "served": d.body,
                                "put": put, "process": d.op.process, "node": d.op.node, "invoke_t": d.op.invoke_t})
        reads = [e for e in self.events if e["type"] == "backlog_read"]
        backlog_changed = reads[-1]["wrong"] if reads else 0
        bad = len(changed) + backlog_changed
        detail = (f"{compared} bodies served compared with their puts, {len(changed)} changed"
                  + (f"; backlog: {backlog_changed} changed" if reads else ""))
        return Verdict("bodies_as_put", not bad, bad, detail, changed[:EXAMPLES]), bad

    @staticmethod
    def _floors(sample: Op):
        r = sample.result
        if sample.f == "ready":
            if r.get("last_log_index") is not None and r.get("commit_index") is not None:
                yield sample.node, min(r["commit_index"], r["last_log_index"]), "own commit index"
        elif r.get("leader") == sample.node and r.get("commit_index") is not None:
            for n in r.get("nodes", []):
                if n.get("match_index") is not None:
                    yield n["id"], min(n["match_index"], r["commit_index"]), f"leader {sample.node} match index"

    # ---- measurements -----------------------------------------------------------------
    def _first_ack_after(self, t: float, raft_group: int) -> float | None:
        return min((o.complete_t for o in self.puts if o.ok and o.invoke_t >= t
                    and self.raft_group_of.get(o.value["queue"], 0) == raft_group), default=None)

    def failovers(self) -> list[tuple[str, int, float]]:
        """(kind, Raft group, seconds) for every group whose leader a fault took away
        (the mark's `raft_groups`): from the instant of the fault to the first acknowledged
        put to one of that group's queues sent after the fault took effect."""
        out = []
        for e in self.nemesis:
            if e.get("f") == "mark" and e["value"].get("failover"):
                for raft_group in e["value"].get("raft_groups", [0]):
                    # Writes sent before the fault took effect (the mark) may still have
                    # been acknowledged by the old leader: only later ones count.
                    done = self._first_ack_after(e["t"], raft_group)
                    if done is not None:
                        out.append((e["value"]["failover"], raft_group, done - e["value"].get("since", e["t"])))
        return out

    def stale_leader_refusals(self) -> list[float]:
        out = []
        for e in self.nemesis:
            probe = e.get("f") == "mark" and e["value"].get("stale_probe")
            if not probe:
                continue
            refused = [o.complete_t for o in self.puts if o.process == probe and not o.ok
                       and isinstance(o.error, dict) and o.error.get("status") in REFUSALS]
            if refused:
                out.append(min(refused) - e["value"].get("since", e["t"]))
        return out

    def _windows(self, kind: str | None = None) -> list[tuple[float, float, dict]]:
        starts = {e["fault"]: e for e in self.nemesis if e.get("f") == "start"}
        out = []
        for e in self.nemesis:
            if e.get("f") == "stop" and e["fault"] in starts:
                s = starts[e["fault"]]
                if kind is None or s["kind"] == kind:
                    out.append((s["t"], e["t"], s))
        return out

    def _injected_windows(self) -> list[tuple[float, float, dict]]:
        skipped = {e["fault"] for e in self.nemesis if e.get("f") == "stop" and e["value"].get("skipped")}
        return sorted((w for w in self._windows() if w[2]["fault"] not in skipped), key=lambda w: w[0])

    def rebalance_times(self) -> list[dict]:
        """For each injected fault: seconds from its end (the stop event: healed, every
        node back) until the monitor's samples, all taken after the end, show every
        Raft group led and leadership balanced; None if not before the next fault."""
        samples = sorted(self.by_f["ready"], key=lambda o: o.complete_t)
        nodes = {o.node for o in samples}
        windows = self._injected_windows()
        starts = sorted(e["t"] for e in self.nemesis if e.get("f") == "start")
        out = []
        for _, end, s in windows:
            limit = next((t for t in starts if t > end), math.inf)
            latest: dict[str, dict | None] = {}
            found = None
            for o in samples:
                if o.invoke_t < end:
                    continue
                if o.complete_t > limit:
                    break
                latest[o.node] = o.result if o.ok else None
                views = {n: v for n, v in latest.items() if v is not None}
                if set(latest) >= nodes and views and balanced(views, self.raft_groups):
                    found = o.complete_t
                    break
            out.append({"fault": s["fault"], "kind": s["kind"], "s": _r(found - end) if found is not None else None})
        return out

    def leaders_rebalanced(self) -> tuple[Verdict, list[dict]]:
        times = self.rebalance_times()
        bad = [t for t in times if t["s"] is None or t["s"] > REBALANCE_S]
        seen = [t["s"] for t in times if t["s"] is not None]
        figures = f", median {_r(statistics.median(seen))}s, max {max(seen)}s" if seen else ""
        return Verdict("leaders_rebalanced", not bad, len(bad),
                       f"{len(times)} faults{figures}; {len(bad)} not balanced within {REBALANCE_S:g}s "
                       f"of their end ({self.raft_groups} Raft group{'s' if self.raft_groups > 1 else ''})",
                       bad[:EXAMPLES]), times

    def resume_times(self) -> list[dict]:
        """For each injected fault and Raft group: seconds from the fault's end to the first
        acknowledgement of a put to one of the group's queues sent after the end (None: none)."""
        acked = defaultdict(list)   # Raft group -> (invoke_t, complete_t) of acknowledged puts
        for o in self.puts:
            if o.ok:
                acked[self.raft_group_of.get(o.value["queue"], 0)].append((o.invoke_t, o.complete_t))
        out = []
        for _, end, s in self._injected_windows():
            for group in range(self.raft_groups):
                done = min((complete for invoked, complete in acked[group] if invoked >= end), default=None)
                out.append({"fault": s["fault"], "kind": s["kind"], "raft_group": group,
                            "s": _r(done - end) if done is not None else None})
        return out

    def writes_resume(self) -> tuple[Verdict, list[dict]]:
        times = self.resume_times()
        bad = [t for t in times if t["s"] is None or t["s"] > WRITES_RESUME_S]
        seen = [t["s"] for t in times if t["s"] is not None]
        figures = f", median {_r(statistics.median(seen))}s, max {max(seen)}s" if seen else ""
        return Verdict("writes_resume", not bad, len(bad),
                       f"{len(times)} fault ends x Raft groups{figures}; {len(bad)} without a write acknowledged "
                       f"within {WRITES_RESUME_S:g}s", bad[:EXAMPLES]), times

    def new_leader_faults(self) -> dict[int, int]:
        """Raft group -> how many faults it got a new leader in (a term higher than any
        leader's before the fault claimed during it, up to its end)."""
        claims = []   # (complete_t, invoke_t, group, term)
        for o in self.by_f["ready"]:
            if o.ok:
                for group, state in group_states(o.result).items():
                    if state.get("role") == "leader" and state.get("term") is not None:
                        claims.append((o.complete_t, o.invoke_t, group, state["term"]))
        out = {group: 0 for group in range(self.raft_groups)}
        for start, end, _ in self._injected_windows():
            for group in out:
                before = max((term for done, _, g, term in claims if g == group and done < start), default=-1)
                during = max((term for _, began, g, term in claims if g == group and start <= began <= end),
                             default=-1)
                out[group] += during > before
        return out

    def per_raft_group(self, failovers: list[tuple[str, int, float]], lost: list[dict]) -> dict[str, dict]:
        """What each Raft group went through: its queues, acknowledged and lost puts,
        faults it got a new leader in, and its failovers."""
        queues: dict[int, list[str]] = defaultdict(list)
        for queue in self.groups:
            queues[self.raft_group_of.get(queue, 0)].append(queue)
        acked = defaultdict(set)
        for o in self.puts:
            if o.ok:
                acked[self.raft_group_of.get(o.value["queue"], 0)].add((o.value["queue"], o.value["id"]))
        new_leader = self.new_leader_faults()
        out = {}
        for group in range(self.raft_groups):
            times = [s for _, g, s in failovers if g == group]
            out[str(group)] = {
                "queues": sorted(queues.get(group, [])),
                "acked_puts": len(acked[group]),
                "lost": sum(1 for x in lost if self.raft_group_of.get(x["queue"], 0) == group),
                "faults_with_new_leader": new_leader[group],
                "failover": {"n": len(times), "median_s": _r(statistics.median(times)) if times else None,
                             "max_s": _r(max(times)) if times else None}}
        return out

    def slow_leader_replacements(self) -> list[float | None]:
        out = []
        for start, stop, s in self._windows("slow-leader"):
            slow = s["value"].get("leader")
            seen = [o.complete_t for o in self.by_f["ready"] if o.ok and o.invoke_t >= start
                    and o.result.get("role") == "leader" and o.node != slow and o.complete_t <= stop + 5]
            out.append(min(seen) - start if seen else None)
        return out

    def put_latency_p99(self) -> dict[str, float | None]:
        faulty = self._windows()
        slow = self._windows("slow-follower")

        def within(t, windows):
            return any(a <= t <= b for a, b, _ in windows)
        producers = set(self.setup.get("producers", []))
        oks = [o for o in self.puts if o.ok and o.process in producers]
        # to 0.1 ms: the two are compared within 20 % at about 10 ms
        return {"slow_follower": _r(percentile([o.latency for o in oks if within(o.invoke_t, slow)], 99), 4),
                "fault_free": _r(percentile([o.latency for o in oks if not within(o.invoke_t, faulty)], 99), 4)}

    # ---- all together -------------------------------------------------------------------
    def report(self) -> Report:
        lost_verdict, lost = self.acked_puts_delivered()
        double = self.no_double_lease()
        stale_reads, read_counts = self.no_stale_reads()
        rebalanced, rebalance_times = self.leaders_rebalanced()
        bodies, changed_bodies = self.bodies_as_put()
        resumed, resume_times = self.writes_resume()
        verdicts = [lost_verdict, double, self.ack_needs_live_lease(), self.acks_durable(),
                    self.per_producer_order(), self.backoff_respected(), self.idempotent_once(), stale_reads,
                    self.replicas_agree(),
                    self.log_time_not_ahead(), self.log_time_not_behind_at_birth(), self.log_never_shrinks(),
                    self.nodes_never_fail(), rebalanced, self.backlog_intact(), self.queue_in_one_group(),
                    bodies, resumed]
        failovers = self.failovers()
        by_kind: dict[str, list[float]] = defaultdict(list)
        for kind, _, seconds in failovers:
            by_kind[kind].append(seconds)
        headline = [x for k in FAILOVER_MARKS for x in by_kind.get(k, [])]
        counts = defaultdict(int)
        for o in self.ops:
            if o.f in ("put", "receive", "ack", "nack", "read"):
                counts[o.type] += 1
        starts = [e for e in self.nemesis if e.get("f") == "start"]
        skipped = {e["fault"]: e["value"]["skipped"] for e in self.nemesis
                   if e.get("f") == "stop" and e["value"].get("skipped")}
        refusals = self.stale_leader_refusals()
        replaced = self.slow_leader_replacements()
        rebalance_seen = [t["s"] for t in rebalance_times if t["s"] is not None]
        resume_seen = [t["s"] for t in resume_times if t["s"] is not None]
        summary = {
            "valid": all(v.ok for v in verdicts),
            "ops_ok": counts["ok"], "ops_info": counts["info"], "ops_fail": counts["fail"],
            "acked_lost": len(lost),
            "changed_bodies": changed_bodies,
            "double_leases": double.violations,
            "faults_injected": len(starts) - len(skipped),
            "fault_kinds": sorted({e["kind"] for e in starts if e["fault"] not in skipped}),
            "faults_skipped": [f"{e['kind']}: {skipped[e['fault']]}" for e in starts if e["fault"] in skipped],
            "failover_count": len(headline),
            "failover_median_s": _r(statistics.median(headline)) if headline else None,
            "failover_p99_s": _r(percentile(headline, 99)),
            "failover_max_s": _r(max(headline)) if headline else None,
            "failover_by_kind": {k: {"n": len(v), "median_s": _r(statistics.median(v)), "max_s": _r(max(v))}
                                 for k, v in sorted(by_kind.items()) if v},
            "rebalance_median_s": _r(statistics.median(rebalance_seen)) if rebalance_seen else None,
            "rebalance_max_s": max(rebalance_seen) if rebalance_seen else None,
            "rebalance_by_fault": rebalance_times,
            "resume_median_s": _r(statistics.median(resume_seen)) if resume_seen else None,
            "resume_max_s": max(resume_seen) if resume_seen else None,
            "resume_by_fault": resume_times,
            "raft_groups": self.raft_groups,
            "by_raft_group": self.per_raft_group(failovers, lost),
            "stale_leader_refusal_s": {"n": len(refusals), "median_s": _r(statistics.median(refusals)) if refusals else None,
                                       "max_s": _r(max(refusals)) if refusals else None},
            "slow_leader_replaced_s": [_r(x) for x in replaced],
            "put_p99_s": self.put_latency_p99(),
            **read_counts,
            "violations": {v.name: v.violations for v in verdicts if not v.ok},
        }
        for key in ("seed", "nodes"):
            if key in self.setup:
                summary[key] = self.setup[key]
        return Report(verdicts, summary)


def check(events: Iterable[dict]) -> Report:
    return Checker(events).report()


def render(report: Report) -> str:
    """Verdicts, one per line, then measurements; the last line is the summary as JSON."""
    s = report.summary
    lines = [v.line() for v in report.verdicts]
    for v in report.verdicts:
        for example in v.examples:
            lines.append(f"      {v.name}: {json.dumps(example, default=str)}")
    lines.append(f"failover (kill/isolate leader -> next acked put): n={s['failover_count']} "
                 f"median={s['failover_median_s']}s p99={s['failover_p99_s']}s max={s['failover_max_s']}s")
    for kind, figures in s["failover_by_kind"].items():
        lines.append(f"  after {kind:<11} n={figures['n']} median={figures['median_s']}s max={figures['max_s']}s")
    for group, figures in s["by_raft_group"].items():
        lines.append(f"Raft group {group}: queues {','.join(figures['queues']) or '-'}; "
                     f"{figures['acked_puts']} acked puts, {figures['lost']} lost; new leader in "
                     f"{figures['faults_with_new_leader']} faults; failover {figures['failover']}")
    lines.append(f"leaders balanced again after (s): median={s['rebalance_median_s']} max={s['rebalance_max_s']} "
                 + " ".join(f"{t['fault']}:{t['kind']}={t['s']}" for t in s["rebalance_by_fault"]))
    lines.append(f"writes acknowledged again after (s): median={s['resume_median_s']} max={s['resume_max_s']} "
                 + " ".join(f"{t['fault']}:{t['kind']}/{t['raft_group']}={t['s']}" for t in s["resume_by_fault"]))
    lines.append(f"isolated leader refuses writes after: {s['stale_leader_refusal_s']}")
    lines.append(f"slow leader replaced after (s): {s['slow_leader_replaced_s']}")
    lines.append(f"put p99 (s): {s['put_p99_s']}")
    lines.append(json.dumps(s, sort_keys=True, default=str))
    return "\n".join(lines)
