"""An engine process of a node: one Raft group's engine (``engine.node.Node``),
serving the node's fronts over one link each (``engine.link.service``).

The node's supervisor (``raftq.server``) forks one per group the node holds
as it starts, before any thread exists, and starts one in a fresh
interpreter (``python -m raftq.engine_process``, its arguments pickled on
stdin) when group 0's record names the node a member of a group later.
Connections to the group arrive over the `handoff` Unix socket (the
supervisor owns the Raft port). An engine lives only as long as its
supervisor (PR_SET_PDEATHSIG). Group 0's engine of a cluster of several
groups tells the supervisor, over `holdings`, which groups the record has
this node run (``engine.members.HeldGroupsReporter``).

Stopping, on SIGTERM from the supervisor or when a front's link ends:
hand leadership over (so clients move to the next leader at once), say so
to the supervisor (one byte on `handoff`), then wait for the fronts to
stop (the supervisor stops them once every engine has handed over) and
close the journal.

A storage failure it cannot go on from -- a failed fsync, after which the
kernel may have dropped what it was to write (``engine.storage.records``)
-- ends the engine at once with ``RESTART_EXIT``, without a clean-up that
would sync again: the supervisor starts it again, and it recovers from
what is on disk and from its peers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import socket
import sys
import time
from pathlib import Path

import orjson

from raftq.api.app import Settings
from raftq.engine.balance import LeaderBalancer
from raftq.engine.config import ClusterConfig, write_private
from raftq.engine.lifetime import FreeMemoryGiver, die_with, name_process
from raftq.engine.link.receipts import Receipts
from raftq.engine.link.service import EngineService
from raftq.engine.members import HeldGroupsReporter, MemberRecorder
from raftq.engine.node import Node, group_data_dir
from raftq.engine.pauses import keep_pauses_short
from raftq.engine.placement import for_cluster
from raftq.engine.storage import records

from .logs import setup_logging, tag_group

log = logging.getLogger("raftq.engine_process")   # also when run as __main__

HANDED_OVER = b"h"
# The exit status of an engine that stopped on a storage failure: the supervisor starts it again.
RESTART_EXIT = 75
MEMBERS_FILE = "members"
# How long an engine that handed over waits for the fronts to stop before it closes anyway.
FRONTS_GONE_S = 30.0


def run_engine(*, node_pid: int, **kwargs) -> int:
    """The body of a forked engine process; its exit status."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C reaches the process group; the supervisor decides
    die_with(node_pid)
    name_process(f"raftq-group-{kwargs['group']}")
    tag_group(kwargs["group"])
    keep_pauses_short()
    records.on_fatal(lambda reason: os._exit(RESTART_EXIT))
    try:
        return asyncio.run(_serve(**kwargs))
    except PlacementChanged as exc:
        log.error("%s", exc)
        return 1
    except Exception:
        log.exception("group %d's engine failed", kwargs["group"])
        return 1


class PlacementChanged(RuntimeError):
    pass


def started_members(data_dir: Path, group: int) -> tuple[str, ...] | None:
    """The members group g > 0's engine first started with on this node (None: it never ran here)."""
    path = group_data_dir(data_dir, group) / MEMBERS_FILE
    return tuple(path.read_text().split()) if path.exists() else None


def check_members(data_dir: Path, group: int, members: tuple[str, ...]) -> None:
    """Group g > 0's engine starts with the members it first started with
    (the placement's, or group 0's record when the node joined it later):
    record them then, and refuse to run it with others, which could give
    two nodes two different majorities. (Group 0 is every node; its
    membership changes go through Raft.)"""
    if group == 0:
        return
    path = group_data_dir(data_dir, group) / MEMBERS_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, " ".join(sorted(members)) + "\n")
        return
    recorded = path.read_text().split()
    if recorded != sorted(members):
        raise PlacementChanged(f"group {group} was made with members {', '.join(recorded)} on this node; "
                               f"asked to run it with {', '.join(sorted(members))}")


async def _serve(*, cluster: ClusterConfig, node_id: str, group: int, members: tuple[str, ...], data_dir: Path,
                 handoff: socket.socket, links: list[socket.socket], settings: Settings, auto_create: bool,
                 holdings: socket.socket | None = None) -> int:
    """`members` in the group's order of preference for leadership; `holdings`:
    group 0's socket to the supervisor when the cluster has several groups."""
    check_members(data_dir, group, members)
    node = Node(cluster, node_id, data_dir, auto_create=auto_create, group=group, members=members, handoff=handoff,
                scrub_pass_hours=settings.scrub_pass_hours)
    # one group: nothing to balance, no other group's members to record
    balancer = LeaderBalancer(node, members) if cluster.groups > 1 else None
    recorder = MemberRecorder(node, for_cluster(cluster)) if cluster.groups > 1 and group == 0 else None
    reporter = HeldGroupsReporter(node, lambda held: _report_held(holdings, held)) \
        if holdings is not None else None
    service = EngineService(node, max_long_polls=settings.limits.max_long_polls,
                            max_long_polls_per_client=settings.limits.max_long_polls_per_client,
                            receipts=Receipts(settings.keys.receipts), balancer=balancer)
    giver = FreeMemoryGiver()
    await node.start()
    service.start()
    giver.start()
    if balancer:
        balancer.start()
    if recorder:
        recorder.start()
    if reporter:
        reporter.start()
    log.info("group %d: Raft on %s with %s", group, node.spec.raft, ", ".join(members))
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    served = [asyncio.create_task(service.serve(link)) for link in links]
    try:
        await asyncio.wait([*served, asyncio.create_task(stopping.wait())], return_when=asyncio.FIRST_COMPLETED)
        started = time.monotonic()
        if not stopping.is_set():
            log.error("group %d: a front's link ended; stopping", group)
        if balancer:
            balancer.stop()
        if recorder:
            recorder.stop()
        if reporter:
            reporter.stop()
        await node.hand_over()            # clients are redirected to the next leader at once
        try:
            handoff.send(HANDED_OVER)
        except OSError:
            pass                          # the supervisor is gone, and this process with it
        await asyncio.wait(served, timeout=FRONTS_GONE_S)   # in-flight requests finish or fail
    finally:
        giver.stop()
        service.stop()
        await node.close()                # journal flushed and closed
    log.info("group %d: stopped in %.2fs", group, time.monotonic() - started)
    return 0


def _report_held(holdings: socket.socket, report: dict) -> None:
    """One message (a SOCK_SEQPACKET socket keeps it whole): group -> the members to start it
    with, and node id -> [Raft address, HTTP address] of those members."""
    holdings.send(orjson.dumps({"groups": {str(group): members for group, members in report["groups"].items()},
                                "addresses": report["addresses"]}))


def main() -> int:
    """An engine the supervisor starts while the node runs, in a fresh interpreter
    (the supervisor may have threads by then): `run_engine`'s arguments come
    pickled on stdin, each socket as the descriptor passed to this process."""
    kwargs = pickle.load(sys.stdin.buffer)
    setup_logging(kwargs["node_id"], kwargs.pop("log_level"))
    kwargs["handoff"] = socket.socket(fileno=kwargs["handoff"])
    kwargs["links"] = [socket.socket(fileno=fd) for fd in kwargs["links"]]
    if kwargs.get("holdings") is not None:
        kwargs["holdings"] = socket.socket(fileno=kwargs["holdings"])
    return run_engine(**kwargs)


if __name__ == "__main__":
    sys.exit(main())
