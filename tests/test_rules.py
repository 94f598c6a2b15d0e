"""The rule matcher (statemachine/rules.py, wire_format's patterns) under Hypothesis: a request is
allowed iff some rule allows it, a pattern stands for exactly the names its glob does, and what
a principal keeps allows exactly what it was given."""

import re

from hypothesis import given, settings, strategies as st

from raftq.statemachine.rules import (ACTIONS, CLUSTER_ACTIONS, QUEUE_ACTIONS, ROLE_RULES, allows, check_rules,
                                      normalized, patterns)
from raftq.wire_format import is_name, is_pattern, pattern_matches

# A small alphabet, so that generated names and patterns meet often
CHARS = "ab-."
names = st.text("ab", min_size=1, max_size=1).flatmap(
    lambda first: st.text(CHARS, max_size=10).map(lambda rest: first + rest))
pattern_texts = st.text("ab*", min_size=1, max_size=1).flatmap(
    lambda first: st.text(CHARS + "*", max_size=10).map(lambda rest: first + rest)).filter(is_pattern)
rules_of = st.lists(st.fixed_dictionaries({
    "actions": st.lists(st.sampled_from(ACTIONS), min_size=1, max_size=4),
    "queues": st.lists(pattern_texts, min_size=1, max_size=3)}), max_size=4)


def glob(pattern: str) -> re.Pattern:
    """The oracle: a pattern as a regular expression, each star any run of characters."""
    return re.compile("".join(".*" if c == "*" else re.escape(c) for c in pattern), re.S)


@settings(max_examples=500)
@given(pattern_texts, names)
def test_a_pattern_matches_exactly_the_names_its_glob_does(pattern, name):
    assert pattern_matches(pattern, name) == (glob(pattern).fullmatch(name) is not None)


@given(names, st.data())
def test_a_name_with_any_of_its_runs_replaced_by_stars_matches_it(name, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(name)), max_size=6)))
    pieces, last = [], 0
    for start, end in zip(cuts[::2], cuts[1::2]):
        pieces += [name[last:start], "*"]
        last = end
    pattern = "".join(pieces) + name[last:]
    if is_pattern(pattern):
        assert pattern_matches(pattern, name), (pattern, name)


@settings(max_examples=300)
@given(rules_of, st.sampled_from(ACTIONS), names)
def test_a_request_is_allowed_iff_some_rule_allows_it(rules, action, queue):
    by_oracle = any(action in rule["actions"] and any(glob(p).fullmatch(queue) for p in rule["queues"])
                    for rule in rules)
    assert allows(rules, action, queue) == by_oracle
    assert allows(normalized(rules), action, queue) == by_oracle
    # with no queue named: allowed on some queue
    assert allows(rules, action) == any(action in rule["actions"] for rule in rules)
    assert (queue_matches_some := any(glob(p).fullmatch(queue) for p in patterns(rules, action))) == by_oracle, \
        queue_matches_some


@given(rules_of)
def test_generated_rules_are_valid_and_kept_rules_allow_the_same(rules):
    assert check_rules(rules) is None
    kept = normalized(rules)
    assert check_rules(kept) is None and normalized(kept) == kept


def test_the_roles_of_the_bootstrap_tokens():
    assert all(allows(ROLE_RULES["admin"], action, "any-queue") for action in ACTIONS)
    assert {a for a in ACTIONS if allows(ROLE_RULES["data"], a, "q")} == {"put", "receive", "browse", "producers"}
    assert {a for a in ACTIONS if allows(ROLE_RULES["metrics"], a)} == {"metrics"}


def test_malformed_rules_are_refused_naming_what_is_wrong():
    for rules, words in (("x", "a list"), ([{"actions": ["put"]}], "needs queues"),
                         ([{"actions": [], "queues": ["*"]}], "non-empty list"),
                         ([{"actions": ["publish"], "queues": ["*"]}], "non-empty list"),
                         ([{"actions": ["put"], "queues": ["-x"]}], "patterns"),
                         ([{"actions": ["put"], "queues": ["a" * 129]}], "patterns"),
                         ([{"actions": ["put"], "queues": ["*" * 9]}], "at most 8"),
                         ([{"actions": ["put"], "queues": []}], "1 to"),
                         ([{"actions": ["put"], "queues": ["*"], "deny": True}], "an object"),
                         ([{"actions": ["put"], "queues": ["*"]}] * 65, "at most 64")):
        problem = check_rules(rules)
        assert problem is not None and problem["error"] == "bad_request" and words in problem["message"], rules
    # cluster actions alone need no patterns; a name is a pattern of itself alone
    assert check_rules([{"actions": list(CLUSTER_ACTIONS)}]) is None
    assert normalized([{"actions": ["cluster", "metrics", "cluster"]}]) == [{"actions": ["metrics", "cluster"],
                                                                            "queues": ["*"]}]


@given(names)
def test_every_name_is_a_pattern_standing_for_itself_alone(name):
    if is_name(name):
        assert is_pattern(name) and pattern_matches(name, name)
        assert not pattern_matches(name, name + "a") and not pattern_matches(name + "a", name)


def test_queue_actions_and_cluster_actions_partition_the_actions():
    assert set(QUEUE_ACTIONS) | set(CLUSTER_ACTIONS) == set(ACTIONS)
    assert not set(QUEUE_ACTIONS) & set(CLUSTER_ACTIONS)
