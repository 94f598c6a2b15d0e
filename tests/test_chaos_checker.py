"""The chaos checker and nemesis plan on synthetic histories: each property is
shown to pass on a history that keeps it and to fail, with the right count, on
one that breaks it in exactly one way. No processes, no network."""

import json

import pytest

from chaos import backlog
from chaos.checker import WRITES_RESUME_S, check, percentile, render
from chaos.disks import bad_disks
from chaos.history import History, load, ops
from chaos.nemesis import DISK_KINDS, KINDS, plan

LEASE_MS = 1000
WALL_MS_AT_T0 = 49_000   # the wall clock when the synthetic history starts


class Run:
    """Builds a history with a hand-driven clock."""

    def __init__(self, groups=("default",), backoff=None):
        self.t = 0.0
        self.h = History(clock=lambda: self.t)
        self.h.event("setup", queues={"q": list(groups)}, producers=["p1", "p2"], lease_ms=LEASE_MS,
                     seed=7, nodes=3, wall_ms_at_t0=WALL_MS_AT_T0, backoff={"q": backoff} if backoff else {})
        self.receipts = 0

    def op(self, process, f, value, start, end, type="ok", result=None, error=None, node="n1"):
        self.t = start
        op = self.h.invoke(process, f, value, node)
        if end is not None:
            self.t = end
            self.h.complete(op, type, result, error)

    def put(self, mid, seq, start, end=None, type="ok", producer="p1", error=None, body=None, queue="q",
            priority=None):
        """A put of message `mid`; with a `body`, the body it put is recorded, as the workload does."""
        end = start + 0.01 if end is None else end
        value = {"queue": queue, "id": mid, "producer": producer, **({"body": body} if body is not None else {}),
                 **({} if priority is None else {"priority": priority})}
        self.op(producer, "put", value, start, end, type, {"seq": seq, "duplicate": False} if type == "ok" else None,
                error)

    def receive(self, messages, start, end=None, process="c1", group="default", type="ok"):
        """messages: [(id, seq, deliveries)], or (id, seq, deliveries, body) with the body served
        recorded; returns their receipts."""
        receipts = []
        out = []
        for mid, seq, deliveries, *body in messages:
            self.receipts += 1
            receipts.append(f"{group}:{seq}:{self.receipts}")
            out.append({"seq": seq, "receipt": receipts[-1], "id": mid, "deliveries": deliveries,
                        **({"body": body[0]} if body else {})})
        self.op(process, "receive", {"queue": "q", "group": group, "max": 10, "lease_ms": LEASE_MS},
                start, start + 0.01 if end is None else end, type, {"messages": out} if type == "ok" else None)
        return receipts

    def settle(self, f, receipts, start, end=None, type="ok", stale=(), process="c1", group="default"):
        result = {"acked" if f == "ack" else "nacked": len(receipts) - len(stale), "stale": list(stale)}
        self.op(process, f, {"queue": "q", "group": group, "receipts": receipts}, start,
                start + 0.01 if end is None else end, type, result if type == "ok" else None,
                {"status": 409, "code": "stale_receipt"} if type == "fail" else None)

    def read(self, last_seq, start, end=None, type="ok", consistency="leader", kind="stats", process="r1"):
        self.op(process, "read", {"queue": "q", "kind": kind, "consistency": consistency}, start,
                start + 0.01 if end is None else end, type, {"last_seq": last_seq} if type == "ok" else None,
                {"status": 503} if type == "info" else None)

    def healed(self, agree=True, cli_exit=0):
        self.h.event("note", what="drain", complete=True)
        self.op("checker", "verify", None, 100, 100.5, "ok",
                {"agree": agree, "digests": {"n1": "a", "n2": "a" if agree else "b", "n3": "a"}})
        self.op("checker", "verify-cli", None, 101, 101.5, "ok", {"exit": cli_exit, "output": ""})

    def report(self):
        return check(self.h.events)


def clean_run() -> Run:
    run = Run()
    run.put("a", 1, 0.0)
    run.put("b", 2, 0.1)
    [ra, rb] = run.receive([("a", 1, 1), ("b", 2, 1)], 0.2)
    run.settle("ack", [ra], 0.3)
    run.settle("nack", [rb], 0.3)
    [rb2] = run.receive([("b", 2, 2)], 0.4, process="c2")
    run.settle("ack", [rb2], 0.5, process="c2")
    run.healed()
    return run


def verdicts(report) -> dict:
    return {v.name: v for v in report.verdicts}


def test_a_clean_history_is_valid_and_summarised():
    report = clean_run().report()
    assert report.valid, render(report)
    last = json.loads(render(report).splitlines()[-1])
    assert last["valid"] is True and last["acked_lost"] == 0 and last["double_leases"] == 0
    for key in ("ops_ok", "faults_injected", "failover_median_s", "failover_max_s"):
        assert key in last
    assert last["ops_ok"] == 7 and last["seed"] == 7


def test_history_file_round_trip_and_unfinished_ops(tmp_path):
    path = tmp_path / "history.jsonl"
    h = History(path)
    done = h.invoke("p1", "put", {"queue": "q", "id": "x", "producer": "p1"}, "n1")
    h.complete(done, "ok", {"seq": 1, "duplicate": False})
    h.invoke("p1", "put", {"queue": "q", "id": "y", "producer": "p1"}, "n2")
    h.close()
    with open(path, "a") as f:
        f.write('{"torn": ')  # the writer was killed mid-line
    events = load(path)
    assert len(events) == 3
    first, second = ops(events)
    assert first.ok and first.result["seq"] == 1
    assert second.type == "info" and second.complete_t == float("inf")
    with pytest.raises(ValueError):
        History().complete(History().invoke("p", "put"), "maybe")


def test_lost_acked_put_is_reported():
    run = clean_run()
    run.put("c", 3, 1.0)
    report = run.report()
    assert not report.valid and report.summary["acked_lost"] == 1
    assert verdicts(report)["acked_puts_delivered"].examples[0]["id"] == "c"


def test_a_put_of_unknown_outcome_may_be_missing_or_present():
    run = clean_run()
    run.put("c", None, 1.0, 2.0, type="info", error={"status": 503})
    run.put("d", None, 1.0, None, type="info")
    assert run.report().valid


def test_every_group_must_receive_an_acked_put():
    run = Run(groups=("default", "audit"))
    run.put("a", 1, 0.0)
    [r] = run.receive([("a", 1, 1)], 0.1)
    run.settle("ack", [r], 0.2)
    run.healed()
    v = verdicts(run.report())["acked_puts_delivered"]
    assert not v.ok and v.examples[0]["groups"] == ["audit"]


def test_phantom_deliveries_are_reported():
    run = clean_run()
    run.put("failed", None, 1.0, type="fail", error={"status": 400})
    run.receive([("failed", 9, 1), ("nobody", 10, 1)], 1.1)
    v = verdicts(run.report())["acked_puts_delivered"]
    assert not v.ok and v.violations == 2


@pytest.mark.parametrize("second_at, nack, expect", [
    (0.5, None, 1),           # within the first lease: double lease
    (1.2, None, 0),           # after lease_ms from the first receive's invocation
    (0.5, "ok", 0),           # the holder nacked first
    (0.5, "info", 0),         # a nack of unknown outcome may have ended it
    (0.5, "fail", 1),         # a stale nack ended nothing
])
def test_double_lease(second_at, nack, expect):
    run = Run()
    run.put("a", 1, 0.0)
    [r1] = run.receive([("a", 1, 1)], 0.1, 0.2)
    if nack:
        run.settle("nack", [r1], 0.3, 0.35, type=nack)
    run.receive([("a", 1, 2)], second_at, second_at + 0.05, process="c2")
    assert verdicts(run.report())["no_double_lease"].violations == expect
    assert run.report().summary["double_leases"] == expect


def test_concurrent_receives_of_one_message_are_a_double_lease():
    run = Run()
    run.put("a", 1, 0.0)
    run.receive([("a", 1, 1)], 0.1, 0.3)
    run.receive([("a", 1, 1)], 0.1, 0.3, process="c2")
    assert verdicts(run.report())["no_double_lease"].violations == 1


@pytest.mark.parametrize("case, expect", [
    ("fresh", 0), ("after redelivery", 1), ("after own nack", 1), ("second ack", 1), ("stale answer", 0)])
def test_ack_needs_live_lease(case, expect):
    run = Run()
    run.put("a", 1, 0.0)
    [r1] = run.receive([("a", 1, 1)], 0.1)
    if case == "after redelivery":
        run.receive([("a", 1, 2)], 2.0, process="c2")
    if case == "after own nack":
        run.settle("nack", [r1], 0.5)
    if case == "second ack":
        run.settle("ack", [r1], 0.5)
    if case == "stale answer":
        run.receive([("a", 1, 2)], 2.0, process="c2")
        run.settle("ack", [r1], 3.0, type="fail")
    else:
        run.settle("ack", [r1], 3.0)
    assert verdicts(run.report())["ack_needs_live_lease"].violations == expect


def test_a_stale_receipt_in_a_successful_batch_is_not_judged():
    run = Run()
    run.put("a", 1, 0.0)
    run.put("b", 2, 0.0)
    [ra, rb] = run.receive([("a", 1, 1), ("b", 2, 1)], 0.1)
    run.receive([("a", 1, 2)], 2.0, process="c2")
    run.settle("ack", [ra, rb], 3.0, stale=[ra])
    assert verdicts(run.report())["ack_needs_live_lease"].ok


def test_redelivery_after_a_successful_ack_is_reported():
    run = Run()
    run.put("a", 1, 0.0)
    [r1] = run.receive([("a", 1, 1)], 0.1)
    run.settle("ack", [r1], 0.2, 0.3)
    run.receive([("a", 1, 2)], 5.0, process="c2")
    v = verdicts(run.report())["acks_durable"]
    assert not v.ok and v.violations == 1


def test_put_seqs_must_grow_per_producer():
    run = Run()
    run.put("a", 2, 0.0)
    run.put("b", 1, 0.1)
    run.put("x", 0, 0.2, producer="p2")  # another producer's stream is its own
    assert verdicts(run.report())["per_producer_order"].violations == 1


def test_retries_of_one_put_are_not_an_order_violation():
    run = Run()
    run.put("a", 5, 0.0, type="info")
    run.put("a", 5, 0.5)
    run.put("b", 6, 1.0)
    assert verdicts(run.report())["per_producer_order"].ok


@pytest.mark.parametrize("earlier_first_at, deliveries, expect", [
    (1.0, 1, 1),    # b first handed out strictly before a, which was ready
    (0.15, 1, 0),   # the two receives overlap: either order is possible
    (1.0, 2, 0),    # a's first delivery was not observed (a lost receive): no judgement
])
def test_first_deliveries_follow_put_order(earlier_first_at, deliveries, expect):
    run = Run()
    run.put("a", 1, 0.0)
    run.put("b", 2, 0.05)
    run.receive([("b", 2, 1)], 0.1, 0.2, process="c2")
    run.receive([("a", 1, deliveries)], earlier_first_at, earlier_first_at + 0.1)
    assert verdicts(run.report())["per_producer_order"].violations == expect


@pytest.mark.parametrize("earlier, later, expect", [
    (0, 5, 0),      # the later message has a higher priority: it may go first
    (5, 5, 1),      # the same priority: put order
    (5, 0, 1),      # a lower one: put order all the more
    (None, None, 1),   # puts without a priority are all 0
])
def test_a_later_message_goes_first_only_with_a_higher_priority(earlier, later, expect):
    run = Run()
    run.put("a", 1, 0.0, priority=earlier)
    run.put("b", 2, 0.05, priority=later)
    run.receive([("b", 2, 1)], 0.1, 0.2, process="c2")
    run.receive([("a", 1, 1)], 1.0, 1.1)
    assert verdicts(run.report())["per_producer_order"].violations == expect


BACKOFF = {"initial_ms": 100, "factor": 2, "max_ms": 800, "jitter": 0}


@pytest.mark.parametrize("nacked, second_done_at, expect", [
    (True, 0.45, 0),     # nacked at 0.3: back 100 ms later at the soonest
    (True, 0.38, 1),     # too soon after the nack
    (False, 1.31, 0),    # the lease (invoked at 0.2, 1 s) ended, then 100 ms
    (False, 1.25, 1),    # too soon after the lease's end
])
def test_a_redelivery_comes_no_sooner_than_the_back_off_after_the_delivery_ended(nacked, second_done_at, expect):
    run = Run(backoff=BACKOFF)
    run.put("a", 1, 0.0)
    [r1] = run.receive([("a", 1, 1)], 0.2)
    if nacked:
        run.settle("nack", [r1], 0.3)
    run.receive([("a", 1, 2)], second_done_at - 0.01, second_done_at, process="c2")
    assert verdicts(run.report())["backoff_respected"].violations == expect


def test_the_back_off_grows_with_each_delivery_and_a_queue_without_a_policy_is_not_judged():
    for backoff, expect in ((BACKOFF, 1), (None, 0)):
        run = Run(backoff=backoff)
        run.put("a", 1, 0.0)
        [r1] = run.receive([("a", 1, 1)], 0.2)
        run.settle("nack", [r1], 0.3)
        [r2] = run.receive([("a", 1, 2)], 0.45)      # 100 ms after the first nack: fine
        run.settle("nack", [r2], 0.5)
        run.receive([("a", 1, 3)], 0.6)               # 100 ms after the second: 200 were due
        assert verdicts(run.report())["backoff_respected"].violations == expect


def test_idempotent_retries_store_one_copy():
    run = Run()
    run.put("a", 1, 0.0, type="info")
    run.op("p1", "put", {"queue": "q", "id": "a", "producer": "p1"}, 0.5, 0.6, "ok", {"seq": 1, "duplicate": True})
    run.receive([("a", 1, 1)], 1.0)
    assert verdicts(run.report())["idempotent_once"].ok
    run.receive([("a", 7, 1)], 3.0, process="c2")
    assert verdicts(run.report())["idempotent_once"].violations == 1


@pytest.mark.parametrize("agree, cli_exit, ok", [(True, 0, True), (False, 0, False), (True, 1, False)])
def test_replicas_agree(agree, cli_exit, ok):
    run = Run()
    run.healed(agree=agree, cli_exit=cli_exit)
    assert verdicts(run.report())["replicas_agree"].ok is ok


def test_replicas_not_verified_is_a_failure():
    assert not verdicts(Run().report())["replicas_agree"].ok


def sample(run, node, start, end, last, commit, f="ready", result=None):
    run.op("monitor", f, None, start, end, "ok",
           result or {"role": "follower", "last_log_index": last, "commit_index": commit}, node=node)


def test_log_shrinking_below_its_commit_index_is_reported():
    run = Run()
    sample(run, "n2", 1.0, 1.1, last=12, commit=10)
    sample(run, "n2", 2.0, 2.1, last=11, commit=10)   # uncommitted tail dropped: allowed
    sample(run, "n2", 3.0, 3.1, last=8, commit=8)     # below 10: violation
    v = verdicts(run.report())["log_never_shrinks"]
    assert v.violations == 1 and v.examples[0]["floor"] == 10


def test_log_floor_from_the_leaders_match_index():
    run = Run()
    view = {"leader": "n1", "commit_index": 20, "nodes": [{"id": "n1", "match_index": 25},
                                                         {"id": "n3", "match_index": 18}]}
    sample(run, "n1", 1.0, 1.1, None, None, f="cluster", result=view)
    sample(run, "n3", 1.05, 1.2, last=5, commit=5)    # overlapping the leader's sample: not judged
    sample(run, "n3", 2.0, 2.1, last=17, commit=5)    # acknowledged 18, committed 20: violation
    v = verdicts(run.report())["log_never_shrinks"]
    assert v.violations == 1 and v.examples[0]["floor"] == 18


def test_truncation_log_lines_are_violations():
    run = Run()
    run.h.event("log", node="n2", line="conflict truncates applied entries from index 7 (last applied 9)")
    assert verdicts(run.report())["log_never_shrinks"].violations == 1


def test_failover_is_measured_from_the_mark_to_the_next_acked_put():
    run = clean_run()
    run.t = 10.0
    fault = run.h.event("nemesis", f="start", fault=1, kind="kill-leader", value={})
    run.h.event("nemesis", f="mark", fault=1, value={"failover": "kill", "leader": "n1", "since": 9.9})
    run.put("c", 3, 9.95, 10.3)                # sent before the kill took effect: does not count
    run.put("d", 4, 10.1, 10.2, type="info")
    run.put("e", 5, 10.2, 10.6, producer="p2")
    run.t = 12.0
    run.h.event("nemesis", f="stop", fault=fault["fault"], value={})
    run.receive([("c", 3, 1), ("e", 5, 1)], 13.0)
    s = run.report().summary
    assert s["faults_injected"] == 1 and s["failover_count"] == 1
    # measured from the instant the kill was applied (since), not from the mark
    assert s["failover_median_s"] == pytest.approx(0.7) and s["failover_max_s"] == pytest.approx(0.7)


def test_stale_leader_refusal_and_slow_leader_replacement_are_measured():
    run = Run()
    run.t = 5.0
    run.h.event("nemesis", f="start", fault=1, kind="slow-leader", value={"leader": "n1"})
    run.h.event("nemesis", f="mark", fault=1, value={"stale_probe": "stale-1", "since": 4.9})
    run.op("stale-1", "put", {"queue": "q", "id": "s1", "producer": "stale-1"}, 5.0, 5.3, "info")
    run.op("stale-1", "put", {"queue": "q", "id": "s2", "producer": "stale-1"}, 5.3, 5.4, "fail",
           error={"status": 307})
    sample(run, "n2", 5.5, 5.6, 0, 0, result={"role": "leader", "last_log_index": 3, "commit_index": 3})
    run.t = 8.0
    run.h.event("nemesis", f="stop", fault=1, value={})
    s = run.report().summary
    assert s["stale_leader_refusal_s"]["max_s"] == pytest.approx(0.5)
    assert s["slow_leader_replaced_s"] == [pytest.approx(0.6)]


def test_percentile_is_nearest_rank():
    assert percentile([], 99) is None
    assert percentile([3, 1, 2], 50) == 2
    assert percentile(list(range(1, 101)), 99) == 99


def test_the_plan_is_reproducible_and_covers_every_kind_per_cycle():
    a = list(plan(seed=42, nodes=3, cycles=2))
    assert a == list(plan(seed=42, nodes=3, cycles=2))
    assert a != list(plan(seed=43, nodes=3, cycles=2))
    kinds = KINDS
    assert len(a) == 2 * len(kinds)
    assert sorted(f.kind for f in a[:len(kinds)]) == sorted(kinds)
    assert all(f.hold_s > 0 and f.gap_s > 0 for f in a)


def test_the_plan_shapes_partitions_for_the_cluster_size():
    for nodes in (3, 5):
        for fault in plan(seed=1, nodes=nodes, cycles=3):
            if fault.kind.startswith("partition"):
                sides = fault.params["sides"]
                bridge = [fault.params["bridge"]] if "bridge" in fault.params else []
                assert sorted([i for side in sides for i in side] + bridge) == list(range(nodes))
                assert all(side for side in sides)
                if fault.kind == "partition-islands" and nodes == 5:
                    assert sorted(len(s) for s in sides) == [1, 2, 2]


def timed_put(run, mid, seq, start, end, put_at_ms, node="n1"):
    run.op("p1", "put", {"queue": "q", "id": mid, "producer": "p1"}, start, end, "ok",
           {"seq": seq, "duplicate": False}, node=node)
    run.op("c1", "receive", {"queue": "q", "group": "default", "max": 1, "lease_ms": LEASE_MS}, end + 0.01,
           end + 0.02, "ok", {"messages": [{"seq": seq, "receipt": f"r{seq}", "id": mid, "deliveries": 1,
                                            "put_at_ms": put_at_ms}]})


def test_log_time_may_stand_still_but_never_run_ahead_of_real_time():
    run = Run()
    timed_put(run, "a", 1, 1.0, 1.1, put_at_ms=50_000)
    timed_put(run, "b", 2, 2.0, 2.1, put_at_ms=50_100)     # an election cost log time: fine
    timed_put(run, "c", 3, 3.0, 3.1, put_at_ms=51_150)     # 1.05 s of log time in 1.1 s of real time
    assert verdicts(run.report())["log_time_not_ahead"].ok
    timed_put(run, "d", 4, 4.0, 4.05, put_at_ms=56_000, node="n2")  # 5.9 s of log time in 2.05 s after b
    v = verdicts(run.report())["log_time_not_ahead"]
    assert not v.ok and v.violations == 1
    assert v.examples[0]["later_put"]["node"] == "n2" and v.examples[0]["ahead_ms"] == 3850


def test_a_new_clusters_log_time_starts_from_real_time_not_from_zero():
    run = Run()
    timed_put(run, "a", 1, 1.0, 1.1, put_at_ms=WALL_MS_AT_T0 + 1000)     # stamped as it was sent
    timed_put(run, "b", 2, 2.0, 2.1, put_at_ms=WALL_MS_AT_T0 + 1100)     # 0.9 s behind: an election
    assert verdicts(run.report())["log_time_not_behind_at_birth"].ok
    timed_put(run, "c", 3, 0.5, 0.6, put_at_ms=0)                        # a brand-new cluster's log time 0
    v = verdicts(run.report())["log_time_not_behind_at_birth"]
    assert not v.ok and v.violations == 1
    assert v.examples[0] == {"behind_ms": WALL_MS_AT_T0 + 500, "id": "c", "node": "n1", "invoke_t": 0.5,
                             "put_at_ms": 0}


def test_log_time_may_fall_behind_real_time_once_faults_begin():
    run = Run()
    timed_put(run, "a", 1, 1.0, 1.1, put_at_ms=WALL_MS_AT_T0 + 1000)
    run.t = 2.0
    run.h.event("nemesis", f="start", fault=1, kind="kill", value={})
    timed_put(run, "b", 2, 9.0, 9.1, put_at_ms=WALL_MS_AT_T0 + 3000)     # 6 s behind after outages: fine
    assert verdicts(run.report())["log_time_not_behind_at_birth"].ok


def test_a_history_without_a_wall_clock_cannot_pass_the_birth_check():
    run = Run()
    run.h.events[0].pop("wall_ms_at_t0")
    assert not verdicts(run.report())["log_time_not_behind_at_birth"].ok


def test_skipped_faults_are_not_counted_as_injected():
    run = clean_run()
    run.t = 20.0
    run.h.event("nemesis", f="start", fault=1, kind="clock-jump", value={})
    run.h.event("nemesis", f="stop", fault=1, kind="clock-jump", value={"skipped": "libfaketime is not installed"})
    run.h.event("nemesis", f="start", fault=2, kind="pause", value={})
    run.h.event("nemesis", f="stop", fault=2, kind="pause", value={})
    s = run.report().summary
    assert s["faults_injected"] == 1 and s["fault_kinds"] == ["pause"]
    assert s["faults_skipped"] == ["clock-jump: libfaketime is not installed"]


def test_crashes_and_critical_log_lines_are_failures():
    run = clean_run()
    assert verdicts(run.report())["nodes_never_fail"].ok
    run.h.event("log", node="n1", level="critical", line="state machine apply raised; recorded as an internal error")
    run.h.event("crash", node="n2", exit_code=1)
    run.h.event("log", node="n3", level="critical", line="conflict truncates applied entries from index 3")
    v = verdicts(run.report())["nodes_never_fail"]
    assert v.violations == 2   # the truncation is log_never_shrinks' to judge


# ---- no_stale_reads ----------------------------------------------------------------------

@pytest.mark.parametrize("consistency", ["leader", "strong"])
@pytest.mark.parametrize("kind", ["stats", "browse"])
def test_a_read_begun_after_a_put_was_acknowledged_must_reflect_it(consistency, kind):
    run = clean_run()                      # puts seq 1 and 2, answered by 0.11
    run.read(2, 1.0, consistency=consistency, kind=kind)
    assert run.report().valid
    run.read(1, 1.1, consistency=consistency, kind=kind, process="r2")
    report = run.report()
    v = verdicts(report)["no_stale_reads"]
    assert not v.ok and v.violations == 1
    assert v.examples[0]["process"] == "r2" and v.examples[0]["acked_seq"] == 2
    assert report.summary["violations"] == {"no_stale_reads": 1}


def test_a_read_of_a_queue_with_nothing_ever_put_after_a_put_is_stale():
    run = clean_run()
    run.read(None, 1.0)
    assert verdicts(run.report())["no_stale_reads"].violations == 1


def test_a_read_overlapping_the_put_may_miss_it():
    run = clean_run()
    run.put("c", 3, 1.0, 1.5)
    run.read(2, 1.2, 1.3)                  # while the put was in flight
    run.read(2, 1.4, 1.6)                  # begun before the put's answer
    run.read(2, 1.5, 1.6)                  # begun at the instant of the answer: not strictly after
    [received] = run.receive([("c", 3, 1)], 2.0)
    run.settle("ack", [received], 2.1)
    run.healed()
    assert run.report().valid, render(run.report())


def test_only_answered_leader_and_strong_reads_are_judged():
    run = clean_run()
    run.read(1, 1.0, consistency="any")    # a local replica may lag, by contract
    run.read(None, 1.0, type="info")
    run.read(None, 1.0, type="fail")
    report = run.report()
    assert report.valid and report.summary["reads_checked"] == 0


def test_reads_answered_by_an_isolated_leader_are_counted_and_judged():
    run = clean_run()
    run.read(2, 1.0, process="stale-read-4")
    run.read(1, 1.1, process="stale-read-4")
    report = run.report()
    assert report.summary["reads_checked"] == 2 and report.summary["isolated_leader_reads"] == 2
    assert verdicts(report)["no_stale_reads"].violations == 1


# ---- several Raft groups: leaders balanced again after each fault, figures per group ----------

def raft_groups_run(raft_groups=4) -> Run:
    run = Run()
    run.h.events[0]["raft_groups"] = raft_groups
    run.h.event("routing", queues={"q": 0, "r": 1})
    return run


def fault(run, fid, start, end, kind="kill-leader"):
    run.t = start
    run.h.event("nemesis", f="start", fault=fid, kind=kind, value={})
    run.t = end
    run.h.event("nemesis", f="stop", fault=fid, kind=kind, value={})


def led(run, node, start, groups, term=2, raft_groups=4, answered=True):
    """A monitor sample of `node`'s /health/ready: it leads `groups` (in `term`), follows the rest."""
    states = {str(g): {"role": "leader" if g in groups else "follower", "term": term} for g in range(raft_groups)}
    run.op("monitor", "ready", None, start, start + 0.05, "ok" if answered else "info",
           {"role": states["0"]["role"], "term": term, "raft_groups": states} if answered else None, node=node)


def test_leaders_balanced_soon_after_each_fault_pass_and_the_time_is_reported():
    run = raft_groups_run()
    fault(run, 1, 10.0, 12.0)
    led(run, "n1", 11.0, {0, 1, 2, 3})                 # before the end: not evidence
    led(run, "n1", 12.1, {0, 1, 3})
    led(run, "n2", 12.2, {2})
    led(run, "n3", 12.3, set())                          # n1 3, n2 1, n3 0: not yet
    led(run, "n1", 13.0, {0, 3})
    led(run, "n3", 13.1, {1})                            # 2, 1, 1: balanced
    report = run.report()
    v = verdicts(report)["leaders_rebalanced"]
    assert v.ok, render(report)
    assert report.summary["rebalance_by_fault"] == [{"fault": 1, "kind": "kill-leader", "s": pytest.approx(1.15)}]
    assert report.summary["rebalance_max_s"] == pytest.approx(1.15)


def test_leaders_that_stay_unbalanced_after_a_fault_fail():
    run = raft_groups_run()
    fault(run, 1, 10.0, 12.0)
    for t in (12.1, 13.1, 14.1, 15.1, 16.1, 17.1, 18.1):
        led(run, "n1", t, {0, 1, 3})
        led(run, "n2", t + 0.01, {2})
        led(run, "n3", t + 0.02, set())
    v = verdicts(run.report())["leaders_rebalanced"]
    assert not v.ok and v.violations == 1 and v.examples[0]["s"] is None


def test_leaders_balanced_only_after_the_limit_fail_with_their_time():
    run = raft_groups_run()
    fault(run, 1, 10.0, 12.0)
    led(run, "n1", 12.1, {0, 1, 3})
    led(run, "n2", 12.2, {2})
    led(run, "n3", 12.3, set())
    led(run, "n1", 19.0, {0, 3})
    led(run, "n3", 19.1, {1})
    v = verdicts(run.report())["leaders_rebalanced"]
    assert not v.ok and v.examples[0]["s"] == pytest.approx(7.15)


def test_a_group_without_a_leader_is_not_balanced_and_an_older_terms_claim_loses():
    run = raft_groups_run()
    fault(run, 1, 10.0, 12.0)
    led(run, "n1", 12.1, {0, 3})
    led(run, "n2", 12.2, {2})
    led(run, "n3", 12.3, set())                          # nobody leads group 1
    led(run, "n1", 12.4, {0, 1, 3}, term=2)              # n1 3, n2 1, n3 0
    led(run, "n3", 12.5, {1}, term=1)                    # a stale claim: n1's in term 2 wins
    led(run, "n1", 12.6, {0, 3}, term=2)                 # now n3's is the only claim: 2, 1, 1
    report = run.report()
    assert verdicts(report)["leaders_rebalanced"].ok
    assert report.summary["rebalance_by_fault"][0]["s"] == pytest.approx(0.65)


def test_balance_is_judged_over_the_nodes_that_answer():
    run = raft_groups_run()
    fault(run, 1, 10.0, 12.0)
    led(run, "n1", 12.1, {0, 1})
    led(run, "n2", 12.2, {2, 3})
    led(run, "n3", 12.3, set(), answered=False)          # n3 does not answer: 2, 2 over n1 and n2
    assert run.report().summary["rebalance_by_fault"][0]["s"] == pytest.approx(0.35)
    run2 = raft_groups_run()
    fault(run2, 1, 10.0, 12.0)
    led(run2, "n1", 12.1, {0, 1})
    led(run2, "n2", 12.2, {2, 3})
    led(run2, "n3", 12.3, set())                          # n3 answers and leads nothing: 2, 2, 0
    assert run2.report().summary["rebalance_by_fault"][0]["s"] is None


def test_a_fault_not_balanced_before_the_next_one_starts_fails():
    run = raft_groups_run()
    fault(run, 1, 10.0, 12.0)
    led(run, "n1", 12.1, {0, 1, 3})
    led(run, "n2", 12.2, {2})
    led(run, "n3", 12.3, set())
    fault(run, 2, 13.0, 15.0)
    led(run, "n1", 15.1, {0, 3})
    led(run, "n2", 15.2, {2})
    led(run, "n3", 15.3, {1})
    times = run.report().summary["rebalance_by_fault"]
    assert [t["s"] for t in times] == [None, pytest.approx(0.35)]


def test_one_raft_group_needs_only_a_leader_again():
    run = Run()
    fault(run, 1, 10.0, 12.0)
    led(run, "n1", 12.1, set(), raft_groups=1)
    led(run, "n2", 12.2, {0}, raft_groups=1)
    led(run, "n3", 12.3, set(), raft_groups=1)
    assert run.report().summary["rebalance_by_fault"][0]["s"] == pytest.approx(0.35)


def test_failover_and_new_leaders_are_reported_per_raft_group():
    run = raft_groups_run()
    run.t = 10.0
    run.h.event("nemesis", f="start", fault=1, kind="kill-leader", value={})
    led(run, "n1", 9.0, {0, 1}, term=2)
    run.h.event("nemesis", f="mark", fault=1, value={"failover": "kill", "leader": "n1", "since": 9.9,
                                                     "raft_groups": [0, 1]})
    run.put("c", 3, 10.1, 10.2)                          # q: group 0, 0.3 s
    run.put("x", 1, 10.3, 10.9, producer="p2")           # never acked in r (group 1) before ...
    run.op("p2", "put", {"queue": "r", "id": "y", "producer": "p2"}, 10.4, 11.4, "ok",
           {"seq": 1, "duplicate": False})               # ... this one: 1.5 s
    led(run, "n2", 11.0, {0, 1}, term=3)
    run.t = 12.0
    run.h.event("nemesis", f="stop", fault=1, kind="kill-leader", value={})
    s = run.report().summary
    by_group = s["by_raft_group"]
    assert by_group["0"]["failover"]["max_s"] == pytest.approx(0.3)
    assert by_group["1"]["failover"]["max_s"] == pytest.approx(1.5)
    assert by_group["1"]["queues"] == [] and by_group["0"]["queues"] == ["q"]
    assert by_group["0"]["faults_with_new_leader"] == 1 and by_group["2"]["faults_with_new_leader"] == 0
    assert s["failover_by_kind"]["kill"]["n"] == 2


def test_one_receipt_string_in_queues_of_two_raft_groups_is_two_leases():
    """Each Raft group's state machine makes its own receipts: the same string may
    name a lease in a queue of each group."""
    run = raft_groups_run()
    run.put("a", 1, 0.0)
    run.op("p1", "put", {"queue": "r", "id": "b", "producer": "p1"}, 0.1, 0.11, "ok", {"seq": 1, "duplicate": False})
    run.op("c1", "receive", {"queue": "q", "group": "default", "max": 1, "lease_ms": LEASE_MS}, 0.2, 0.21, "ok",
           {"messages": [{"seq": 1, "receipt": "1:default:1:1", "id": "a", "deliveries": 1}]})
    run.op("c1", "ack", {"queue": "q", "group": "default", "receipts": ["1:default:1:1"]}, 0.3, 0.31, "ok",
           {"acked": 1, "stale": []})
    run.op("c2", "receive", {"queue": "r", "group": "default", "max": 1, "lease_ms": LEASE_MS}, 0.4, 0.41, "ok",
           {"messages": [{"seq": 1, "receipt": "1:default:1:1", "id": "b", "deliveries": 1}]})
    run.op("c2", "ack", {"queue": "r", "group": "default", "receipts": ["1:default:1:1"]}, 0.5, 0.51, "ok",
           {"acked": 1, "stale": []})
    report = run.report()
    assert verdicts(report)["ack_needs_live_lease"].ok and verdicts(report)["acks_durable"].ok, render(report)


def test_log_time_is_judged_within_each_raft_group():
    """Each Raft group keeps its own log time: a group whose clock started later is
    not 'ahead' of another's, but a jump inside one group is."""
    run = raft_groups_run()
    run.put("a", 1, 1.0, 1.01)
    run.op("p1", "put", {"queue": "r", "id": "b", "producer": "p1"}, 2.0, 2.01, "ok", {"seq": 1, "duplicate": False})
    run.op("c1", "receive", {"queue": "q", "group": "default", "max": 1, "lease_ms": LEASE_MS}, 3.0, 3.01, "ok",
           {"messages": [{"seq": 1, "receipt": "x1", "id": "a", "deliveries": 1, "put_at_ms": 50_000}]})
    run.op("c2", "receive", {"queue": "r", "group": "default", "max": 1, "lease_ms": LEASE_MS}, 3.0, 3.01, "ok",
           {"messages": [{"seq": 1, "receipt": "x1", "id": "b", "deliveries": 1, "put_at_ms": 59_000}]})
    assert verdicts(run.report())["log_time_not_ahead"].ok
    run.put("c", 2, 4.0, 4.01)                      # group 0's log time jumps 9 s in 3 s
    run.op("c1", "receive", {"queue": "q", "group": "default", "max": 1, "lease_ms": LEASE_MS}, 5.0, 5.01, "ok",
           {"messages": [{"seq": 2, "receipt": "x2", "id": "c", "deliveries": 1, "put_at_ms": 62_000}]})
    assert verdicts(run.report())["log_time_not_ahead"].violations == 1


# judged from the digests: an answer whose own verdict says agree proves nothing more
@pytest.mark.parametrize("second_group_digests, ok", [({"n1": "c", "n2": "c"}, True), ({"n1": "c", "n2": None}, False),
                                                      ({"n1": "c", "n2": "d"}, False)])
def test_replicas_agree_in_every_raft_group(second_group_digests, ok):
    run = Run()
    run.h.event("note", what="drain", complete=True)
    groups = [{"group": 0, "token": "t0", "digests": {"n1": "a", "n2": "a"}, "agree": True},
              {"group": 1, "token": "t1", "digests": second_group_digests, "agree": True}]
    run.op("checker", "verify", None, 100, 100.5, "ok", {"agree": True, "digests": groups[0]["digests"], "groups": groups})
    run.op("checker", "verify-cli", None, 101, 101.5, "ok", {"exit": 0, "output": ""})
    assert verdicts(run.report())["replicas_agree"].ok is ok


# ---- the backlog stored before the faults (chaos/backlog.py) ------------------------------------

def backlog_run(count: int, messages: list[dict] | None) -> Run:
    """A clean run with a backlog of `count`, browsed after the faults as `messages` (None: never read)."""
    run = clean_run()
    run.h.event("backlog", queue=backlog.BACKLOG_QUEUE, count=count)
    if messages is not None:
        run.h.event("backlog_read", queue=backlog.BACKLOG_QUEUE, **backlog.tally(count, messages))
    return run


def stored(numbers) -> list[dict]:
    return [{"seq": seq, "body": backlog.body_of(n)} for seq, n in enumerate(numbers, start=1)]


def test_a_run_without_a_backlog_passes_its_verdict():
    assert verdicts(clean_run().report())["backlog_intact"].ok


def test_a_backlog_read_back_whole_passes():
    verdict = verdicts(backlog_run(5, stored(range(5))).report())["backlog_intact"]
    assert verdict.ok and "5 read back intact" in verdict.detail


@pytest.mark.parametrize("messages, violations", [
    (stored([0, 1, 3, 4]), 1),                                                  # one lost
    (stored([0, 1, 2, 3]) + [{"seq": 9, "body": backlog.body_of(4)[:-1] + "X"}], 2),   # one changed, so lost
    (stored([0, 1, 2, 3, 4, 4]), 1),                                            # one stored twice
    (stored(range(5)) + [{"seq": 9, "body": b"\x00" * 100}], 1),                # one that was never put
])
def test_a_backlog_missing_changed_or_doubled_fails_with_its_count(messages, violations):
    verdict = verdicts(backlog_run(5, messages).report())["backlog_intact"]
    assert not verdict.ok and verdict.violations == violations, verdict


def test_a_backlog_never_read_back_fails():
    assert not verdicts(backlog_run(5, None).report())["backlog_intact"].ok


def churn_run(placed: dict) -> Run:
    """A clean run whose churn queues ended as `placed` (queue -> {"groups", "catalog"}, or unread)."""
    run = clean_run()
    run.h.event("churn", queues=sorted(placed), answers={"put 201": 40, "delete 204": 30, "delete 404": 25})
    run.h.event("placement", queues=placed)
    return run


def test_a_run_with_one_group_has_no_churn_and_passes_its_verdict():
    verdict = verdicts(clean_run().report())["queue_in_one_group"]
    assert verdict.ok and "one Raft group" in verdict.detail


def test_churn_queues_each_in_their_catalog_group_or_gone_with_their_names_pass():
    verdict = verdicts(churn_run({"churn-0": {"groups": [2], "catalog": 2},
                                  "churn-1": {"groups": [], "catalog": None}}).report())["queue_in_one_group"]
    assert verdict.ok and verdict.detail.startswith("2 churn queues (40 puts and 30 deletes done): 1 live"), verdict


@pytest.mark.parametrize("where", [
    {"groups": [1, 3], "catalog": 1},      # one queue in two groups
    {"groups": [1], "catalog": None},      # a live queue the catalog forgot: the next router makes a second
    {"groups": [1], "catalog": 2},         # a queue where the catalog does not place it
    {"groups": [], "catalog": 0},          # a deleted queue's name never left the catalog
])
def test_a_churn_queue_in_two_groups_or_astray_from_the_catalog_fails(where):
    verdict = verdicts(churn_run({"churn-0": {"groups": [0], "catalog": 0}, "churn-1": where}).report())[
        "queue_in_one_group"]
    assert not verdict.ok and verdict.violations == 1 and verdict.examples == [{"queue": "churn-1", **where}]


def test_churn_queues_never_located_fail():
    verdict = verdicts(churn_run({"unread": "GET /v1/queues?group=1: 503"}).report())["queue_in_one_group"]
    assert not verdict.ok and "never read" in verdict.detail


# ---- bodies_as_put -----------------------------------------------------------------------

def body(mid: str, n: int) -> dict:
    return {"id": mid, "p": "p1", "n": n}


def bodies_run(served: list[tuple]) -> Run:
    """a (seq 1) and b (seq 2) put with their bodies, c's put of unknown outcome; then `served`
    received: (id, seq, body) each."""
    run = Run()
    run.put("a", 1, 0.0, body=body("a", 1))
    run.put("b", 2, 0.1, body=body("b", 2))
    run.put("c", None, 0.2, type="info", body=body("c", 3))
    run.receive([(mid, seq, 1, served_body) for mid, seq, served_body in served], 1.0)
    run.healed()
    return run


def test_bodies_served_as_put_pass_and_are_counted():
    report = bodies_run([("a", 1, body("a", 1)), ("b", 2, body("b", 2)), ("c", 3, body("c", 3))]).report()
    v = verdicts(report)["bodies_as_put"]
    assert v.ok and v.detail.startswith("3 bodies served compared with their puts, 0 changed"), v
    assert report.summary["changed_bodies"] == 0


@pytest.mark.parametrize("served", [
    ("a", 1, body("a", 7)),          # a digit flipped: the seq names the put, whose body differs
    ("a", 1, body("a", 1) | {"p": "q1"}),
    ("b", 1, body("b", 2)),          # another put's body under a's seq
    ("c", 3, body("c", 2)),          # no seq known: the puts attempted with the id it names
    ("d", 4, body("d", 4)),          # an id nobody put
])
def test_a_body_served_that_differs_from_its_put_fails(served):
    report = bodies_run([("b", 2, body("b", 2)), served]).report()
    v = verdicts(report)["bodies_as_put"]
    assert not v.ok and v.violations == 1 and report.summary["changed_bodies"] == 1, v
    assert v.examples[0]["served"] == served[2]


def test_changed_bodies_of_the_backlog_count_too():
    run = backlog_run(5, stored([0, 1, 2, 3]) + [{"seq": 9, "body": backlog.body_of(4)[:-1] + "X"}])
    report = run.report()
    v = verdicts(report)["bodies_as_put"]
    assert not v.ok and v.violations == 1 and "backlog: 1 changed" in v.detail
    assert report.summary["changed_bodies"] == 1


def test_a_history_without_bodies_compares_none():
    v = verdicts(clean_run().report())["bodies_as_put"]
    assert v.ok and v.detail.startswith("0 bodies served compared")


# ---- writes_resume -----------------------------------------------------------------------

def resume_run(puts: list[tuple[float, float, str]], raft_groups=1) -> Run:
    """A fault from 10 s to 12 s, then puts (invoked, answered, outcome) to queue q (group 0)."""
    run = raft_groups_run(raft_groups) if raft_groups > 1 else Run()
    fault(run, 1, 10.0, 12.0, kind="bit-rot")
    for n, (start, end, type) in enumerate(puts):
        run.put(f"m{n}", n + 1 if type == "ok" else None, start, end, type)
    return run


def test_writes_acknowledged_soon_after_a_fault_ends_pass_and_the_time_is_reported():
    report = resume_run([(11.9, 12.5, "ok"), (12.1, 12.4, "info"), (12.2, 12.9, "ok")]).report()
    v = verdicts(report)["writes_resume"]
    assert v.ok, v
    # the put sent before the end does not count, nor one of unknown outcome
    assert report.summary["resume_by_fault"] == [{"fault": 1, "kind": "bit-rot", "raft_group": 0,
                                                  "s": pytest.approx(0.9)}]
    assert report.summary["resume_max_s"] == pytest.approx(0.9)


@pytest.mark.parametrize("puts, seen", [
    ([(11.0, 12.5, "ok")], None),                                   # acknowledged after the end, sent before it
    ([(12.1, 12.2, "fail"), (12.3, 40.0, "info")], None),          # nothing acknowledged
    ([(12.1, 12.2 + WRITES_RESUME_S, "ok")], WRITES_RESUME_S + 0.2),  # too late
])
def test_writes_not_acknowledged_soon_after_a_fault_ends_fail(puts, seen):
    v = verdicts(resume_run(puts).report())["writes_resume"]
    assert not v.ok and v.violations == 1
    assert v.examples[0]["s"] == (None if seen is None else pytest.approx(seen))


def test_writes_must_resume_in_every_raft_group():
    run = resume_run([(12.1, 12.3, "ok")], raft_groups=2)          # to q, of group 0; r (group 1) never
    v = verdicts(run.report())["writes_resume"]
    assert not v.ok and v.violations == 1 and v.examples[0]["raft_group"] == 1
    run.put("r1", 1, 12.5, 13.0, queue="r")
    assert verdicts(run.report())["writes_resume"].ok


def test_skipped_faults_need_no_writes_after_them():
    run = Run()
    run.t = 10.0
    run.h.event("nemesis", f="start", fault=1, kind="disk-full", value={})
    run.h.event("nemesis", f="stop", fault=1, kind="disk-full", value={"skipped": "cannot mount"})
    assert verdicts(run.report())["writes_resume"].ok


# ---- the disk faults' own exceptions --------------------------------------------------------

SYNC_FAILED = ("fdatasync of /d/n2/raft/journal/seg-000000000001.log failed: Input/output error. What it was "
               "to make durable may be lost, and a second sync would say it was not (fsyncgate): nothing it "
               "covers is acknowledged; this process stops, to recover from what is on disk")


def test_the_critical_line_of_each_sync_the_nemesis_failed_is_no_failure():
    run = clean_run()
    run.t = 10.0
    run.h.event("nemesis", f="start", fault=1, kind="fsync-eio", value={})
    run.h.event("nemesis", f="stop", fault=1, kind="fsync-eio", value={"sync_failed": {"n2": 1}})
    run.h.event("log", node="n2", level="critical", line=SYNC_FAILED)
    v = verdicts(run.report())["nodes_never_fail"]
    assert v.ok and "1 more reporting a sync the nemesis failed" in v.detail, v
    run.h.event("log", node="n2", level="critical", line=SYNC_FAILED)     # a second: no fault made it fail
    run.h.event("log", node="n3", level="critical", line=SYNC_FAILED)     # a node no fault struck
    v = verdicts(run.report())["nodes_never_fail"]
    assert not v.ok and v.violations == 2


def give_up_run(give_up_at: float, first: int, regain: int) -> Run:
    """n1 committed 100 by 1 s; it logs at `give_up_at` that it gives up entries first..regain; its
    log ends at 40 at 5 s."""
    run = clean_run()
    run.op("monitor", "ready", None, 1.0, 1.05, "ok", {"last_log_index": 100, "commit_index": 100})
    run.h.event("log", node="n1", level="error", ts=(WALL_MS_AT_T0 + give_up_at * 1000) / 1000,
                line=f"journal /d/n1/raft/journal/seg-000000000001.log: damaged record at offset 330 (log index "
                     f"{first}) in a part of the log a sync made durable (synced entries up to index {regain} "
                     f"follow it). This node gives up entries {first} to {regain} and takes them again from the "
                     f"leader; until its log holds index {regain} again it neither votes nor stands for election")
    run.op("monitor", "ready", None, 5.0, 5.05, "ok", {"last_log_index": 40, "commit_index": 40})
    return run


def test_a_log_cut_back_over_damage_it_gave_up_is_no_shrink():
    v = verdicts(give_up_run(4.0, 41, 100).report())["log_never_shrinks"]
    assert v.ok and "1 give-ups of damaged entries" in v.detail, v


@pytest.mark.parametrize("give_up_at, first, regain", [
    (4.0, 41, 99),    # a floor above the index it must regain: it acknowledged what it no longer holds
    (4.0, 50, 100),   # its log ends below the entry before the damage (49)
    (6.0, 41, 100),   # said only after the reading
])
def test_a_log_cut_back_beyond_what_it_gave_up_is_a_shrink(give_up_at, first, regain):
    v = verdicts(give_up_run(give_up_at, first, regain).report())["log_never_shrinks"]
    assert not v.ok and v.violations == 1


# ---- the disk faults' plan ------------------------------------------------------------------

def test_disks_go_bad_on_a_minority_of_every_group_drawn_from_the_seed():
    ids = ["n1", "n2", "n3", "n4", "n5"]
    assert len(bad_disks(7, ids, 5)) == 2 and len(bad_disks(7, ids, 3)) == 1 and bad_disks(7, ids, 2) == []
    assert bad_disks(7, ids, 5) == bad_disks(7, ids, 5)
    assert {tuple(bad_disks(seed, ids, 5)) for seed in range(20)} != {tuple(bad_disks(7, ids, 5))}


def test_every_disk_fault_kind_is_planned_with_what_it_needs():
    faults = {f.kind: f for f in plan(seed=3, nodes=5, cycles=1, kinds=DISK_KINDS)}
    assert sorted(faults) == sorted(DISK_KINDS)
    for kind in ("bit-rot", "bit-rot-stopped", "fsync-eio", "short-write", "misdirected-write"):
        assert {"many", "pick", "leader"} <= set(faults[kind].params), kind
    assert 3 <= faults["bit-rot"].params["records"] <= 12 and "seed" in faults["bit-rot-stopped"].params
    assert faults["disk-full"].params["headroom_kib"] >= 0
