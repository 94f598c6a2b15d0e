"""Mutation run: plant one known bug at a time and check that the tests catch it.

Each mutant names a guarantee of docs/guarantees.md (or a finding of issue 13),
one exact piece of source and its replacement, and the tests that must fail
with it. The run copies the working tree (tracked and untracked files, not
.venv or results) to a temporary directory, checks that those tests pass there
unmutated, then applies each mutant in the copy, runs its tests, and restores
the file. The working tree itself is never touched.

    .venv/bin/python tests/mutate.py              # every mutant (make mutate)
    .venv/bin/python tests/mutate.py NAME ...     # some of them
    .venv/bin/python tests/mutate.py --list

Output: one line per mutant, a table, and as the last line one JSON object
({"killed", "survived", "mutants": {name: "killed" | "survived"}}). Exit 1 if
any mutant survived.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_TIMEOUT_S = 600
# The model test's examples are cut down: each mutant below is caught within them.
# The copy has no .git: a test that exports an older revision (tests/test_operations.py) reads
# this checkout's history.
ENV = {"RAFTQ_MODEL_EXAMPLES": "60", "GIT_DIR": str(ROOT / ".git")}


@dataclass(frozen=True)
class Mutant:
    name: str
    guarantee: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


T_API = "tests/test_api.py::"
T_CLI = "tests/test_cli.py::"
T_DUR = "tests/test_durability.py::"
T_CON = "tests/test_consensus.py::"
T_JRN = "tests/test_journal.py::"
T_REC = "tests/test_records.py::"
T_CST = "tests/test_consensus_storage.py::"
T_DSK = "tests/test_disk_faults.py::"
T_FLT = "tests/test_faults.py::"
T_SST = "tests/test_security_stream.py::"
T_STG = "tests/test_statemachine_staging.py::"
T_SSG = "tests/test_security_staging.py::"
T_SEC = "tests/test_security_sqs.py::"
T_ALM = "tests/test_disk_alarm.py::"
T_CHK = "tests/test_chaos_checker.py::"
T_PRN = "tests/test_principals.py::"
T_SPP = "tests/test_spark_principal.py::"
RULES = ("tests/test_statemachine_rules.py", "tests/test_statemachine_model.py")
T_MODEL = "tests/test_statemachine_model.py"
T_PRI = "tests/test_statemachine_priorities.py::"
T_BOF = "tests/test_statemachine_backoff.py::"
T_PAU = "tests/test_statemachine_pauses.py::"
T_RET = "tests/test_statemachine_retention.py::"

MUTANTS = [
    # ---- the mutants issue 13 found surviving ------------------------------------------------
    Mutant("durability-all-never-waits", "durability=all waits for every connected voter",
           "api/messages.py",
           "lagging = await app[GROUPS].engines[group].replicated_everywhere(index, timeout)", "lagging = []",
           (T_DUR + "test_durability_all_is_answered_only_after_a_lagging_voter_caught_up",)),
    Mutant("node-fsync-off", "the production node fsyncs every append",
           "engine/node.py", "secret=cluster.secret,", "secret=cluster.secret, fsync=False,",
           (T_API + "test_health_and_cluster_view", T_CLI + "test_cluster_status_table_and_json",
            T_DUR + "test_a_production_node_fdatasyncs_its_journal_before_it_answers_a_put")),
    Mutant("log-clock-is-wall-clock", "log time continues from the applied time, never the wall clock",
           "engine/node.py",
           "return max(self._machine.clock, self._base + int((time.monotonic() - self._mono) * 1000))",
           "return int(time.time() * 1000)",
           ("tests/test_log_clock.py", "tests/test_log_time.py::test_log_time_does_not_run_while_no_node_leads")),
    Mutant("submit-stamps-wall-clock", "log time does not run while no node leads",
           "engine/node.py", "try:\n                queued = self.committer.enqueue(stamped(encoded, self.clock.now_ms())",
           "try:\n                queued = self.committer.enqueue(stamped(encoded, int(time.time() * 1000))",
           ("tests/test_log_time.py::test_log_time_does_not_run_while_no_node_leads",)),
    Mutant("lead-lost-answered-503", "a read whose node loses the lead is sent on to the new leader",
           "api/app.py", "                    await after_lead_lost(again)\n                return await handler(request)\n",
           "                    raise\n                return await handler(request)\n",
           (T_API + "test_reads_and_receives_in_flight_as_the_lead_moves_are_sent_where_it_went",)),
    Mutant("receive-of-unknown-outcome-answered-503", "a receive whose outcome the lost lead made unknown is served again",
           "api/commands.py", "committed = await _committed(app, node, call, wait_s, unknown_served_again=True,",
           "committed = await _committed(app, node, call, wait_s,",
           (T_API + "test_receives_the_lead_lost_mid_round_are_served_again_not_left_unknown",)),
    Mutant("verify-lead-lost-is-a-bug", "a verify whose checkpoint the lost lead left unwritten is served again",
           "api/cluster.py", "token, digest = await take_checkpoint(request.app, group)",
           "token, digest = await node.checkpoint()",
           ("tests/test_operations.py::test_verify_while_the_lead_moves_gives_a_verdict_not_a_bug",)),
    # ---- the mutants issue 13 found caught ---------------------------------------------------------
    Mutant("stale-receipt-accepted", "an ack with a stale receipt changes nothing",
           "statemachine/queue.py", "if lease is None or lease[0] != token:", "if lease is None:", RULES),
    Mutant("keyed-replacement-of-received", "keyed replacement only replaces what no group received",
           "statemachine/queue.py", "if not self.rows.was_received(old_seq):", "if True:", RULES),
    Mutant("follower-truncates-short-batch", "a follower deletes entries only on a real conflict",
           "engine/raft/follower.py", "if same < len(entries) and same < have:", "if same < have:",
           (T_CON + "test_follower_truncates_only_on_a_real_conflict",)),
    Mutant("follower-ignores-terms", "a follower deletes entries on a real conflict (same index, other term)",
           "engine/raft/follower.py",
           "while same < len(entries) and same < have and log.index_and_term(base + 1 + same)[1] == entries[same][2]:",
           "while same < len(entries) and same < have:",
           (T_CON + "test_follower_truncates_only_on_a_real_conflict",)),
    Mutant("torn-record-accepted", "the first record with a bad checksum ends the log",
           "engine/storage/records.py", "    return len(payload) == length and zlib.crc32(payload, zlib.crc32(header[:_LENGTH.size])) == crc",
           "    return len(payload) == length",
           (T_JRN + "test_damage_before_the_last_segment_is_given_up_only_until_the_log_holds_it_again",
            T_REC + "test_the_reader_stops_at_the_first_bad_record")),
    Mutant("journal-skips-fdatasync", "an acknowledged write is in the fsynced journal",
           "engine/storage/records.py",
           "        try:\n            sync_fd(self.fd, self.path, data_only=True)\n        except SyncFailed as failed:\n"
           "            self.failed = failed\n            raise\n        self.dirty = False",
           "        self.dirty = False",
           (T_JRN + "test_a_power_cut_loses_exactly_what_was_not_synced",
            T_JRN + "test_every_add_is_fdatasynced_before_it_returns")),
    # ---- one per guarantee of docs/guarantees.md -----------------------------------------------------
    Mutant("follower-acks-before-sync", "a follower fsyncs before it acknowledges (in a tick, or a read on a put's path)",
           "engine/raft/follower.py",
           "            yield\n        self._send_replies()",
           "            yield\n            self._send_replies()",
           (T_CON + "test_a_follower_syncs_its_journal_before_any_acknowledgement",)),
    Mutant("vote-not-durable", "term and vote are durable before any message reflects them",
           "engine/storage/journal.py",
           "        # Raft: term and vote are durable before any message reflecting them.\n        self._write_meta()",
           "        self._meta_dirty = True",
           (T_JRN + "test_term_and_vote_are_on_disk_when_set_current_term_returns",)),
    Mutant("snapshot-not-synced-before-compaction", "the snapshot is fsynced before log entries are dropped",
           "engine/storage/journal.py",
           "        self._make_snapshot_durable()\n        kept = self._kept_after(entryTo)",
           "        kept = self._kept_after(entryTo)",
           (T_JRN + "test_the_snapshot_is_fsynced_before_the_entries_it_replaces_are_dropped",)),
    Mutant("damaged-snapshot-loaded", "a damaged snapshot is refused",
           "engine/storage/records.py", "    return len(payload) == length and zlib.crc32(payload, zlib.crc32(header[:_LENGTH.size])) == crc",
           "    return len(payload) == length",
           (T_CON + "test_a_damaged_snapshot_is_refused_and_restores_nothing",)),
    Mutant("torn-whole-file-accepted", "a record file read whole must be exactly what was written",
           "engine/storage/records.py", "            if len(header) < RECORD_HEADER.size:\n                raise DamagedFile",
           "            if False:\n                raise DamagedFile",
           (T_REC + "test_a_damaged_whole_file_is_refused",)),
    Mutant("snapshot-load-clears-the-tail", "entries after a snapshot survive a crash before the log was compacted",
           "engine/raft/consensus.py", "        self._drop_entries_before(prev)\n", "",
           (T_CON + "test_a_crash_between_snapshot_and_compaction_keeps_the_entries_after_the_snapshot",)),
    Mutant("no-compaction-at-close", "a node closed with a long log restarts from a snapshot",
           "engine/raft/consensus.py", "        await self._compact(timeout=60.0, over_bytes=",
           "        0 and await self._compact(timeout=60.0, over_bytes=",
           (T_CON + "test_a_node_closed_with_a_long_log_compacts_it_first_and_restarts_from_the_snapshot",)),
    Mutant("a-read-per-ready-socket", "sockets ready together cost one read: the read's poll reads them all",
           "engine/raft/ticking.py", "        if self._read_in_turn or self._stopped:\n            return\n",
           "        if self._stopped:\n            return\n",
           ("tests/test_ticking.py::test_sockets_ready_together_cost_one_read",)),
    Mutant("no-tick-after-a-read", "what a read brought that is news is acted on at once, not at the next deadline",
           "engine/raft/ticking.py", "        if tick or self._until_due() <= 0:\n", "        if self._until_due() <= 0:\n",
           ("tests/test_ticking.py::test_a_read_that_brought_news_is_followed_by_a_tick_that_acts_on_it",)),
    Mutant("routine-reads-tick-again", "a read of only routine messages (appends, their answers) runs no tick",
           "engine/raft/ticking.py", "            if not self._routine:\n", "            if True:\n",
           ("tests/test_ticking.py::test_a_read_of_only_routine_messages_runs_no_tick",)),
    Mutant("news-hidden-by-routine", "one message that is news among routine ones in a read is acted on at once",
           "engine/raft/ticking.py", "self._routine = routine if self._routine is None else self._routine and routine",
           "self._routine = routine",
           ("tests/test_ticking.py::test_one_message_that_is_news_among_routine_ones_is_acted_on_at_once",)),
    Mutant("lone-voter-commits-at-its-next-tick", "a group of one voter commits a write as it syncs it, not a heartbeat later",
           "engine/raft/node.py", "        if self._SyncObj__raftState == LEADER and not self._SyncObj__otherNodes:\n            self._commit_acknowledged()\n",
           "        pass\n",
           (T_CON + "test_a_lone_voter_commits_a_write_as_it_syncs_it_not_at_a_later_tick",)),
    Mutant("older-term-committed-by-counting", "only entries of the leader's own term commit by counting",
           "engine/raft/node.py",
           "        if log.index_and_term(index - log.index_and_term(0)[0])[1] != self._SyncObj__raftCurrentTerm:\n",
           "        if False:\n",
           (T_CON + "test_only_entries_of_the_leaders_term_commit_by_counting",)),
    Mutant("put-sent-to-a-follower-behind", "a follower that is behind is caught up by the ticks, not sent each put",
           "engine/raft/node.py",
           "if node in connected and next_indexes[node] == index and match[node] > 0]",
           "if node in connected]",
           (T_CON + "test_a_follower_behind_is_caught_up_by_the_ticks_and_sent_no_put_before",)),
    Mutant("membership-from-the-config-at-restart", "a restarted node counts by its log's membership from its first tick",
           "engine/raft/node.py",
           "            if change is not None:\n                self._SyncObj__doChangeCluster(change)\n        if journal.regain_index",
           "            pass\n        if journal.regain_index",
           (T_CON + "test_a_restarted_node_counts_by_its_logs_membership_from_its_first_tick",)),
    Mutant("membership-changed-again-at-apply", "applying a membership entry never brings back a configuration the log moved past",
           "engine/raft/node.py", "            return None     # the configuration changed when the entry was appended, or at open\n",
           "            pass\n",
           (T_CON + "test_a_restarted_node_counts_by_its_logs_membership_from_its_first_tick",)),
    Mutant("bodies-read-only-by-a-leader", "a receive answered by a proposer deposed as it applied carries the bodies",
           "engine/node.py", "            if err is None and isinstance(applied, tuple):\n",
           "            if err is None and isinstance(applied, tuple) and self.consensus.is_leader():\n",
           ("tests/test_engine_answers.py",)),
    Mutant("a-hand-off-lets-the-log-grow", "a leader handing over takes no new entries (Raft thesis 3.10)",
           "engine/raft/consensus.py", "        if self._held is not None and self._refusal() is None:\n",
           "        if False:\n",
           (T_CON + "test_a_transfer_under_a_steady_stream_of_writes_lands_on_its_target_in_one_election",)),
    Mutant("a-removed-node-runs-on", "a node the cluster removed stops once a majority of its voters count it out",
           "api/removal.py", "                self._on_removed(disowned_by)\n                return\n", "                pass\n",
           ("tests/test_operations.py::test_a_node_removed_while_it_runs_stops_and_one_cut_off_keeps_running",)),
    Mutant("compaction-by-entries-only", "a node compacts once its log holds too many bytes",
           "engine/raft/node.py",
           "            if self.compactable_bytes() > self.compaction_min_bytes:",
           "            if False:",
           (T_CON + "test_compaction_by_journal_bytes_with_few_large_entries",)),
    Mutant("apply-the-whole-backlog-in-one-tick", "a tick applies for a bounded time, then heartbeats go out",
           "engine/raft/node.py", "                if monotonic() >= deadline:\n                    break\n", "",
           (T_CON + "test_a_backlog_of_slow_applies_costs_no_election",)),
    Mutant("acknowledgements-apply-without-a-budget", "applies run as acknowledgements arrive only within one budget per tick",
           "engine/raft/node.py", "            if now < self._acks_apply_until:\n", "            if True:\n",
           (T_CON + "test_a_backlog_of_slow_applies_costs_no_election",)),
    Mutant("stale-snapshot-loaded-over-the-log", "a snapshot of entries a follower holds leaves its log alone",
           "engine/raft/follower.py", "        if index < first or (index <= last and log.index_and_term(index - first)[1] == term):\n",
           "        if False:\n",
           (T_CON + "test_a_snapshot_of_entries_the_follower_holds_leaves_its_log_alone",)),
    Mutant("damaged-snapshot-taken", "a damaged snapshot from the leader leaves the follower's own in place",
           "engine/raft/follower.py", "            snapshot_file.check(snapshots.incoming, self_contained=True)\n", "",
           (T_CON + "test_a_damaged_snapshot_from_the_leader_leaves_the_followers_own_in_place",)),
    Mutant("idle-link-times-out", "a vote request goes out over a long idle link between followers",
           "engine/raft/wire.py",
           "if self.unanswered_since is not None and monotonic() - self.unanswered_since > self._TcpConnection__timeout:",
           "if monotonic() - self._TcpConnection__lastReadTime > self._TcpConnection__timeout:",
           (T_CON + "test_a_vote_request_goes_out_over_a_long_idle_link_between_followers",)),
    Mutant("lost-leader-waits-for-the-timeout", "a killed leader is replaced without waiting for the election timeout",
           "engine/raft/node.py",
           "            if soon < self._SyncObj__raftElectionDeadline:\n                self._SyncObj__raftElectionDeadline = soon\n",
           "",
           (T_CON + "test_followers_that_lose_their_leaders_connection_elect_without_waiting_for_the_timeout",)),
    Mutant("headers-kept-as-a-list", "stored messages are not tracked by the garbage collector",
           "statemachine/queue.py",
           "return None if headers is None else tuple(headers.items())",
           "return None if headers is None else list(headers.items())",
           ("tests/test_statemachine_memory.py::test_stored_messages_are_not_tracked_by_the_garbage_collector",)),
    Mutant("full-collections-visit-everything", "what survived a full collection is not visited again",
           "engine/pauses.py", "        gc.freeze()\n", "        pass\n",
           ("tests/test_pauses.py",)),
    Mutant("elect-before-reading", "a late follower reads its leader's heartbeats before it elects",
           "engine/raft/node.py",
           "            if not self._SyncObj__needLoadDumpFile:\n                self._poller.poll(0)\n", "",
           (T_CON + "test_a_follower_whose_tick_came_late_reads_its_leaders_heartbeats_before_electing",)),
    Mutant("apply-before-answering", "a follower answers an append before it applies what that append committed",
           "engine/raft/node.py",
           "            if self._replies:\n                self._flush_replies()\n", "",
           (T_CON + "test_a_follower_answers_an_append_before_it_applies_what_that_append_committed",)),
    Mutant("apply-exception-escapes", "a replicated apply that raises becomes a result",
           "engine/raft/consensus.py",
           "            return self._apply(entry)\n        except Exception as exc:",
           "            return self._apply(entry)\n        except ZeroDivisionError as exc:",
           (T_CON + "test_an_apply_that_raises_becomes_a_result_and_the_log_goes_on",)),
    Mutant("oversized-entry-accepted", "entries above the batch size are refused before the log",
           "engine/raft/consensus.py", "if len(entry) > self._max_entry_bytes:", "if False:",
           (T_CON + "test_refusals_before_the_log",)),
    Mutant("read-confirmed-by-older-answers", "a leader read is confirmed only by answers sent after it arrived",
           "engine/raft/read_index.py", "if asked_at > confirmed_up_to or read_index > applied:",
           "if read_index > applied:",
           (T_CON + "test_a_leader_cut_off_from_its_followers_confirms_no_read",)),
    Mutant("planner-gives-up-when-the-leader-dies", "a leader killed during a streaming read is a pause, not a failed query",
           "raftq/spark/ranges.py", "            except (OSError, http.client.HTTPException):\n                view = {}\n",
           "            except ZeroDivisionError:\n                view = {}\n",
           ("tests/test_spark_read.py::test_planning_survives_the_leader_dying_between_its_two_questions",)),
    Mutant("no-pre-vote", "a node cut off from the others does not depose a healthy leader",
           "engine/raft/node.py", "            self._ask_before_standing()\n", "",
           (T_CON + "test_a_follower_cut_off_from_the_leader_alone_does_not_depose_it",
            T_CON + "test_a_follower_cut_off_from_everyone_rejoins_without_an_election")),
    Mutant("pre-vote-granted-under-a-live-leader", "a follower that still hears its leader votes for nobody",
           "engine/raft/prevote.py", "               and not self._has_live_leader()\n", "",
           (T_CON + "test_a_follower_cut_off_from_the_leader_alone_does_not_depose_it",)),
    Mutant("pre-vote-refused-while-the-leader-link-is-closed", "a killed leader is replaced without waiting for the election timeout",
           "engine/raft/prevote.py", "leader is not None and self.isNodeConnected(leader)", "leader is not None",
           (T_CON + "test_followers_that_lose_their_leaders_connection_elect_without_waiting_for_the_timeout",)),
    Mutant("no-leader-lease", "a leader cut off from the majority stops before another can lead",
           "engine/raft/consensus.py", "return recent + 1 > (len(others) + 1) / 2", "return True",
           (T_CON + "test_a_leader_cut_off_from_the_majority_refuses_before_another_could_lead",)),
    Mutant("leader-never-steps-down", "a leader that no majority answers steps down and says it is cut off",
           "engine/raft/node.py", "            self._check_quorum()\n", "",
           (T_CON + "test_a_leader_cut_off_from_everyone_steps_down_and_says_it_is_cut_off",
            T_FLT + "test_an_isolated_leader_steps_down_and_refuses_writes_at_once")),
    Mutant("node-log-world-readable", "every file a node writes is its owner's only",
           "raftq/local.py", "    fd = os.open(path, flags | os.O_CREAT, 0o600)\n    os.fchmod(fd, 0o600)\n",
           "    fd = os.open(path, flags | os.O_CREAT, 0o644)\n",
           ("tests/test_security_auth.py::test_every_file_a_node_writes_is_its_owners_only",)),
    Mutant("stranger-warnings-unlimited", "what a stranger on the Raft port makes a node log is rate-limited",
           "engine/raft/wire.py", "if kind is None or (not kind[1] and now - kind[0] >= self.interval):", "if True:",
           ("tests/test_security_raft.py::test_hostile_connections_write_a_bounded_number_of_log_lines",)),
    Mutant("raft-port-ignores-the-group", "each Raft connection reaches the engine of the group it names",
           "raftq/raft_port.py", "handoff = self._handoffs.get(group)", "handoff = self._handoffs.get(0)",
           ("tests/test_groups.py::test_a_connection_with_a_bad_preamble_is_closed_at_once",
            "tests/test_groups.py::test_every_group_elects_one_leader_and_every_front_holds_every_engine")),
    Mutant("no-leader-balancing", "a group's leader hands over to its first live preference once that one is close",
           "engine/balance.py", '        return member if peer["match_index"] >= status["commit_index"] - CLOSE_ENTRIES else None\n',
           "        return None\n",
           ("tests/test_balance.py", "tests/test_groups.py::test_leaders_spread_after_start_and_again_after_a_node_dies_and_returns")),
    Mutant("balancer-passes-over-the-catching-up", "a group's leader waits for a live preference far behind rather than hand its lead to one after it",
           "engine/balance.py", '        return member if peer["match_index"] >= status["commit_index"] - CLOSE_ENTRIES else None\n',
           '        if peer["match_index"] >= status["commit_index"] - CLOSE_ENTRIES:\n            return member\n',
           ("tests/test_balance.py",)),
    Mutant("metrics-of-group-0-alone", "a node's /metrics counts the engines of every group it holds",
           "api/metrics.py", '"stats": _summed(stats)', '"stats": stats[0]',
           ("tests/test_groups.py::test_a_nodes_metrics_count_the_engines_of_every_group_it_holds",)),
    Mutant("misrouted-command-applied", "a command routed for another Raft group is refused on every replica",
           "statemachine/machine.py", "and cmd.get(\"raft_group\") != self.group_id:", "and False:",
           ("tests/test_statemachine_groups.py", "tests/test_statemachine_model.py")),
    Mutant("put-routed-before-its-body-is-checked", "a refused request places no name in a Raft group",
           "api/messages.py", "if node.auto_create and request.app[GROUPS].cached(name) is None:", "if False:",
           (T_API + "test_bad_input_is_refused_and_changes_nothing",)),
    Mutant("catalog-reassigns-a-name", "a queue name's Raft group changes only once its queue was deleted and the name released",
           "statemachine/catalog.py", "new = [name for name in wanted if name not in self.assigned]", "new = wanted",
           ("tests/test_statemachine_groups.py",)),
    Mutant("release-without-fence", "no router's view of the catalog older than a release makes the name a queue in two groups",
           "statemachine/release.py", "        if catalog_index < self.fence:\n", "        if False:\n",
           ("tests/test_name_release.py",)),
    Mutant("retiring-name-made-again", "a name leaving the catalog is made a queue in no group until it has left",
           "statemachine/release.py", "        if name in self.retiring:\n", "        if False:\n",
           ("tests/test_name_release.py",)),
    Mutant("release-out-of-turn", "a releaser that stalled between its steps makes the catalog forget no name made again since",
           "statemachine/catalog.py", "            if last is not None and fence < last[0]:\n", "            if False:\n",
           ("tests/test_name_release.py",)),
    Mutant("release-of-names-not-retired", "group 0 releases only names a replica of their group reads as retiring",
           "statemachine/release.py", "    if missing:\n", "    if False:\n",
           ("tests/test_name_release.py",)),
    Mutant("release-at-the-callers-fence", "group 0 releases names only at the fence they retired at",
           "statemachine/release.py", "    if seen[\"fence\"] != fence:\n", "    if False:\n",
           ("tests/test_name_release.py",)),
    Mutant("release-route-unchecked", "a release sent by hand of a live queue's name is refused",
           "api/catalog_release.py", "    if refusal is not None:\n", "    if False:\n",
           ("tests/test_security_limits.py::test_with_four_groups_a_deleted_queues_name_leaves_the_catalog_so_its_limit_bounds_queues",)),
    Mutant("release-finished-twice", "a late finish of a release lets no name go that retired again since",
           "statemachine/release.py", "        if in_turn and index <= self.fence:\n", "        if False:\n",
           ("tests/test_name_release.py",)),
    Mutant("front-stamps-any-view", "a command carries the age of the view that placed its queues in its group",
           "api/groups.py", "ages = [held[1] if held is not None and held[0] == group else 0",
           "ages = [1 << 62 if held is not None or True else 0",
           ("tests/test_routing.py::test_a_front_whose_catalog_lags_is_refused_by_the_fence_and_sends_the_put_where_the_queue_is_now",)),
    Mutant("fenced-request-not-routed-again", "a request a group refuses by its fence is routed again, not refused",
           "api/commands.py", "quota_refusal(principal, code, group, app))\n    await _check_placement(",
           "quota_refusal(principal, code, group, app))\n    0 and _check_placement(",
           ("tests/test_routing.py::test_a_front_whose_catalog_lags_is_refused_by_the_fence_and_sends_the_put_where_the_queue_is_now",
            "tests/test_routing.py::test_queues_deleted_and_made_again_under_puts_through_every_front_never_live_in_two_groups")),
    Mutant("unknown-release-refused-as-old", "a node whose release is not yet known makes a new feature's write "
           "a retry (503 release_unknown), not an upgrade refusal", "api/features.py",
           "if self._feature.unanswered is not None:", "if False:",
           ("tests/test_operations.py::test_a_node_not_yet_heard_from_makes_issue_51_writes_a_retry_not_an_upgrade_refusal",)),
    Mutant("release-before-every-node-has-it", "no node writes the name release's commands while a node runs an older release",
           "api/features.py", 'if self._feature not in (features or ()):', 'if False:',
           ("tests/test_operations.py::test_with_four_groups_a_name_leaves_the_catalog_only_once_every_node_runs_the_release_that_fences",)),
    Mutant("engine-feature-before-every-node-has-it", "no node writes relocate (or wall times in ticks) while "
           "a node runs an older release", "api/features.py", "allowed = await self._feature.everywhere()",
           "allowed = True",
           ("tests/test_operations.py::test_a_rolling_upgrade_keeps_serving_and_loses_nothing",)),
    Mutant("relocate-a-changed-reference", "a relocation moves only a message whose reference still names what "
           "the leader read: every body served is the one put",
           "statemachine/rows.py", "and self.ref_index[row] == old.index\n"
           "                and self.ref_offset[row] == old.offset and self.ref_length[row] == old.length\n"
           "                and self.ref_kind[row] == old.kind):",
           "and self.ref_index[row]):",
           ("tests/test_statemachine_model.py::test_relocations_in_random_logs_serve_every_body_as_it_was_put",
            "tests/test_statemachine_bodies.py::test_a_relocation_moves_only_references_that_still_name_what_it_read")),
    Mutant("relocate-a-changed-staged-reference", "a relocation moves only a staged message whose reference still "
           "names what the leader read", "statemachine/staging.py",
           'if not isinstance(message["body"], BodyRef) or message["body"] != old:',
           'if not isinstance(message["body"], BodyRef):',
           ("tests/test_statemachine_model.py::test_relocations_in_random_logs_serve_every_body_as_it_was_put",
            "tests/test_statemachine_bodies.py::test_a_staged_body_moves_and_its_commit_publishes_the_copy")),
    Mutant("never-relocates", "disk use follows live bytes: a kept entry is copied out of once its live bodies "
           "take less than half of it", "engine/relocation.py",
           "if not (self.allowed and self._node.is_leader()) or not self._worth_planning(up_to, live):\n"
           "                return", "if True:\n                return",
           ("tests/test_relocation.py", "tests/test_live_bytes.py", "tests/test_live_bytes_bench.py")),
    Mutant("relocates-live-entries", "relocation copies out of an entry only what takes less than half of it, "
           "so each copy frees more than it writes", "engine/relocation.py",
           "if size is None or copies[index] >= LIVE_SHARE * size:", "if size is None:",
           ("tests/test_relocation.py",)),
    Mutant("move-leaves-a-removed-node", "growing or shrinking ends with every group on the cluster's nodes only",
           "engine/placement.py", "for member in group_members if member not in held]", "for member in group_members if False]",
           ("tests/test_moves.py",)),
    Mutant("lone-replica-never-moves", "a group of one replica moves too: its add is forced, the only way to move its copy",
           "api/mover.py", 'forced = "&force=true" if len(members[group]) == 1 else ""', 'forced = ""',
           ("tests/test_cli.py::test_a_cluster_made_on_one_node_grows_to_three_with_the_cli",)),
    Mutant("stale-move-ends-another", "a replica move ends only as the move in progress, so a deposed mover changes nothing",
           "statemachine/catalog.py", "        if self.move != [group, source, target]:\n", "        if self.move is None:\n",
           ("tests/test_statemachine_groups.py",)),
    Mutant("routing-ignores-recorded-members", "fronts route by group 0's record of each group's members",
           "api/groups.py", "        if group > 0 and recorded is not None:\n", "        if False:\n",
           ("tests/test_groups.py::test_the_members_of_each_group_are_group_0s_record_not_the_config",)),
    Mutant("node-keeps-unrecorded-engines", "a node runs the engines of the groups group 0's record names it in, and no others",
           "raftq/server.py", "            for group in sorted(running - set(wanted)):\n", "            for group in []:\n",
           ("tests/test_groups.py::test_a_node_runs_the_engines_of_the_groups_the_record_names_it_in_and_no_others",)),
    Mutant("moved-source-keeps-voting", "a replica move removes its source from the group's Raft membership",
           "api/mover.py",
           '        await call_group_leader(self._app, "DELETE", f"/v1/cluster/nodes/{source}?group={group}", group=group)\n'
           '        await self._record(', "        await self._record(",
           ("tests/test_growth.py",)),
    Mutant("transaction-across-groups", "a request whose queues live in several Raft groups is refused cross_group",
           "api/groups.py", "    if len(groups) > 1:\n", "    if False:\n",
           ("tests/test_routing.py::test_with_four_groups_a_transaction_or_a_dead_letter_queue_across_groups_is_refused",)),
    Mutant("command-forwarded-across-terms", "a command enters the log only in the term it was stamped for",
           "engine/raft/node.py", "if not isinstance(ticket, Ticket) or self._node.leads(ticket.term):", "if True:",
           (T_CON + "test_an_entry_prepared_for_another_term_never_enters_the_log",)),
    Mutant("replayed-frames-accepted", "the Raft wire refuses replayed and forged frames",
           "engine/raft/wire.py", "if stamp < self.recvLastTimestamp:", "if False:",
           (T_CON + "test_the_wire_refuses_backward_timestamps_and_foreign_frames",)),
    Mutant("new-term-reuses-old-clock", "a new leader's log time stands still until its barrier",
           "engine/node.py", "return self._term == term", "return self._term is not None",
           ("tests/test_log_clock.py",)),
    Mutant("dedup-ignored", "a put whose id was stored within the dedup window stores nothing new",
           "statemachine/queue.py", "            if original is not None:", "            if False:", RULES),
    Mutant("dedup-split-misfiles-ids", "a remembered id is found in the bucket its hash names, after splits too",
           "statemachine/dedup.py", "(move if old[at + byte] >> bit & 1 else stay)",
           "(stay if old[at + byte] >> bit & 1 else move)", ("tests/test_statemachine_dedup.py",)),
    Mutant("tombstone-keeps-its-fields", "replicas agree (a removed message's row is the same on every replica)",
           "statemachine/rows.py",
           "put_at.held[row], expiry.held[row], index.held[row] = put_at.zero, expiry.zero, index.zero",
           "pass", RULES),
    Mutant("offset-column-holds-the-zero-marker", "replicas agree (a put time, expiry or log index reads back as given)",
           "statemachine/columns.py", "                if held != ZERO:", "                if True:",
           ("tests/test_statemachine_columns.py",)),
    Mutant("body-reference-off-by-one", "a stored body reads back as it was put (a reference names its own bytes)",
           "statemachine/bodies.py", "BodyRef(index, offset, len(needle), kind)",
           "BodyRef(index, offset + 1, len(needle), kind)", ("tests/test_statemachine_bodies.py",)),
    Mutant("reference-offsets-restored-byte-swapped", "a replica restored from a snapshot holds the same references",
           "statemachine/columns.py", '    if sys.byteorder == "big":\n        values.byteswap()',
           "    values.byteswap()",
           ("tests/test_statemachine_bodies.py",)),
    Mutant("streamed-record-without-its-header", "a snapshot's state, encoded into its file, reads back whole",
           "engine/storage/records.py", "        pwrite_all(self.fd, size + _LENGTH.pack(crc), start, self.path)\n", "",
           (T_REC + "test_a_streamed_payload_is_the_record_its_bytes_would_be",)),
    Mutant("snapshot-without-live-entries", "a stored body survives compaction, snapshot install and kill -9",
           "engine/raft/consensus.py", "        live = self._live_entries()\n", "        live = []\n",
           ("tests/test_bodies_on_disk.py",
            T_CON + "test_live_entries_stay_in_the_journal_and_a_follower_missing_them_gets_them_with_the_snapshot")),
    Mutant("compaction-drops-a-kept-segment", "a body survives compaction: the segments of named entries stay",
           "engine/storage/journal.py",
           "dead = [s for s in self._segment_sizes if s < start[0] and s not in needed]",
           "dead = [s for s in self._segment_sizes if s < start[0]]",
           (T_JRN + "test_compaction_keeps_the_segments_of_the_entries_the_snapshot_names",
            T_JRN + "test_after_every_compaction_no_named_entry_lies_in_a_deleted_segment")),
    Mutant("segment-rewrite-without-fsync", "a rewritten segment is durable before it replaces the old one",
           "engine/storage/journal.py", "records.write_file(temporary, SEGMENT_MAGIC, copies(), tag=seq)",
           "records.write_file(temporary, SEGMENT_MAGIC, copies(), tag=seq, sync=False)",
           (T_JRN + "test_a_rewritten_segment_is_synced_before_it_replaces_the_old_one",)),
    Mutant("journal-holds-the-whole-tail", "a node's memory is bounded by its configuration, not by its log",
           "engine/storage/journal.py",
           "while self._recent_bytes > self._recent_limit and len(self._recent) > 1:", "while False:",
           (T_JRN + "test_the_commands_held_in_memory_are_bounded_by_recent_bytes_whatever_the_log_holds",)),
    Mutant("journal-reads-a-truncated-command", "a follower's log after a conflict is the leader's",
           "engine/storage/journal.py",
           "        self._synced = self._marked = self._last\n        self._forget_commands()",
           "        self._synced = self._marked = self._last",
           (T_JRN + "test_a_truncated_then_rewritten_entry_reads_back_as_rewritten",)),
    Mutant("expired-lease-never-redelivered", "at least once: an expired lease is delivered again",
           "statemachine/queue.py", "for seq in group.expired_leases(clock):",
           "for seq in []:", RULES),
    Mutant("ready-out-of-order", "within a group, ready messages go out in seq order",
           "statemachine/ready.py", "first = self.first = flags.find(READY, at + 1)",
           "first = self.first = flags.rfind(READY, at + 1)", RULES),
    Mutant("tx-acks-despite-stale-receipt", "a transaction is applied entirely or not at all",
           "statemachine/machine.py", "        if stale:\n            return error(STALE_RECEIPT",
           "        if False:\n            return error(STALE_RECEIPT", RULES),
    Mutant("malformed-receipt-called-stale", "a receipt raftq never issued is 400 invalid_receipt, not stale",
           "api/messages.py", "invalid = [r for r in receipts if not well_formed(r)]", "invalid = []",
           ("tests/test_user_errors.py",)),
    Mutant("replica-clock-goes-back", "replicas take clock = max(clock, now_ms)",
           "statemachine/machine.py", 'if cmd["now_ms"] > self.clock:', "if True:", RULES),
    Mutant("durability-leader-claimed", "the answer's durability names what was given",
           "api/messages.py", '        return "quorum", None', "        return durability, None",
           (T_API + "test_durability_leader_is_served_and_answered_as_quorum",)),
    Mutant("durability-all-shortfall-hidden", "an answer never claims a durability it did not reach",
           "api/messages.py", '    return "quorum", {', '    return "all", {',
           (T_DUR + "test_durability_all_not_reached_in_time_says_quorum_and_the_clients_raise",)),
    Mutant("strong-read-without-no-op", "a strong read first puts a no-op through the log",
           "api/commands.py", 'if level == "strong":', "if False:",
           (T_DUR + "test_a_strong_read_puts_one_no_op_through_the_log_and_a_leader_read_none",)),
    Mutant("checker-misses-stale-reads", "the chaos checker's no_stale_reads sees a stale read",
           "chaos/checker.py", 'if known and (o.result.get("last_seq") or 0) < highest[known - 1]:', "if False:",
           ("tests/test_chaos_checker.py",)),
    Mutant("power-cut-keeps-unsynced-bytes", "power-loss tests drop what was not fsynced",
           "chaos/sync_ledger.py", "        if size > keep:", "        if False:",
           (T_JRN + "test_a_power_cut_loses_exactly_what_was_not_synced",)),
    Mutant("shutdown-without-hand-over", "a leader shutting down hands over first",
           "engine/node.py", "moved = await self.transfer_leadership(2.0)",
           "moved = False", (T_FLT + "test_sigterm_leader_hands_over_and_exits_cleanly",)),
    Mutant("idle-queue-forgets-no-ids", "an emptied queue still ticks to forget its remembered ids",
           "statemachine/queue.py", "        if self.dedup:\n            times.append(self.dedup.oldest_put",
           "        if self.dedup and self.rows:\n            times.append(self.dedup.oldest_put",
           ("tests/test_statemachine_rules.py::test_an_emptied_queue_still_ticks_to_forget_the_ids_it_remembers",)),
    Mutant("due-index-misses-a-dead-letter-queue", "timers fire: a tick fires every queue with a timer due",
           "statemachine/machine.py", "                self._advance(target)\n",
           "                target.advance(self.clock)\n",
           ("tests/test_statemachine_rules.py::test_a_dead_letter_expires_by_its_dead_letter_queue_s_ttl_on_a_tick",)),
    Mutant("due-index-misses-a-redrive-source", "timers fire: a tick fires every queue with a timer due",
           "statemachine/redrive.py", "machine._advance(target)", "target.advance(machine.clock)",
           ("tests/test_statemachine_rules.py::test_a_redriven_message_expires_by_its_source_queue_s_ttl_on_a_tick",)),
    Mutant("due-index-answers-before-settling", "timers fire: a tick fires every queue with a timer due",
           "statemachine/due.py", "        self.settle()\n        names = set(self.parked)",
           "        names = set(self.parked)", RULES),
    Mutant("long-poll-never-woken", "a waiting receive is woken by the apply that makes a message ready",
           "engine/long_poll.py", "if self._loop is not None and self._waiters and not self._wake_scheduled:", "if False:",
           (T_API + "test_long_poll_wakes_on_put", T_API + "test_waiting_receives_ride_in_the_puts_log_entry")),
    Mutant("receives-never-ride-a-put", "a waiting receive is written in the log entry of the put it waits for",
           "engine/node.py", "                if ride is not None and self.long_polls.waits_on(ride):\n", "                if False:\n",
           (T_API + "test_waiting_receives_ride_in_the_puts_log_entry",)),
    Mutant("every-waiter-rides-a-put", "a put takes along one waiter of each consumer group, not all",
           "engine/long_poll.py", "                waiter = waiting.pop(0)\n                if not waiting:\n                    self._forget(key)\n                waiter.woken.set_result(queue_receive(dict(waiter.command), term))\n",
           "                while len(waiting) > 1:\n                    waiting.pop(0).woken.set_result(queue_receive(dict(waiting[0].command), term))\n                    self.receives_with_a_put += 1\n                waiter = waiting.pop(0)\n                self._forget(key)\n                waiter.woken.set_result(queue_receive(dict(waiter.command), term))\n",
           (T_API + "test_waiting_receives_ride_in_the_puts_log_entry",)),
    # ---- issue 21: what one client can take of a node -----------------------------------------
    Mutant("outbox-without-a-bound", "a streaming-wire client that never reads is slowed, not buffered for",
           "api/stream.py", "self.budget = Budget(MAX_OUTBOX_FRAMES, MAX_OUTBOX_BYTES)",
           "self.budget = Budget(1 << 62, 1 << 62)",
           (T_SST + "test_a_client_that_floods_answered_frames_and_never_reads_is_slowed_then_dropped",)),
    Mutant("stalled-client-kept", "a streaming-wire client that lets nothing be written is dropped",
           "api/stream.py", "elif time.monotonic() - progressed >= stall_s:", "elif False:",
           (T_SST + "test_a_client_that_floods_answered_frames_and_never_reads_is_slowed_then_dropped",)),
    Mutant("subscriptions-without-a-cap", "one connection cannot take every long-poll slot",
           "api/stream.py", "if len(self.subscriptions) >= cap:", "if False:",
           (T_SST + "test_one_connection_subscribing_1100_times_leaves_others_their_long_polls",)),
    Mutant("long-polls-per-client-without-a-cap", "one client address cannot take every long-poll slot",
           "engine/long_poll.py", "if client is not None and self._waiting_by_client[client] > max_per_client:",
           "if False:",
           (T_SST + "test_one_client_address_gets_its_share_of_the_long_polls_and_another_its_own",)),
    # ---- issue 21: staged writes bounded, the queue cap on every path, a mark only its producer moves ----
    Mutant("stage-without-a-cap", "staging is bounded: stages and bytes per producer and in all",
           "statemachine/staging.py", "if cap is not None and grows[name] and after[name] > cap:", "if False:",
           (T_STG + "test_a_stage_past_a_producer_or_cluster_cap_is_refused_whole_and_changes_nothing",
            T_SSG + "test_forty_three_megabyte_stages_are_refused_past_the_caps_and_an_abort_frees_all")),
    Mutant("commit-skips-the-queue-cap", "every command that creates queues passes the queue cap",
           "statemachine/machine.py", 'problem = self._check_room(batches, cmd.get("auto_create", True), cmd)',
           'problem = self._check_room(batches, cmd.get("auto_create", True), {})',
           (T_STG + "test_every_command_that_creates_queues_keeps_max_queues",
            T_SSG + "test_a_commit_into_new_queues_keeps_max_queues")),
    Mutant("group-cap-ignored", "a queue's consumer groups stay within the cap however many are added at once",
           "statemachine/queue.py", "if max_groups is not None and len(self.groups) >= max_groups:",
           "if False:",
           ("tests/test_statemachine_rules.py::"
            "test_the_group_cap_in_the_command_counts_the_default_group_and_spares_existing_groups",
            "tests/test_security_limits.py::test_groups_added_at_once_cannot_pass_the_cap_between_them")),
    Mutant("empty-commit-moves-the-mark", "a producer's mark moves only by a commit of its own rows",
           "statemachine/machine.py", "        if not parts:   # nothing to publish", "        if False:   # nothing",
           (T_STG + "test_a_commit_without_parts_does_not_move_the_mark",
            T_SSG + "test_a_poisoned_batch_number_cannot_make_the_next_real_batch_a_duplicate")),
    Mutant("earliest-group-without-a-cap", "a group starts earliest only where one entry can afford it",
           "statemachine/queue.py", "if joining > MAX_EARLIEST_GROUP_MESSAGES:", "if False:",
           ("tests/test_statemachine_rules.py::test_a_group_starts_at_the_earliest_message_only_while_one_entry_can_afford_it",)),
    Mutant("ordering-key-ignored", "a message waits while an earlier one of its ordering key is not ready",
           "statemachine/queue.py",
           "prefix = receipt_prefix(self.incarnation, group_name)\n        waiting = self._ordering_waits(group) if self.ordering else None",
           "prefix = receipt_prefix(self.incarnation, group_name)\n        waiting = None",
           ("tests/test_statemachine_rules.py::test_a_later_message_of_an_ordering_key_waits_while_an_earlier_one_is_in_flight",)),
    Mutant("waiting-key-wakes-long-polls", "a long poll is not woken by messages whose ordering key waits",
           "statemachine/machine.py", "return queue.deliverable(queue.groups[group], self.clock) if queue",
           "return len(queue.groups[group].ready) if queue",
           ("tests/test_statemachine_rules.py::test_a_message_whose_ordering_key_waits_is_not_ready_for_a_long_poll",)),
    Mutant("refused-call-keeps-its-arguments", "a refused call between a front and its engine lets go of its arguments",
           "engine/link/remote.py", "            del future\n", "            pass\n",
           ("tests/test_link.py",)),
    Mutant("fork-without-freeze", "a node's forked processes' collections leave the pages they inherited shared",
           "raftq/server.py", "    gc.freeze()\n    pid = os.fork()", "    pid = os.fork()",
           ("tests/test_forked_memory.py",)),
    Mutant("backlog-missing-not-counted", "the chaos campaign's backlog is judged whole: a lost message fails it",
           "chaos/backlog.py", "missing = [number for number in range(count) if number not in seen]", "missing = []",
           ("tests/test_chaos_checker.py::test_a_backlog_missing_changed_or_doubled_fails_with_its_count",)),
    # ---- storage faults, the read side (issue 47) --------------------------------------------------
    Mutant("read-skips-checksum", "a record read back is checked: damage is never served",
           "engine/storage/journal.py", "        payload = intact_payload(record)\n        said",
           "        payload = memoryview(record)[records.RECORD_HEADER.size:]\n        said",
           (T_JRN + "test_every_record_read_back_is_checked_and_an_intact_copy_repairs_it_in_place",)),
    Mutant("ticket-unresolved-when-answer-raises", "a command whose answer raises is answered, its slot in flight freed",
           "engine/node.py",
           "        except Exception:\n            logger.exception(\"reading the bodies of a command's result failed\")\n"
           "            return CommitError(\"internal\")",
           "        except Exception:\n            raise",
           ("tests/test_engine_answers.py::test_commands_whose_answer_raises_are_answered_and_free_their_slot_in_flight",)),
    Mutant("carried-entry-unchecked", "an entry a snapshot carries is checked as it is read, never carried on damaged",
           "engine/storage/snapshot_file.py", "payload = intact_payload(os.pread(self._fd, length, offset))",
           "payload = memoryview(os.pread(self._fd, length, offset))[records.RECORD_HEADER.size:]",
           ("tests/test_repair.py::test_a_damaged_carried_entry_is_refused_by_the_snapshot_writer_repaired_and_carried_intact",)),
    Mutant("damaged-leader-keeps-leading", "a leader that cannot read what it serves hands its lead to a replica that can",
           "engine/raft/consensus.py",
           "if serving and self._node.is_leader() and self._node.others() and self._damage_hand_over is None:",
           "if False:",
           ("tests/test_damaged_reads.py::test_a_letter_flipped_in_the_leaders_journal_is_served_intact_repaired_and_writes_go_on",
            "tests/test_repair.py::test_a_leader_sends_a_lagging_follower_what_precedes_a_damaged_entry_repairs_it_and_hands_over")),
    # ---- issue 47: a full disk is a clear, bounded state ------------------------------------------
    Mutant("writes-accepted-in-disk-alarm", "a node below its watermark stops the writes to its groups (507)",
           "api/disk.py", "            if state is not None and state.alarm:", "            if False:",
           (T_ALM + "test_a_follower_below_its_watermark_stops_its_groups_writes_at_every_door_and_nothing_is_stored",
            T_ALM + "test_every_disk_full_then_space_back_writes_resume_without_a_restart")),
    Mutant("disk-alarm-refuses-acks", "in disk alarm receives, acks, nacks, deletes and purges go on",
           "api/disk.py", 'return op in ("put", "stage", "create_queue") or (op == "tx" and bool(command.get("put")))',
           'return op not in ("receive", "tick")',
           (T_ALM + "test_in_disk_alarm_receives_acks_nacks_deletes_and_purges_go_on",)),
    Mutant("insufficient-storage-answered-503", "a write the disk itself refused is 507, never an unknown outcome",
           "api/commands.py", "        if exc.code == INSUFFICIENT_STORAGE:\n", "        if False:\n",
           (T_ALM + "test_a_write_the_leaders_disk_itself_refuses_is_answered_as_one_the_watermark_refused",)),
    Mutant("storage-refusal-status-503", "a write refused for storage says so (507), never an unknown outcome",
           "api/errors.py", '    "insufficient_storage": 507,', '    "insufficient_storage": 503,',
           (T_ALM + "test_a_follower_below_its_watermark_stops_its_groups_writes_at_every_door_and_nothing_is_stored",
            T_ALM + "test_the_clusters_stored_bytes_cap_holds_exactly_under_concurrent_puts")),
    Mutant("stored-bytes-cap-ignored", "the cluster's stored bytes stay within --max-stored-bytes, exactly",
           "statemachine/machine.py", "if growth <= 0 or self.stored.bytes + growth <= cap:", "if True:",
           (*RULES, T_ALM + "test_the_clusters_stored_bytes_cap_holds_exactly_under_concurrent_puts")),
    Mutant("stored-bytes-miss-removals", "the stored bytes the cap counts leave with the messages",
           "statemachine/rows.py", "        self.tally.bytes -= size\n", "",
           RULES),
    # ---- priorities, back-off, paused groups, retention and replay (issue 51) ------------------------
    Mutant("priority-ignored", "a receive hands out the highest priority first",
           "statemachine/ready.py", "        levels = self.levels\n        if levels is None:\n            return self.pop_lowest()",
           "        levels = self.levels\n        if True:\n            return self.pop_lowest()",
           (T_PRI + "test_the_highest_priority_goes_first_and_each_priority_in_seq_order", T_MODEL)),
    Mutant("key-order-broken-by-priority", "a key's messages go in seq order whatever their priorities",
           "statemachine/queue.py",
           "picks = self._keyed_picks(group, waiting) if self.ordering and ready.levels is not None else None",
           "picks = None",
           (T_PRI + "test_priority_never_breaks_an_ordering_keys_order", T_MODEL)),
    Mutant("backoff-from-wall-time", "a back-off delay runs on log time, never a node's clock",
           "statemachine/queue.py", "        ready_at = ended_at + delay_ms\n",
           "        ready_at = int(__import__('time').time() * 1000) + delay_ms\n",
           (T_BOF + "test_a_nack_without_a_delay_waits_initial_then_grows_by_the_factor_up_to_the_maximum",)),
    Mutant("backoff-from-when-noticed", "a lease that ran out backs off from its deadline, not from the command",
           "statemachine/queue.py", "        ready_at = ended_at + delay_ms\n", "        ready_at = clock + delay_ms\n",
           (T_BOF + "test_a_lease_that_runs_out_waits_from_its_deadline_not_from_when_a_command_noticed", T_MODEL)),
    Mutant("jitter-not-from-the-log", "a back-off's jitter is drawn from the log: every replica waits alike",
           "statemachine/backoff.py", "delay -= (spread * _draw(queue, group, seq, deliveries)) >> 64",
           "delay -= (spread * __import__('random').getrandbits(64)) >> 64",
           (T_BOF + "test_the_jitter_is_drawn_from_the_log_the_same_on_every_replica",)),
    Mutant("paused-group-served", "a paused group is handed nothing",
           "statemachine/group.py", "        if self.paused:\n            return 0", "        if False:\n            return 0",
           (T_PAU + "test_a_paused_group_gets_nothing_while_the_others_go_on_and_its_messages_stay", T_MODEL)),
    Mutant("rate-limit-ignored", "a group's rate limit bounds its deliveries in log time",
           "statemachine/group.py", "        return None if self.pace is None else self.pace.allowance(clock)",
           "        return None",
           (T_PAU + "test_over_any_span_of_log_time_a_limited_group_gets_at_most_its_rate_plus_one_seconds_worth",
            T_MODEL)),
    Mutant("seek-off-by-one", "a seek replays exactly the stored messages from its position",
           "statemachine/retention.py", 'return start["seq"] if start["seq"] < queue.next_seq else None',
           'return start["seq"] + 1 if start["seq"] < queue.next_seq else None',
           (T_RET + "test_a_seek_to_a_seq_replays_exactly_from_it", T_MODEL)),
    Mutant("acked-not-retained", "a queue with retention keeps what every group is done with",
           "statemachine/retention.py",
           '    return config["retention_ms"] is not None or config["retention_bytes"] is not None',
           "    return False",
           (T_RET + "test_a_seek_to_the_earliest_replays_every_retained_message_in_order_as_new", T_MODEL)),
    Mutant("retained-outside-the-limits", "retained messages count toward max_length and max_bytes",
           "statemachine/queue.py", "        while rows.retained and (", "        while False and (",
           (T_RET + "test_retained_messages_count_toward_the_limits_and_go_first_when_a_put_needs_the_room", T_MODEL)),
    Mutant("retained-entry-compacted", "a retained message keeps its log entry live",
           "statemachine/rows.py", "        self.received[row] = RETAINED\n        self.expires_at[row] = 0\n",
           "        self.received[row] = RETAINED\n        self.expires_at[row] = 0\n        self.ref_index[row] = 0\n",
           (T_RET + "test_a_retained_message_keeps_its_log_entry_live",)),
    Mutant("chaos-backoff-unjudged", "the chaos checker finds a redelivery sooner than its back-off",
           "chaos/checker.py", "                if after.op.complete_t < earliest:", "                if False:",
           ("tests/test_chaos_checker.py::test_a_redelivery_comes_no_sooner_than_the_back_off_after_the_delivery_ended",)),
    Mutant("chaos-order-ignores-priority", "the chaos checker's order lets only a higher priority go first",
           "chaos/checker.py", "(e for p, e in earliest.items() if p <= priority)", "(e for p, e in earliest.items())",
           ("tests/test_chaos_checker.py::test_a_later_message_goes_first_only_with_a_higher_priority",)),
    Mutant("retained-not-relocated", "a retained message's body moves out of a mostly-dead entry like any other",
           "statemachine/rows.py", "(self.pending[row] or self.received[row] == RETAINED)", "self.pending[row]",
           ("tests/test_statemachine_bodies.py::test_a_retained_message_moves_and_a_replay_serves_the_copy",)),
    Mutant("retained-outside-the-stored-bytes", "retained messages count toward --max-stored-bytes",
           "statemachine/rows.py", "        self.retained_bytes += size\n",
           "        self.retained_bytes += size\n        self.tally.bytes -= size\n",
           (T_RET + "test_retained_messages_count_toward_the_clusters_stored_bytes_until_retention_lets_them_go",
            T_MODEL)),
    Mutant("connections-leased-before-every-node-can", "connections are counted per node, as before, while a node "
           "runs a release that knows no connections' leases", "api/connections.py",
           "            return await self._feature.everywhere()", "            return True",
           ("tests/test_operations.py::"
            "test_connections_are_counted_per_node_until_every_node_counts_them_for_the_cluster",)),
    Mutant("issue-51-before-every-node-has-it", "no front writes what issue 51 adds while a node runs an older release",
           "api/features.py", "if feature is not None and not await self._asked.everywhere():", "if False:",
           ("tests/test_operations.py::test_what_issue_51_adds_is_refused_until_every_node_runs_it_then_served",)),
    # ---- the package (docs/architecture.md) ---------------------------------------------------------
    Mutant("statemachine-imports-upward", "each room imports only the rooms below it",
           "statemachine/due.py", "from .queue import PARKED_RETRY_MS", "from .queue import PARKED_RETRY_MS\nfrom ..engine import outcome",
           ("tests/test_package.py::test_each_room_imports_only_the_rooms_below_it",)),
    Mutant("room-imported-by-its-folder-name", "the installed package imports its rooms as raftq.*",
           "api/caps.py", "from raftq.statemachine.staging import", "from statemachine.staging import",
           ("tests/test_package.py::test_no_module_imports_a_room_by_its_folder_name",)),
    Mutant("client-needs-a-server-dependency", "pip install raftq, the client, needs none of the server's dependencies",
           "raftq/failover.py", "import cbor2\n", "import cbor2\nimport orjson  # noqa: F401\n",
           ("tests/test_package.py::test_the_client_runs_with_the_wheel_and_its_plain_requirements_alone",)),
    Mutant("shallow-clone-skips-in-ci", "a proof that needs an older revision fails in CI when the clone lacks it",
           "tests/test_operations.py", "        cannot_run(f\"revision {revision} is not in",
           "        pytest.skip(f\"revision {revision} is not in",
           ("tests/test_operations.py::test_a_revision_missing_from_the_history_skips_its_proof_and_fails_it_in_ci",)),
    # ---- the command line, for a newcomer ----------------------------------------------------------
    Mutant("cli-silent-about-where-it-looked", "a CLI without a cluster or a token says where it looked",
           "raftq/cli/__init__.py", "    looked = where_it_looked(target(args), failure)\n",
           "    looked = None\n",
           (T_CLI + "test_without_a_cluster_or_a_token_the_cli_says_where_it_looked",)),
    Mutant("down-leaves-up-running", "raftq down stops raftq up before its nodes, which it would start again",
           "raftq/cli/down.py", "    up_runs = up_pid is not None and runs_up_of(up_pid, root)",
           "    up_runs = False",
           (T_CLI + "test_up_detached_runs_until_down_stops_it_from_another_directory",)),
    Mutant("no-suggestion-for-a-mistyped-command", "a mistyped command gets the one most likely meant",
           "raftq/cli/suggest.py", "    meant = suggestion(top, error, argv)", "    meant = None",
           (T_CLI + "test_a_mistyped_command_gets_the_one_meant",)),
    # ---- the test run itself (tests/stopping.py) -----------------------------------------------------
    Mutant("sigterm-kills-the-run-on-the-spot", "a test run stopped by SIGTERM leaves no process alive",
           "tests/stopping.py", "            signal.signal(sig, _on_stop_signal)", "            pass",
           ("tests/test_interrupted_run.py::test_a_run_stopped_while_its_test_runs_leaves_no_process_alive",)),
    Mutant("run-end-kills-nothing", "no process a test left outlives the run",
           "tests/stopping.py", "    killed = kill_descendants()\n    if killed:", "    killed = []\n    if killed:",
           ("tests/test_interrupted_run.py::test_a_run_stopped_while_its_test_runs_leaves_no_process_alive",)),
    # ---- the SQS API (docs/sqs.md) ---------------------------------------------------------------
    Mutant("sqs-signature-not-compared", "an SQS call signed with a wrong secret is refused",
           "api/sqs/sigv4.py", "return hmac.compare_digest(expected.encode(), self._signature.encode())",
           "return True",
           ("tests/test_sqs_auth.py::test_a_wrong_secret_is_signature_does_not_match_and_sends_nothing",)),
    Mutant("sqs-attributes-md5-unsorted", "MD5OfMessageAttributes is computed as AWS does, names in order",
           "api/sqs/attributes.py", "for name in sorted(attributes):", "for name in attributes:",
           ("tests/test_sqs_api.py::test_message_attributes_of_every_type_and_their_md5",)),
    Mutant("sqs-follower-answers-without-the-leader", "a follower forwards SQS calls to the leader",
           "api/sqs/service.py",
           "return await _forward(request, body, f\"{request.scheme}://{there.address}{request.path_qs}\", forwards + 1,\n"
           "                              waits)",
           "return None",
           ("tests/test_sqs_api.py::test_every_action_works_through_a_follower",)),
    # ---- issue 47: the disk as a fault domain, the write side and start-up ------------------------
    Mutant("short-write-ignored", "a write's short count is completed: no record counts unless all its bytes were written",
           "engine/storage/records.py", "        view = view[written:]\n        offset += written\n", "        break\n",
           (T_REC + "test_a_short_write_is_completed",)),
    Mutant("no-room-leaves-a-partial-record", "a write that finds no room leaves nothing of itself after the last record",
           "engine/storage/records.py", "        except OSError:\n            self._cut_back()\n            raise\n",
           "        except OSError:\n            raise\n",
           (T_REC + "test_a_write_that_finds_no_room_leaves_nothing_of_itself",)),
    Mutant("fsync-failure-retried", "a failed fsync is never retried as if it had worked",
           "engine/storage/records.py", "        if self.failed is not None:\n            raise self.failed\n        if not self.dirty:",
           "        if not self.dirty:",
           (T_REC + "test_a_failed_sync_is_fatal_and_never_retried",)),
    Mutant("failed-fsync-leaves-the-engine-running", "an engine whose fsync failed stops, and is started again",
           "raftq/engine_process.py", "    records.on_fatal(lambda reason: os._exit(RESTART_EXIT))\n", "",
           (T_DSK + "test_an_engine_whose_fsync_fails_is_started_again_and_loses_nothing_acknowledged",)),
    Mutant("full-disk-answered-no-quorum", "a leader with no room refuses an entry as insufficient_storage, counted nowhere",
           "engine/raft/node.py", "            ticket.resolve(None, INSUFFICIENT_STORAGE)", "            ticket.resolve(None, \"no_quorum\")",
           (T_CST + "test_a_leader_with_no_room_refuses_the_entry_as_insufficient_storage_and_counts_it_nowhere",)),
    Mutant("startup-cuts-damage-mid-log", "start-up cuts a torn write, never damage: entries given up are regained before a vote",
           "engine/storage/journal.py", "        if len(segments) == 1 and (shown is None or shown < first_lost):",
           "        if True:",
           (T_JRN + "test_damage_before_the_last_segment_is_given_up_only_until_the_log_holds_it_again",
            T_JRN + "test_a_bad_record_with_synced_ones_after_it_in_the_last_segment_is_damage_not_a_torn_write",
            T_JRN + "test_a_record_written_at_another_records_offset_is_damage",
            T_CST + "test_a_voter_that_gave_up_damaged_entries_never_elects_a_leader_without_them")),
    Mutant("recovering-node-votes", "a node that gave up damaged entries votes only once its log holds them again",
           "engine/raft/node.py", "        return self._journal.regain_index is None", "        return True",
           (T_CST + "test_a_voter_that_gave_up_damaged_entries_never_elects_a_leader_without_them",)),
    Mutant("snapshot-loaded-without-room-goes-on", "a follower never applies on a snapshot's state over a log it could not replace",
           "engine/raft/node.py", "        if loaded is not None and self._SyncObj__raftLastApplied != loaded[1]:",
           "        if False:",
           (T_CST + "test_a_follower_with_no_room_for_a_snapshot_it_loaded_stops_rather_than_apply_on_unlike_its_log",)),
    Mutant("own-damaged-snapshot-starts-empty", "a node whose own snapshot is damaged at start takes the leader's, "
           "and votes once it holds its log again",
           "engine/raft/node.py", "        if self._damaged_snapshot is not None and not clearJournal:",
           "        if False:",
           (T_CST + "test_a_node_whose_own_snapshot_is_damaged_takes_the_leaders_and_votes_only_once_it_regained",
            T_CST + "test_the_only_replica_with_a_damaged_snapshot_stops_rather_than_serve_an_empty_state")),
    Mutant("failed-snapshot-retried-every-tick", "a failed snapshot (a full disk) is taken again seconds later, not at every tick",
           "engine/raft/node.py", "                return\n            if self.compactable_bytes()",
           "                pass\n            if self.compactable_bytes()",
           (T_CST + "test_a_failed_snapshot_is_tried_again_seconds_later_not_at_every_tick",)),
    Mutant("meta-damage-resets-term", "damaged meta never resets the term and vote: both copies damaged refuses to start",
           "engine/storage/journal.py",
           "        if any(\"damaged\" in problem for problem in problems) or self._holds_entries():",
           "        if False:",
           (T_JRN + "test_meta_damaged_in_both_copies_refuses_to_open_with_what_to_do",
            T_JRN + "test_a_journal_with_entries_whose_meta_is_gone_refuses_to_open")),
    Mutant("startup-forgets-entries-past-damage", "entries a sync made durable past damaged ones are regained before a vote, marked or not",
           "engine/storage/journal.py",
           "regain = max(first_lost, shown or 0, *(index for index in intact if index is not None),",
           "regain = max(first_lost, shown or 0,",
           (T_JRN + "test_entries_past_damage_that_no_mark_names_are_regained_too",)),
    Mutant("engine-restart-answered-500", "while an engine is started again after a failed sync, the node answers 503, not 500",
           "api/app.py", '            if exc.code != "engine_gone":', "            if True:",
           (T_DSK + "test_an_engine_whose_fsync_fails_is_started_again_and_loses_nothing_acknowledged",)),
    Mutant("catalog-lost-while-its-engine-restarts", "while group 0's engine is started again, the node serves the other groups' queues (never a 500)",
           "api/groups.py", "        return self._catalog", "        return self.engines[0]",
           (T_DSK + "test_with_several_groups_each_engine_whose_fsync_fails_is_started_again_alone",)),
    # ---- issue 47: the chaos suite's disk faults, judged by the checker ---------------------------
    Mutant("checker-misses-changed-body", "the chaos checker's bodies_as_put sees a body served that differs from its put",
           "chaos/checker.py", "            if put != d.body:", "            if False:",
           (T_CHK + "test_a_body_served_that_differs_from_its_put_fails",)),
    Mutant("checker-misses-writes-never-resumed", "the chaos checker's writes_resume fails a fault after which no write is acknowledged",
           "chaos/checker.py", 'bad = [t for t in times if t["s"] is None or t["s"] > WRITES_RESUME_S]',
           'bad = [t for t in times if t["s"] is not None and t["s"] > WRITES_RESUME_S]',
           (T_CHK + "test_writes_not_acknowledged_soon_after_a_fault_ends_fail",)),
    Mutant("checker-counts-writes-sent-in-the-fault", "writes_resume counts only puts sent after the fault's end",
           "chaos/checker.py",
           "done = min((complete for invoked, complete in acked[group] if invoked >= end), default=None)",
           "done = min((complete for invoked, complete in acked[group] if complete >= end), default=None)",
           (T_CHK + "test_writes_not_acknowledged_soon_after_a_fault_ends_fail",)),
    # ---- what an attacker found at the SQS door (issue 49) ----------------------------------------
    Mutant("sqs-target-unsigned", "the JSON protocol's X-Amz-Target must be signed",
           "api/sqs/sigv4.py", 'JSON_REQUIRED_SIGNED = ("x-amz-target",)', "JSON_REQUIRED_SIGNED = ()",
           (T_SEC + "test_the_action_the_host_and_a_date_ahead_must_be_signed_as_aws_wants",)),
    Mutant("sqs-body-read-before-auth", "an SQS call's headers are checked before its body is read",
           "api/sqs/service.py", "        _refuse_too_large(request)\n        principals = request.app[PRINCIPALS]",
           "        _refuse_too_large(request)\n        await _body(request)\n        principals = request.app[PRINCIPALS]",
           (T_SEC + "test_a_call_that_fails_its_headers_is_refused_before_its_body_is_read",)),
    Mutant("receipt-guessable", "a receipt without its MAC names no lease once every node seals receipts",
           "engine/link/receipts.py", "if unsealed_too and PLAIN.fullmatch(given):", "if PLAIN.fullmatch(given):",
           (T_SEC + "test_a_guessed_or_borrowed_receipt_settles_nothing_on_the_native_api",
            T_SEC + "test_a_guessed_or_borrowed_receipt_handle_deletes_and_hides_nothing_on_the_sqs_api")),
    Mutant("sqs-receipt-refusal-answered-400", "each SQS error has AWS's status: ReceiptHandleIsInvalid is 404",
           "api/sqs/errors.py", '"ReceiptHandleIsInvalid": _modeled("ReceiptHandleIsInvalid", 404),',
           '"ReceiptHandleIsInvalid": _modeled("ReceiptHandleIsInvalid", 400),',
           ("tests/test_sqs_differential.py::test_every_action_answers_as_aws_does",)),
    Mutant("sqs-missing-queue-code-of-its-shape", "each SQS error has AWS's code: a missing queue is "
           "AWS.SimpleQueueService.NonExistentQueue", "api/sqs/errors.py",
           '"QueueDoesNotExist": _modeled("QueueDoesNotExist", 400, "AWS.SimpleQueueService.NonExistentQueue"),',
           '"QueueDoesNotExist": _modeled("QueueDoesNotExist", 400),',
           ("tests/test_sqs_differential.py::test_every_action_answers_as_aws_does",)),
    Mutant("sqs-sent-timestamp-in-log-time", "SQS's timestamps are wall time, also after the whole cluster was down",
           "api/sqs/message_actions.py", 'system = {"SentTimestamp": str(walls[message["put_at_ms"]]),',
           'system = {"SentTimestamp": str(message["put_at_ms"]),',
           ("tests/test_sqs_timestamps.py",)),
    Mutant("no-wall-tick-when-a-term-settles", "a new term's commands come after the wall time of its log time",
           "engine/node.py", "# ahead of every command of the term: the wall time of its log time\n"
           "                            self._queue_wall_tick(term)\n", "pass\n",
           ("tests/test_sqs_timestamps.py",)),
    Mutant("wall-ticks-wait-for-the-gate-after-a-restart", "once a wall time is recorded, every tick carries one, "
           "also before the feature gate has asked the other nodes again after a restart of every node",
           "engine/node.py", "return self._wall_ticks_allowed or bool(self.machine.wall.starts)",
           "return self._wall_ticks_allowed", ("tests/test_sqs_timestamps.py",)),
    Mutant("wall-time-never-recorded", "every replica records the wall time of log time from the leader's ticks",
           "statemachine/wall.py", "        offset = wall_ms - now_ms\n", "        return\n",
           ("tests/test_statemachine_rules.py::test_a_leaders_tick_records_the_wall_time_of_log_time_for_moments_"
            "before_and_after_an_outage", "tests/test_statemachine_model.py")),
    Mutant("new-term-starts-at-the-applied-time", "every moment of a term comes after every moment of the last",
           "engine/node.py", "self._base = applied + 1 if applied > 0 else wall_ms()",
           "self._base = applied if applied > 0 else wall_ms()",
           ("tests/test_log_clock.py",)),
    # ---- principals: who may do what, revoked and held to quotas (issue 52) --------------------------
    Mutant("rule-checked-only-at-stream-upgrade", "the streaming wire checks every frame's queue, not only the upgrade",
           "api/stream.py",
           "        if principal is not None and denial(self.app, self.request, principal, action, [queue]) is not None:",
           "        if False:",
           (T_PRN + "test_put_on_orders_puts_to_orders_eu_and_nothing_else_at_every_door",)),
    Mutant("transaction-second-queue-unchecked", "a transaction's every queue is checked, and a refusal writes nothing",
           "api/messages.py", "authorize(request, PUT, [part[\"queue\"] for part in puts])",
           "authorize(request, PUT, [part[\"queue\"] for part in puts][:1])",
           (T_PRN + "test_put_on_orders_puts_to_orders_eu_and_nothing_else_at_every_door",)),
    Mutant("dead-letter-target-unchecked", "a queue's dead-letter target needs admin on it too",
           "api/queues.py", "    authorize(request, ADMIN, names[1:])", "    authorize(request, ADMIN, [])",
           (T_PRN + "test_a_dead_letter_target_and_a_redrive_source_are_checked_too",)),
    Mutant("revoked-principal-accepted", "a revoked principal is refused by every node within a second",
           "api/principals.py",
           "        self._by_hash, self._by_name, self.kept_keys, self._seals = by_hash, by_name, keys, seals",
           "        self._by_hash, self._by_name, self.kept_keys, self._seals = "
           "{**self._by_hash, **by_hash}, {**self._by_name, **by_name}, {**self.kept_keys, **keys}, seals",
           (T_PRN + "test_a_revoked_principal_is_refused_by_every_node_within_a_second",)),
    Mutant("quota-counted-per-node", "a principal's long polls are counted for the cluster, not by each group's leader",
           "api/principals.py", "    return [principal.name, share(limit, app[GROUPS].count, group)]",
           "    return [principal.name, limit]",
           (T_PRN + "test_with_several_groups_quotas_count_the_clusters_not_each_groups",)),
    Mutant("connections-counted-per-node", "a principal's connections are counted for the cluster, not per node",
           "api/connections.py", "    if await cluster.for_the_cluster():", "    if False:",
           (T_PRN + "test_connections_are_counted_for_the_cluster_and_a_killed_nodes_leave_within_a_lease",)),
    Mutant("new-group-0-leader-admits-at-once", "a new group-0 leader takes no new connection before it has "
           "relearned the open ones", "engine/quotas.py", "        if now < self._open_at:", "        if False:",
           (T_PRN + "test_a_new_group_0_leader_relearns_the_open_connections_before_it_takes_a_new_one",)),
    Mutant("put-rate-ignored", "a principal puts at most its put_rate",
           "api/principals.py", "    if rate is None or count is None:\n        return None",
           "    if True:\n        return None",
           (T_PRN + "test_a_principal_puts_at_most_its_put_rate",)),
    Mutant("put-rate-refusal-answered-at-once", "a put past put_rate is answered a second late, so a flood costs "
           "its sender the time", "api/commands.py", "                await asyncio.sleep(RATE_REFUSAL_HELD_S)\n",
           "                pass\n", (T_PRN + "test_a_principal_puts_at_most_its_put_rate",)),
    Mutant("stored-bytes-quota-ignored", "a principal's queues store at most its stored_bytes quota",
           "statemachine/machine.py",
           "return self._room_for_bytes(batches, cmd) or self.quotas.room_for_bytes(self, batches, cmd)",
           "return self._room_for_bytes(batches, cmd)",
           (T_PRN + "test_a_principals_queues_store_at_most_its_stored_bytes_quota",)),
    Mutant("spark-denial-asked-of-every-replica", "a denial is final: the Spark connector's replica read does "
           "not move on from a node that refused it", "raftq/spark/ranges.py",
           "                if exc.code in REFUSED:\n                    raise\n",
           "                pass\n",
           (T_SPP + "test_a_page_the_principal_may_not_browse_is_refused_once_not_asked_of_every_replica",)),
    Mutant("spark-writer-must-browse", "a principal with producers and put on a queue writes to it through the "
           "Spark sink, without browse", "raftq/spark/source.py",
           "            if not (exc.code == \"forbidden\" and exc.body.get(\"action\") == \"browse\"):\n",
           "            if True:\n",
           (T_SPP + "test_without_auto_create_a_writer_without_browse_is_checked_as_far_as_it_may_see",)),
]


def copy_tree(dest: Path) -> None:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def run_tests(tree: Path, tests: tuple[str, ...]) -> tuple[bool, float, str]:
    """(passed, seconds, last lines of output) for `tests` in `tree`."""
    env = {**os.environ, **ENV, "PYTHONPATH": str(tree)}
    started = time.monotonic()
    try:
        # A basetemp of its own: pytest's shared default is cleaned by any other run on the machine.
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                               "--basetemp", str(tree.parent / "pytest"), *tests],
                              cwd=tree, env=env, capture_output=True, text=True, timeout=TEST_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        return False, time.monotonic() - started, f"timed out: {str(exc.stdout)[-300:]}"
    tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]
    return done.returncode == 0, time.monotonic() - started, tail[0]


def mutate(tree: Path, mutant: Mutant) -> str:
    path = tree / mutant.path
    original = path.read_text()
    count = original.count(mutant.old)
    if count != 1:
        raise SystemExit(f"mutant {mutant.name}: its source occurs {count} times in {mutant.path}, not once")
    mutated = original.replace(mutant.old, mutant.new)
    compile(mutated, str(path), "exec")     # a mutant is a valid program: only behaviour may kill it
    path.write_text(mutated)
    return original


def main(argv: list[str]) -> int:
    if argv[:1] == ["--list"]:
        for m in MUTANTS:
            print(f"{m.name:<40} {m.path:<24} {m.guarantee}")
        return 0
    chosen = [m for m in MUTANTS if not argv or m.name in argv]
    unknown = set(argv) - {m.name for m in MUTANTS}
    if unknown:
        raise SystemExit(f"no such mutants: {', '.join(sorted(unknown))} (see --list)")
    results: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="raftq-mutate-") as tmp:
        tree = Path(tmp) / "tree"
        copy_tree(tree)
        for mutant in chosen:      # every source still there, before anything runs
            original = mutate(tree, mutant)
            (tree / mutant.path).write_text(original)
        baseline = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        passed, seconds, tail = run_tests(tree, baseline)
        print(f"baseline (unmutated): {'pass' if passed else 'FAIL'} in {seconds:.0f}s  {tail}", flush=True)
        if not passed:
            print("the tests fail without any mutant; fix that first", file=sys.stderr)
            return 2
        for mutant in chosen:
            original = mutate(tree, mutant)
            try:
                passed, seconds, tail = run_tests(tree, mutant.tests)
            finally:
                (tree / mutant.path).write_text(original)
            results[mutant.name] = "survived" if passed else "killed"
            print(f"{results[mutant.name]:<8} {mutant.name:<40} {seconds:5.0f}s  {tail}", flush=True)
    width = max(len(m.name) for m in chosen)
    print()
    print(f"{'mutant':<{width}}  {'result':<8}  guarantee")
    for m in chosen:
        print(f"{m.name:<{width}}  {results[m.name]:<8}  {m.guarantee}")
    killed = sum(1 for r in results.values() if r == "killed")
    print(json.dumps({"killed": killed, "survived": len(results) - killed, "mutants": results}))
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
