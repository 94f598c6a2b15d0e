"""W6 of `python -m bench compare`: K client processes at once, each producing
to a queue (or stream) of its own for the same seconds, so what grows with the
work is the servers' share of it, not one client's.

Each side hands out one job per process: a module-level function and its
arguments (what a spawned process can be given), which connects, creates its
queue, says it is ready and waits; the clock and the servers' CPU count start
when every process is ready, and stop when the last has its acknowledgements.
Each client process counts the CPU it used from then on (the clients' share of
a message). A side that can tell its server processes apart (`cpu_split`:
raftq's engines per group, fronts, supervisors) reports the servers' CPU per
message by kind as well.
"""

from __future__ import annotations

import multiprocessing
import queue as queues
import time
import traceback

from bench.measure import cpu_by_process, patience

READY_S = 60          # a process connecting and creating its queue, on a machine with a core for it
ACKS_AFTER_S = 120    # the acknowledgements still due once a process stops sending


def _client(job, seconds: float, index: int, results, go, ready_s: float) -> None:
    produce, args = job

    clock_started = []

    def ready() -> None:
        results.put(("ready", index))
        if not go.wait(ready_s):
            raise TimeoutError("W6's other client processes never all got ready")
        clock_started.append(time.process_time())

    try:
        figures = produce(*args, seconds, ready)
        results.put(("done", index, figures["n"], time.process_time() - clock_started[0]))
    except BaseException:
        results.put(("failed", index, traceback.format_exc()))


def _expect(results, what: str, count: int, timeout: float) -> list[tuple]:
    got, deadline = [], time.monotonic() + timeout
    while len(got) < count:
        try:
            message = results.get(timeout=max(0.0, deadline - time.monotonic()))
        except queues.Empty:
            raise RuntimeError(f"W6: {count - len(got)} of {count} client processes not {what} "
                               f"after {timeout:.0f} s") from None
        if message[0] == "failed":
            raise RuntimeError(f"W6 client process {message[1]} failed:\n{message[2]}")
        got.append(message)
    return got


def w6(system, k: int, seconds: float) -> dict:
    """Aggregate msgs/s of K producing processes, the servers' CPU per message and cores busy."""
    jobs = system.w6_jobs(k)
    context = multiprocessing.get_context("spawn")   # no fork of a harness that holds clients and threads
    results, go = context.Queue(), context.Event()
    ready_s = patience(READY_S, k)
    processes = [context.Process(target=_client, args=(job, seconds, i, results, go, ready_s), daemon=True)
                 for i, job in enumerate(jobs)]
    try:
        for process in processes:
            process.start()
        _expect(results, "ready", k, ready_s)
        pids = system.server_pids()
        server0 = cpu_by_process(pids)
        started = time.perf_counter()
        go.set()
        done = _expect(results, "done", k, patience(seconds + ACKS_AFTER_S, k))
        secs = time.perf_counter() - started
        server1 = cpu_by_process(pids)
    finally:
        for process in processes:
            process.join(timeout=patience(10, k))
            if process.is_alive():
                process.kill()
                process.join()
    n = sum(message[2] for message in done)
    per_msg = 1e6 / max(n, 1)
    used = {pid: server1[pid] - server0[pid] for pid in server0 if pid in server1}   # one gone took its CPU along
    server = sum(used.values())
    figures = {"k": k, "n": n, "secs": secs, "msgs_per_s": n / secs,
               "server_cpu_us_per_msg": server * per_msg, "server_cores_busy": server / secs,
               "client_cpu_us_per_msg": sum(message[3] for message in done) * per_msg,
               "raft_groups": system.raft_groups(k)}
    if hasattr(system, "cpu_split"):
        figures.update({f"{kind}_cpu_us_per_msg": cpu * per_msg for kind, cpu in system.cpu_split(used).items()})
    return figures
