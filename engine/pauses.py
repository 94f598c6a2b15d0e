"""What keeps the engine process from pausing its ticks.

The engine's loop runs pysyncobj's ticks, which send heartbeats
(``engine.raft.ticking``); anything that holds the interpreter for longer
than the leader lease costs the cluster its leader.  Full garbage
collections did, under load (tests/test_saturation.py): a full collection
visits every object the collector tracks; with ten thousand queues (each a
few dozen dicts, lists and sorted lists) it took 0.2-0.4 s, and found
nothing: the state machine holds no reference cycles.  What survived a full
collection is frozen (``gc.freeze``), so the next one visits only what was
promoted since.  (Stored messages are rows of arrays and flag bytes, which
the collector does not track at all: statemachine/rows.py,
statemachine/ready.py.)  The price: an object frozen while alive that later
becomes part of a garbage cycle is never reclaimed.  The engine's
long-lived objects -- queues, groups, connections, the journal -- are freed
by reference counting; a cycle among them leaks its few objects.

(The switch interval, 0.5 ms here while a tick thread had to win the
interpreter lock back from the loop many times a tick, went with that
thread.)
"""

import gc

OLDEST_GENERATION = 2


def keep_pauses_short() -> None:
    """For the engine process only, once, as it starts."""
    gc.callbacks.append(_freeze_survivors)


def _freeze_survivors(phase: str, info: dict) -> None:
    if phase == "stop" and info["generation"] == OLDEST_GENERATION:
        gc.freeze()
