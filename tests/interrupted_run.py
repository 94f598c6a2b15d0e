"""The test run that tests/test_interrupted_run.py stops half-way: not collected with the suite
(its name is not test_*.py), it is run on its own, in a child pytest, by that test.

It starts processes as the suite's tests do and then waits to be interrupted: a cluster of real
nodes (conftest's fresh_cluster: a session of their own each, forking their engines and fronts),
clients putting to it from a thread, a chaos fault proxy, and a process in a session of its own
that no test stops. Once they all run it writes the file RAFTQ_INTERRUPT_MARKER names.
"""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from chaos.toxiproxy import ToxiproxyServer

WAIT_S = 300


def test_starts_processes_and_waits_to_be_interrupted(fresh_cluster):
    marker = os.environ.get("RAFTQ_INTERRUPT_MARKER")
    if not marker:
        pytest.skip("run by tests/test_interrupted_run.py, which interrupts it")
    cluster = fresh_cluster(3)
    stop = threading.Event()

    def put_until_stopped():
        with cluster.client(retry_for=30) as client:
            while not stop.is_set():
                client.put("load", {"at": time.time()})

    putter = threading.Thread(target=put_until_stopped, daemon=True)
    putter.start()
    proxy = ToxiproxyServer.start()
    # a test that forgot what it started: only the run's own end stops this one
    subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({WAIT_S})"], start_new_session=True)
    try:
        Path(marker).write_text("\n".join(str(cluster.pid(node)) for node in cluster.ids))
        time.sleep(WAIT_S)
    finally:
        stop.set()
        proxy.stop()
