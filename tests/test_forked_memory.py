"""A node's engines and fronts are forked from its supervisor (raftq/server.py
``_fork``) and share its memory until they write to it.

A garbage collection writes to every object it visits, so a child's first
full collection used to copy every page of the objects it inherited. Run in
a fresh interpreter: the freeze is for good in the process that forks.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD_COPIES = textwrap.dedent("""
    import gc, json, os, sys
    from raftq.server import _fork

    def private_dirty_kib():
        with open("/proc/self/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Private_Dirty:"))

    inherited = [[i] for i in range(400_000)]      # tracked by the collector: some 40 MB
    reading, writing = os.pipe()

    def child():
        before = private_dirty_kib()
        gc.collect()
        os.write(writing, json.dumps(private_dirty_kib() - before).encode())
        return 0

    pid = _fork([], keep=[], body=child)
    copied_kib = int(os.read(reading, 100))
    os.waitpid(pid, 0)
    print(json.dumps({"copied_kib": copied_kib, "objects_kib": len(inherited) * 104 // 1024}))
""")


def test_a_forked_childs_garbage_collection_copies_none_of_what_it_inherited():
    done = subprocess.run([sys.executable, "-c", CHILD_COPIES], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    # without the freeze the collection copies nearly all of them (~40 MB)
    assert figures["copied_kib"] < figures["objects_kib"] / 10, figures
