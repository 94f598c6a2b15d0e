"""Paused groups and rate limits (issue 51), one rule per test: a paused group is handed nothing
and its messages stay, until a log time or until resumed; a group's rate limit hands out at
most one second's worth at once and then its rate, in log time (docs/api.md, "Pausing a group")."""

import pytest

from raftq.statemachine import StateMachine
from tests.test_statemachine_rules import T0, Machine, msg


@pytest.fixture
def m():
    machine = Machine()
    machine.ok("create_queue", queue="q", config={"lease_ms": 1_000})
    machine.ok("add_group", queue="q", group="audit", start="earliest")
    return machine


def pause(m, group="default", **fields):
    return m.ok("patch_group", queue="q", group=group, paused=True, **fields)


def test_a_paused_group_gets_nothing_while_the_others_go_on_and_its_messages_stay(m):
    m.put("q", msg("a"), msg("b"))
    assert pause(m)["paused"] is True
    assert m.receive("q") == []
    assert [r["body"] for r in m.receive("q", group="audit")] == ["a", "b"]
    assert m.stats("q")["groups"]["default"]["depth"] == 2
    assert m.sm.has_ready("q", "default") is False        # a long poll is not woken for it
    assert m.ok("patch_group", queue="q", group="default", paused=False)["paused"] is False
    assert [r["body"] for r in m.receive("q")] == ["a", "b"]


def test_a_pause_for_a_while_ends_at_that_log_time_and_a_tick_falls_due_then(m):
    m.put("q", msg())
    assert pause(m, for_ms=5_000)["resume_at_ms"] == T0 + 5_000
    assert m.sm.next_timer() == T0 + 5_000
    m.now = T0 + 4_999
    assert m.receive("q") == []
    m.tick(T0 + 5_000)
    assert m.stats("q")["groups"]["default"]["paused"] is False
    assert len(m.receive("q")) == 1


def test_a_pause_until_a_log_time_and_one_already_past(m):
    m.put("q", msg())
    assert pause(m, until_ms=T0 + 200)["resume_at_ms"] == T0 + 200
    assert m.receive("q") == []
    m.now = T0 + 200
    assert len(m.receive("q")) == 1
    assert pause(m, until_ms=T0 - 1) == {**m.sm.group_info("q", "default"), "paused": False}


def test_a_pause_without_an_end_lasts_until_resumed(m):
    m.put("q", msg())
    assert pause(m)["resume_at_ms"] is None
    m.tick(T0 + 10 ** 9)
    assert m.receive("q") == []


def test_leases_held_when_paused_can_be_acked_and_expired_ones_wait_for_the_resume(m):
    m.put("q", msg("a"), msg("b"))
    a, b = m.receive("q")
    pause(m)
    assert m.ack("q", a["receipt"])["acked"] == 1
    m.tick(T0 + 2_000)                        # b's lease ran out: ready, not handed out
    assert m.stats("q")["groups"]["default"]["depth"] == 1
    assert m.receive("q") == []
    m.ok("patch_group", queue="q", group="default", paused=False)
    assert [(r["body"], r["deliveries"]) for r in m.receive("q")] == [("b", 2)]


def test_a_rate_limit_hands_out_a_seconds_worth_then_its_rate_in_log_time(m):
    m.put("q", *[msg(str(i)) for i in range(30)])
    assert m.ok("patch_group", queue="q", group="default", rate_limit=10)["rate_limit"] == 10
    assert len(m.receive("q", n=100)) == 10       # a full bucket: one second's worth
    assert m.receive("q", n=100) == []
    assert m.sm.has_ready("q", "default") is False
    assert m.sm.next_timer() == T0 + 100        # when the next delivery may go: a tick wakes long polls
    m.now = T0 + 99
    assert m.receive("q") == []
    m.now = T0 + 100
    assert len(m.receive("q", n=100)) == 1
    m.tick(T0 + 650)                            # 5.5 more tokens, as of the machine's log time
    assert m.sm.ready_count("q", "default") == 5
    assert len(m.receive("q", n=100)) == 5
    m.now = T0 + 700                            # the half left plus half of one more
    assert len(m.receive("q", n=100)) == 1


def test_over_any_span_of_log_time_a_limited_group_gets_at_most_its_rate_plus_one_seconds_worth():
    machine = Machine()
    machine.put("q", *[msg(str(i)) for i in range(2_000)])
    machine.ok("patch_group", queue="q", group="default", rate_limit=50)
    handed_at = []
    for step in range(400):                  # a greedy consumer every 7 ms for 2.8 s
        machine.now = T0 + 7 * step
        handed_at += [machine.now] * len(machine.receive("q", n=1_000))
    for start in range(0, 2_800, 100):
        for span in (100, 500, 1_000, 2_000):
            within = sum(start <= at < start + span for at in handed_at)
            assert within <= 50 * span // 1_000 + 50
    assert len(handed_at) == 50 + 50 * (7 * 399) // 1_000     # exactly the rate, after the first bucket


def test_a_rate_limit_set_again_keeps_its_bucket_and_null_lifts_it(m):
    m.put("q", *[msg(str(i)) for i in range(10)])
    m.ok("patch_group", queue="q", group="default", rate_limit=2)
    assert len(m.receive("q", n=10)) == 2
    m.ok("patch_group", queue="q", group="default", rate_limit=2)
    assert m.receive("q", n=10) == []
    assert m.ok("patch_group", queue="q", group="default", rate_limit=None)["rate_limit"] is None
    assert len(m.receive("q", n=10)) == 8


def test_pauses_and_rate_limits_survive_a_snapshot(m):
    m.put("q", *[msg(str(i)) for i in range(5)])
    pause(m, for_ms=1_000)
    m.ok("patch_group", queue="q", group="audit", rate_limit=2)
    m.receive("q", group="audit")
    restored = StateMachine()
    restored.restore(m.sm.snapshot())
    assert restored.snapshot() == m.sm.snapshot()
    m.sm = restored
    assert m.receive("q") == [] and m.receive("q", group="audit") == []
    m.now = T0 + 1_000
    assert len(m.receive("q")) == 5
    assert len(m.receive("q", group="audit")) == 2


@pytest.mark.parametrize("fields", [
    {}, {"paused": "yes"}, {"paused": False, "for_ms": 10}, {"paused": True, "for_ms": 0},
    {"paused": True, "for_ms": 10, "until_ms": 10}, {"until_ms": 10}, {"paused": True, "until_ms": -1},
    {"rate_limit": 0}, {"rate_limit": 1_000_001}, {"rate_limit": 2.5}])
def test_a_malformed_group_patch_is_refused_and_changes_nothing(m, fields):
    before = m.sm.snapshot()
    m.fails("bad_request", "patch_group", queue="q", group="default", **fields)
    assert m.sm.snapshot() == before


def test_a_patch_of_a_missing_group_or_queue_is_not_found(m):
    m.fails("not_found", "patch_group", queue="q", group="nope", paused=True)
    m.fails("not_found", "patch_group", queue="nope", group="default", paused=True)
