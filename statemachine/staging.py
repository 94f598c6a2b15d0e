"""Staged writes: rows parked in the state machine until one commit publishes them.

A writer that runs as many parallel, retryable tasks (a Spark job) cannot make
its output visible all at once with plain puts, and a batch replayed hours
later — after any idempotency window — would be stored twice.  Staging closes
both gaps:

- each task attempt stages its rows under a ``token`` of its own, in chunks
  (``(token, chunk)`` is replaced by a repeat, so a retried request stores
  its rows once); staged rows are invisible to every consumer;
- the writer's driver commits ``(producer, batch)`` naming the token that won
  for each partition: one command, so one log entry, puts every row of those
  stages into their queues and records ``batch`` as the producer's
  high-water mark;
- a commit of a batch at or below the producer's high-water mark is a no-op
  that answers ``duplicate``: a replayed batch, or a retried commit whose
  first answer was lost, publishes nothing twice, however late it comes;
- ``stage_abort`` drops stages; a stage not committed within its ``ttl_ms``
  of log time (a task attempt that lost, a driver that died) is dropped by
  the timers, and so is a producer's record ``retain_ms`` after its last
  commit when the commit asked for that (one-off producers).

A staged body applied with its entry's log index is a reference into the
stage's entry (bodies.py), as a put's is: the commit moves references into
the queues, so a committed message costs a row like a put's, not its body in
the heap. Compaction keeps a stage's entries (``log_indexes``) until the
stage is committed, aborted or expired; then the rows' references keep what
they name. Staging holds every staged row's other fields in every replica's
memory, so it is bounded:
stages and bytes per producer and in all, and messages per producer, which
bounds what one commit publishes in one entry (``caps`` of a stage command, which
the leader fills from its node options: the limit travels in the command, so
every replica refuses the same stage). A stage past a cap is refused whole
(``limit_reached``) and changes nothing; an abort, a commit or an expiry
gives its bytes back at once.

A producer's high-water mark moves only by a commit that publishes stages:
a commit that names none leaves it where it is, and a batch more than
``MAX_BATCH_STEP`` past it (past -1 for a producer without one) is refused,
so one stray or hostile request cannot make every later batch a duplicate.

Like the queues, this is pure: log time comes from the state machine, and
refusals are results.
"""

from sortedcontainers import SortedList

from .bodies import BodyRef
from .queue import message_size
from .results import CONFLICT, LIMIT_REACHED, NOT_FOUND, error

DEFAULT_STAGE_TTL_MS = 3_600_000
# What a staged message counts besides message_size (the bytes a queue's
# max_bytes counts): what holding it costs, so that empty bodies are not free.
STAGED_MESSAGE_OVERHEAD = 100
# A Spark stream numbers its micro-batches 0, 1, 2, ...; batches that stage
# no rows leave gaps, but not of a million (11 days of one-second triggers).
MAX_BATCH_STEP = 1_000_000
# The caps a stage command carries (node options of the same names), and the
# option that sets each, for the refusal's message.
STAGE_CAPS = {"stages": "max-stages", "bytes": "max-staged-bytes",
              "producer_stages": "max-stages-per-producer", "producer_bytes": "max-staged-bytes-per-producer",
              "producer_messages": "max-staged-messages-per-producer"}


def staged_size(messages: list) -> int:
    return sum(message_size(m) for m in messages) + STAGED_MESSAGE_OVERHEAD * len(messages)


class Staging:
    def __init__(self):
        # token -> {"producer", "queue", "chunks": {index: [messages]}, "sizes": {index: bytes},
        #           "expires_at"}  (sizes: derived, not in snapshots)
        self.stages: dict[str, dict] = {}
        # producer -> {"tokens": {token: None}, "bytes", "messages"}: what each producer has staged (derived)
        self.staged: dict[str, dict] = {}
        self.staged_bytes = 0
        self.stage_expiries = SortedList()        # (expires_at, token)
        # producer -> {"batch": high-water mark, "expires_at": log time or None}
        self.producers: dict[str, dict] = {}
        self.producer_expiries = SortedList()     # (expires_at, producer)

    # ---- timers -----------------------------------------------------------------
    def advance(self, clock: int) -> None:
        while self.stage_expiries and self.stage_expiries[0][0] <= clock:
            self._drop_stage(self.stage_expiries[0][1])
        while self.producer_expiries and self.producer_expiries[0][0] <= clock:
            self._drop_producer(self.producer_expiries[0][1])

    def next_timer(self):
        times = [s[0][0] for s in (self.stage_expiries, self.producer_expiries) if s]
        return min(times) if times else None

    # ---- commands -----------------------------------------------------------------
    def stage(self, producer: str, token: str, chunk: int, queue: str, messages: list,
              ttl_ms: int, clock: int, caps: dict | None = None):
        stage = self.stages.get(token)
        if stage is not None and (stage["producer"], stage["queue"]) != (producer, queue):
            return error(CONFLICT, f"stage {token!r} belongs to producer {stage['producer']!r} "
                                   f"and queue {stage['queue']!r}")
        size = staged_size(messages)
        replaced = stage["chunks"].get(chunk, ()) if stage else ()
        problem = self._check_caps(producer, stage is None, size - (stage["sizes"].get(chunk, 0) if stage else 0),
                                   len(messages) - len(replaced), caps or {})
        if problem:
            return problem
        if stage is None:
            stage = self.stages[token] = {"producer": producer, "queue": queue, "chunks": {}, "sizes": {},
                                          "expires_at": None}
        self._set_chunk(token, chunk, messages, size)
        self._set_stage_expiry(token, clock + ttl_ms)
        return {"staged": len(messages), "chunks": len(stage["chunks"])}

    def _check_caps(self, producer: str, new_stage: bool, more_bytes: int, more_messages: int, caps: dict):
        mine = self.staged.get(producer, {"tokens": {}, "bytes": 0, "messages": 0})
        after = {"stages": len(self.stages) + new_stage, "bytes": self.staged_bytes + more_bytes,
                 "producer_stages": len(mine["tokens"]) + new_stage, "producer_bytes": mine["bytes"] + more_bytes,
                 "producer_messages": mine["messages"] + more_messages}
        grows = {"stages": new_stage, "bytes": more_bytes > 0, "producer_stages": new_stage,
                 "producer_bytes": more_bytes > 0, "producer_messages": more_messages > 0}
        for name, option in STAGE_CAPS.items():
            cap = caps.get(name)
            if cap is not None and grows[name] and after[name] > cap:
                whose = f"producer {producer!r}" if name.startswith("producer") else "the cluster"
                what = {"stages": "stages", "bytes": "staged bytes", "messages": "staged messages"}[
                    name.rsplit("_", 1)[-1]]
                return error(LIMIT_REACHED, f"{whose} would hold {after[name]} {what} (limit {cap}, the node "
                                            f"option --{option}); commit or abort stages first")
        return None

    def committed_batch(self, producer: str):
        record = self.producers.get(producer)
        return None if record is None else record["batch"]

    def check_commit(self, producer: str, parts: list):
        """(messages of the named stages per queue, in part and chunk order, None), or (None, error)."""
        batches: dict[str, list] = {}
        for part in parts:
            stage = self.stages.get(part["token"])
            if stage is None or stage["producer"] != producer:
                return None, error(CONFLICT, f"stage {part['token']!r} of producer {producer!r} does not "
                                             "exist (never staged, aborted, or expired)")
            if sorted(stage["chunks"]) != list(range(part["chunks"])):
                return None, error(CONFLICT, f"stage {part['token']!r} holds chunks "
                                             f"{sorted(stage['chunks'])}, not 0 to {part['chunks'] - 1}")
            out = batches.setdefault(stage["queue"], [])
            for index in range(part["chunks"]):
                out.extend(stage["chunks"][index])
        return batches, None

    def record_commit(self, producer: str, batch: int, parts: list, retain_until) -> None:
        for part in parts:
            self._drop_stage(part["token"])
        self._drop_producer(producer)
        self.producers[producer] = {"batch": batch, "expires_at": retain_until}
        if retain_until is not None:
            self.producer_expiries.add((retain_until, producer))

    def drop_stages(self, producer: str, tokens: list) -> int:
        mine = [t for t in dict.fromkeys(tokens) if self.stages.get(t, {}).get("producer") == producer]
        for token in mine:
            self._drop_stage(token)
        return len(mine)

    def drop_producer(self, producer: str):
        tokens = list(self.staged.get(producer, {"tokens": {}})["tokens"])
        if producer not in self.producers and not tokens:
            return error(NOT_FOUND, f"producer {producer!r} has neither commits nor stages")
        for token in tokens:
            self._drop_stage(token)
        self._drop_producer(producer)
        return {"deleted": True, "stages_dropped": len(tokens)}

    def relocate(self, token: str, chunk: int, at: int, old: BodyRef, new: BodyRef) -> bool:
        """Point the staged message at position `at` of chunk `chunk` of stage `token` at `new`
        if its body is the reference `old`, exactly; whether it did (machine.py's ``_relocate``)."""
        messages = self.stages.get(token, {}).get("chunks", {}).get(chunk)
        if messages is None or not 0 <= at < len(messages):
            return False
        message = messages[at]
        if not isinstance(message["body"], BodyRef) or message["body"] != old:
            return False
        messages[at] = {**message, "body": new}
        return True

    # ---- internals ------------------------------------------------------------------
    def _set_stage_expiry(self, token: str, expires_at: int) -> None:
        stage = self.stages[token]
        if stage["expires_at"] is not None:
            self.stage_expiries.remove((stage["expires_at"], token))
        stage["expires_at"] = expires_at
        self.stage_expiries.add((expires_at, token))

    def _set_chunk(self, token: str, chunk: int, messages: list, size: int) -> None:
        stage = self.stages[token]
        mine = self.staged.setdefault(stage["producer"], {"tokens": {}, "bytes": 0, "messages": 0})
        more = size - stage["sizes"].get(chunk, 0)
        mine["messages"] += len(messages) - len(stage["chunks"].get(chunk, ()))
        stage["chunks"][chunk], stage["sizes"][chunk] = messages, size
        mine["tokens"][token] = None
        mine["bytes"] += more
        self.staged_bytes += more

    def _drop_stage(self, token: str) -> None:
        stage = self.stages.pop(token, None)
        if stage is not None:
            self.stage_expiries.remove((stage["expires_at"], token))
            size = sum(stage["sizes"].values())
            mine = self.staged[stage["producer"]]
            del mine["tokens"][token]
            mine["bytes"] -= size
            mine["messages"] -= sum(map(len, stage["chunks"].values()))
            self.staged_bytes -= size
            if not mine["tokens"]:
                del self.staged[stage["producer"]]

    def _drop_producer(self, producer: str) -> None:
        record = self.producers.pop(producer, None)
        if record is not None and record["expires_at"] is not None:
            self.producer_expiries.remove((record["expires_at"], producer))

    # ---- read-only views --------------------------------------------------------------
    def producer_info(self, producer: str) -> dict:
        mine = self.staged.get(producer, {"tokens": {}, "bytes": 0, "messages": 0})
        stages = [{"token": token, "queue": s["queue"], "chunks": len(s["chunks"]),
                   "messages": sum(map(len, s["chunks"].values())), "bytes": sum(s["sizes"].values()),
                   "expires_at": s["expires_at"]}
                  for token, s in ((t, self.stages[t]) for t in mine["tokens"])]
        record = self.producers.get(producer)
        return {"producer": producer, "committed_batch": None if record is None else record["batch"],
                "expires_at": None if record is None else record["expires_at"], "staged_bytes": mine["bytes"],
                "stages": stages}

    def list_producers(self) -> dict:
        """Every producer with a mark or stages: what staging holds, for operators."""
        names = list(dict.fromkeys([*self.producers, *self.staged]))
        out = []
        for name in names:
            info = self.producer_info(name)
            out.append({"producer": name, "committed_batch": info["committed_batch"],
                        "stages": len(info["stages"]), "staged_bytes": info["staged_bytes"],
                        "staged_messages": sum(s["messages"] for s in info["stages"])})
        return {"producers": out}

    def usage(self) -> dict:
        """What staging holds in all: the figures its caps count."""
        return {"stages": len(self.stages), "bytes": self.staged_bytes, "producers": len(self.staged),
                "marks": len(self.producers)}

    def log_indexes(self) -> set:
        """The log indexes of the stage entries whose bodies staged messages refer to: what
        compaction must keep until the stage is committed, aborted or expired."""
        return {message["body"].index for stage in self.stages.values() for messages in stage["chunks"].values()
                for message in messages if isinstance(message["body"], BodyRef)}

    def references(self) -> list:
        """(token, chunk, position, reference) of every staged message whose body is a reference:
        what a relocation may move (engine/relocation.py)."""
        return [(token, chunk, at, message["body"]) for token, stage in self.stages.items()
                for chunk, messages in stage["chunks"].items()
                for at, message in enumerate(messages) if isinstance(message["body"], BodyRef)]

    # ---- snapshot ---------------------------------------------------------------------
    # A staged message is held as it was staged, but with a body reference as
    # "ref": [index, offset, length, kind] in place of "body" (a field no
    # message may have): encoded as it is, a reference would read back as a
    # list body.
    def to_state(self) -> list:
        return [[[token, s["producer"], s["queue"], s["expires_at"],
                  [[index, list(map(_message_to_state, messages))] for index, messages in s["chunks"].items()]]
                 for token, s in self.stages.items()],
                [[producer, r["batch"], r["expires_at"]] for producer, r in self.producers.items()]]

    @classmethod
    def from_state(cls, state: list) -> "Staging":
        staging = cls()
        stages, producers = state
        for token, producer, queue, expires_at, chunks in stages:
            staging.stages[token] = {"producer": producer, "queue": queue, "expires_at": expires_at,
                                     "chunks": {}, "sizes": {}}
            for index, messages in chunks:
                messages = list(map(_message_from_state, messages))
                staging._set_chunk(token, index, messages, staged_size(messages))
            staging.stage_expiries.add((expires_at, token))
        for producer, batch, expires_at in producers:
            staging.producers[producer] = {"batch": batch, "expires_at": expires_at}
            if expires_at is not None:
                staging.producer_expiries.add((expires_at, producer))
        return staging


def _message_to_state(message: dict) -> dict:
    body = message["body"]
    if not isinstance(body, BodyRef):
        return message
    state = {field: value for field, value in message.items() if field != "body"}
    state["ref"] = list(body)
    return state


def _message_from_state(state: dict) -> dict:
    if "ref" not in state:
        return state
    message = {field: value for field, value in state.items() if field != "ref"}
    message["body"] = BodyRef(*state["ref"])
    return message
