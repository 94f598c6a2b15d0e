"""engine.pauses: a full garbage collection does not visit again what
survived the last one (a pause of 0.2-0.4 s with 10 000 queues otherwise).

Run in a child interpreter: freezing is for the whole process.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUEUES = 2_000

CHILD = textwrap.dedent(f"""
    import gc, json
    from raftq.engine.pauses import keep_pauses_short
    from raftq.statemachine import StateMachine, encode_entry
    from raftq.statemachine.machine import MAX_NEW_QUEUES_PER_ENTRY

    keep_pauses_short()
    machine = StateMachine()
    for first in range(0, {QUEUES}, MAX_NEW_QUEUES_PER_ENTRY):   # the most queues one entry may make
        machine.apply_entry(encode_entry([{{"op": "put", "queue": f"q{{i}}", "messages": [{{"body": "x"}}],
                                           "now_ms": 1}} for i in range(first, first + MAX_NEW_QUEUES_PER_ENTRY)]))
    gc.collect()
    frozen = gc.get_freeze_count()
    machine.apply_entry(encode_entry([{{"op": "put", "queue": "q1", "messages": [{{"body": "y"}}], "now_ms": 2}}]))
    print(json.dumps({{"frozen": frozen, "oldest": len(gc.get_objects(generation=2)),
                      "queues": len(machine.queues)}}))
""")


def test_what_survived_a_full_collection_is_not_visited_by_the_next():
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["queues"] == QUEUES
    assert seen["frozen"] > 10 * QUEUES     # every queue's objects, and the interpreter's own
    assert seen["oldest"] < QUEUES / 10     # left for the next full collection to visit
