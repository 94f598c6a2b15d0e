"""What keeps the engine process from pausing the tick thread.

The tick thread sends heartbeats; anything that holds the interpreter for
longer than the leader lease costs the cluster its leader.  Two things in
the interpreter itself did, under load (tests/test_saturation.py):

- The switch interval.  The tick thread blocks on I/O many times a tick,
  and each time it must win the interpreter lock back from a thread that is
  computing (the loop answering the fronts: reads, metrics pages, group
  commit).  CPython makes it wait a switch interval for that, 5 ms by
  default: a few dozen such waits delayed heartbeats past the lease.
- Full garbage collections.  A full collection visits every object the
  collector tracks; with ten thousand queues (each a few dozen dicts, lists
  and sorted lists) it took 0.2-0.4 s, and found nothing: the state machine
  holds no reference cycles.  What survived a full collection is frozen
  (``gc.freeze``), so the next one visits only what was promoted since.
  (Stored messages are rows of arrays and flag bytes, which the collector
  does not track at all: statemachine/rows.py, statemachine/ready.py.)  The price: an object frozen while alive that
  later becomes part of a garbage cycle is never reclaimed.  The engine's
  long-lived objects -- queues, groups, connections, the journal -- are
  freed by reference counting; a cycle among them leaks its few objects.
"""

import gc
import sys

SWITCH_INTERVAL_S = 0.0005
OLDEST_GENERATION = 2


def keep_pauses_short() -> None:
    """For the engine process only, once, before its threads start."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    gc.callbacks.append(_freeze_survivors)


def _freeze_survivors(phase: str, info: dict) -> None:
    if phase == "stop" and info["generation"] == OLDEST_GENERATION:
        gc.freeze()
