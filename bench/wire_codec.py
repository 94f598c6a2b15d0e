"""What an append and its answer cost to encode and decode: pysyncobj's pickle against the binary wire.

    .venv/bin/python bench/wire_codec.py

In-process, no socket and no seal (both forms are sealed alike): a lone put's
append (one entry of about 320 bytes) and its answer, then appends of one 64
KiB and one 1 MiB entry of random bytes, each with a connection's 32-byte key
as it travels. The last line printed is one JSON object: per message, the
bytes and the microseconds to encode and to decode in each form.
"""

import json
import os
import pickle
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pysyncobj import pickle as pysyncobj_pickle  # noqa: E402

from raftq.engine.raft import binary_wire  # noqa: E402


def append_of(command: bytes) -> dict:
    return {"type": "append_entries", "term": 3, "commit_index": 1000, "prevLogIdx": 1000, "prevLogTerm": 3,
            "entries": [(command, 1001, 3)], "sent_at": 1234.5678}


def main() -> None:
    key = os.urandom(binary_wire.KEY_BYTES)
    messages = {
        "lone_put_append": append_of(b"\x00" + pickle.dumps((7, (b"x" * 300,)), 5)),
        "lone_put_answer": {"type": "next_node_idx", "term": 3, "next_node_idx": 1002, "reset": False,
                            "success": True, "sent_at": 1234.5678},
        "append_64_kib": append_of(os.urandom(64 * 1024)),
        "append_1_mib": append_of(os.urandom(1 << 20)),
    }
    figures = {}
    for name, message in messages.items():
        pickled = pysyncobj_pickle.dumps((key, message))
        binary = binary_wire.encode(message, key)
        number = max(20, 20_000_000 // max(len(pickled), 1000))

        def us(call) -> float:
            return round(timeit.timeit(call, number=number) / number * 1e6, 2)
        figures[name] = {
            "pickle": {"bytes": len(pickled), "encode_us": us(lambda: pysyncobj_pickle.dumps((key, message))),
                       "decode_us": us(lambda: pysyncobj_pickle.loads(pickled))},
            "binary": {"bytes": len(binary),
                       "encode_us": us(lambda: binary_wire.encode(message, key)),
                       "decode_us": us(lambda: binary_wire.decode(binary))},
        }
        print(name, figures[name], flush=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
