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

Like the queues, this is pure: log time comes from the state machine, and
refusals are results.
"""

from sortedcontainers import SortedList

from .results import CONFLICT, NOT_FOUND, error

DEFAULT_STAGE_TTL_MS = 3_600_000


class Staging:
    def __init__(self):
        # token -> {"producer", "queue", "chunks": {index: [messages]}, "expires_at"}
        self.stages: dict[str, dict] = {}
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
              ttl_ms: int, clock: int):
        stage = self.stages.get(token)
        if stage is None:
            stage = self.stages[token] = {"producer": producer, "queue": queue, "chunks": {},
                                          "expires_at": None}
        elif (stage["producer"], stage["queue"]) != (producer, queue):
            return error(CONFLICT, f"stage {token!r} belongs to producer {stage['producer']!r} "
                                   f"and queue {stage['queue']!r}")
        stage["chunks"][chunk] = messages
        self._set_stage_expiry(token, clock + ttl_ms)
        return {"staged": len(messages), "chunks": len(stage["chunks"])}

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
        tokens = [t for t, s in self.stages.items() if s["producer"] == producer]
        if producer not in self.producers and not tokens:
            return error(NOT_FOUND, f"producer {producer!r} has neither commits nor stages")
        for token in tokens:
            self._drop_stage(token)
        self._drop_producer(producer)
        return {"deleted": True, "stages_dropped": len(tokens)}

    # ---- internals ------------------------------------------------------------------
    def _set_stage_expiry(self, token: str, expires_at: int) -> None:
        stage = self.stages[token]
        if stage["expires_at"] is not None:
            self.stage_expiries.remove((stage["expires_at"], token))
        stage["expires_at"] = expires_at
        self.stage_expiries.add((expires_at, token))

    def _drop_stage(self, token: str) -> None:
        stage = self.stages.pop(token, None)
        if stage is not None:
            self.stage_expiries.remove((stage["expires_at"], token))

    def _drop_producer(self, producer: str) -> None:
        record = self.producers.pop(producer, None)
        if record is not None and record["expires_at"] is not None:
            self.producer_expiries.remove((record["expires_at"], producer))

    # ---- read-only views --------------------------------------------------------------
    def producer_info(self, producer: str) -> dict:
        stages = [{"token": token, "queue": s["queue"], "chunks": len(s["chunks"]),
                   "messages": sum(map(len, s["chunks"].values())), "expires_at": s["expires_at"]}
                  for token, s in self.stages.items() if s["producer"] == producer]
        record = self.producers.get(producer)
        return {"producer": producer, "committed_batch": None if record is None else record["batch"],
                "expires_at": None if record is None else record["expires_at"], "stages": stages}

    def list_producers(self) -> dict:
        """Every producer with a mark or stages: what staging holds, for operators."""
        names = list(dict.fromkeys([*self.producers, *(s["producer"] for s in self.stages.values())]))
        out = []
        for name in names:
            info = self.producer_info(name)
            out.append({"producer": name, "committed_batch": info["committed_batch"],
                        "stages": len(info["stages"]),
                        "staged_messages": sum(s["messages"] for s in info["stages"])})
        return {"producers": out}

    # ---- snapshot ---------------------------------------------------------------------
    def to_state(self) -> list:
        return [[[token, s["producer"], s["queue"], s["expires_at"],
                  [[index, messages] for index, messages in s["chunks"].items()]]
                 for token, s in self.stages.items()],
                [[producer, r["batch"], r["expires_at"]] for producer, r in self.producers.items()]]

    @classmethod
    def from_state(cls, state: list) -> "Staging":
        staging = cls()
        stages, producers = state
        for token, producer, queue, expires_at, chunks in stages:
            staging.stages[token] = {"producer": producer, "queue": queue, "expires_at": expires_at,
                                     "chunks": {index: messages for index, messages in chunks}}
            staging.stage_expiries.add((expires_at, token))
        for producer, batch, expires_at in producers:
            staging.producers[producer] = {"batch": batch, "expires_at": expires_at}
            if expires_at is not None:
                staging.producer_expiries.add((expires_at, producer))
        return staging
