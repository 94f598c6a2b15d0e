"""A node's Raft ticks come first on a busy machine, and a late one is seen.

Its fronts run below its engines (``raftq.front.FRONT_NICENESS``): a client's
flood costs the fronts, and the kernel gives the engines, which send the
heartbeats, the larger share of a busy core. A tick that runs late anyway
(``engine.raft.ticking.LateTicks``) is counted in /metrics and logged with
where the time went. Real node processes; the engine is held off the CPU
by SIGSTOP, as a machine out of cores or a stalled disk would.
"""

import os
import re
import signal
import time
from pathlib import Path

import pytest

from raftq.front import FRONT_NICENESS
from tests.conftest import start_cluster
from tests.test_api import metric_values
from tests.waiting import wait_until
from tests.wire import call

pytestmark = pytest.mark.integration


@pytest.fixture
def one_node(tmp_path):
    # one voter: holding its engine still costs no election, only the ticks' time
    cluster = start_cluster(tmp_path, 1)
    try:
        yield cluster
    finally:
        cluster.close()


def children(supervisor: int) -> dict[str, int]:
    """The node's processes by name (raftq-front-<w>, raftq-group-<g>): pid."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text()
        except OSError:
            continue
        comm, rest = fields[fields.index("(") + 1:fields.rindex(")")], fields[fields.rindex(")") + 2:].split()
        if int(rest[1]) == supervisor:
            found[comm] = int(stat.parent.name)
    return found


def niceness(pid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, pid)


def late_ticks(cluster, node_id: str) -> float:
    return metric_values(call("GET", cluster.url(node_id) + "/metrics").raw.decode())["raftq_raft_late_ticks_total"]


def test_a_nodes_fronts_run_below_its_engines(one_node):
    processes = children(one_node.pid("n1"))
    engine, front = processes["raftq-group-0"], processes["raftq-front-0"]
    assert niceness(front) == niceness(engine) + FRONT_NICENESS


def test_an_engine_held_off_the_cpu_counts_a_late_tick_and_logs_where_the_time_went(one_node):
    engine = children(one_node.pid("n1"))["raftq-group-0"]
    before = late_ticks(one_node, "n1")
    os.kill(engine, signal.SIGSTOP)
    try:
        time.sleep(0.6)
    finally:
        os.kill(engine, signal.SIGCONT)
    wait_until(lambda: late_ticks(one_node, "n1") > before, 10, "a late tick counted")
    line = wait_until(lambda: re.search(r"ran late.*on the CPU (\d+) ms .* off it (\d+) ms",
                                        one_node.log_path("n1").read_text()), 10, "the late tick logged")
    on_cpu, off_cpu = (int(ms) for ms in line.groups())
    assert off_cpu >= 500 and on_cpu < off_cpu, line.group(0)
