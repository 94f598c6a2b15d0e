"""Toxics: what a Toxiproxy toxic does to the bytes of one connection.

A `Toxic` is the configuration the HTTP API stores on a proxy (name, type,
stream, toxicity, attributes; the JSON shape and the attribute names are
Toxiproxy's). A `Stage` is that toxic at work on one direction of one
connection, created when the connection opens or when the toxic is added to
a connection that is already open, so toxics act live, as in Toxiproxy.

Each direction of a connection reads chunks from its source, stamps each with
the time it was read, and pushes them one at a time through its stages in the
order the toxics were added; a stage passes a chunk on by awaiting `emit`,
possibly later, in pieces, or not at all. An empty chunk is the end of the
stream (the peer's FIN) and travels the same road, which is how slow_close
can hold it back. Delays are measured from the read stamp, not from when a
stage got to the chunk, so 100 ms of latency stays 100 ms per chunk however
many chunks are in flight, instead of adding up.

A stage removed while it holds a chunk lets the chunk go at once rather than
dropping it. Stages reach the connection through two calls only:
`conn.close()` (orderly close of both sockets) and `conn.reset()` (RST).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

STREAMS = ("upstream", "downstream")


class InvalidToxic(ValueError):
    """A toxic definition the API must refuse with 400."""


@dataclass
class Chunk:
    data: bytes  # b"" marks the end of the stream
    stamp: float  # loop time when read, moved on by each latency stage


Emit = Callable[[Chunk], Awaitable[None]]


class Stage:
    """One toxic acting on one direction of one connection."""

    defaults: dict[str, int] = {}

    def __init__(self, attributes: dict[str, int], conn: Any, rng: random.Random):
        self.attributes = attributes
        self.conn = conn
        self.rng = rng
        self.loop = asyncio.get_running_loop()
        self._stopped = self.loop.create_future()

    async def process(self, chunk: Chunk, emit: Emit) -> None:
        await emit(chunk)

    def stop(self) -> None:
        """The connection is going away, or this stage is being replaced."""
        if not self._stopped.done():
            self._stopped.set_result(None)

    def remove(self) -> None:
        """The toxic was deleted through the API."""
        self.stop()

    @property
    def stopped(self) -> bool:
        return self._stopped.done()

    async def sleep_until(self, when: float) -> None:
        # Cut short by stop() so that removing a toxic frees what it holds.
        delay = when - self.loop.time()
        if delay > 0 and not self.stopped:
            await asyncio.wait((self._stopped,), timeout=delay)


class Latency(Stage):
    defaults = {"latency": 0, "jitter": 0}

    async def process(self, chunk, emit):
        if chunk.data:
            jitter = self.attributes["jitter"]
            delay_ms = self.attributes["latency"] + (self.rng.uniform(-jitter, jitter) if jitter > 0 else 0)
            chunk.stamp += delay_ms / 1000
            await self.sleep_until(chunk.stamp)
            # Released early by removal: later stages must not count from a future stamp.
            chunk.stamp = min(chunk.stamp, self.loop.time())
        await emit(chunk)


class Bandwidth(Stage):
    defaults = {"rate": 0}  # KB/s; 0 or less means unlimited

    def __init__(self, *args):
        super().__init__(*args)
        self._free_at = 0.0

    async def process(self, chunk, emit):
        rate = self.attributes["rate"]
        if rate <= 0 or not chunk.data:
            await emit(chunk)
            return
        # Pieces of 100 ms worth keep a slow link trickling instead of
        # delivering one big chunk late (Toxiproxy does the same).
        piece = rate * 100
        for start in range(0, len(chunk.data), piece):
            part = chunk.data[start:start + piece]
            # Idle time earns no credit: a link that was quiet cannot burst.
            self._free_at = max(self._free_at, self.loop.time()) + len(part) / (rate * 1000)
            await self.sleep_until(self._free_at)
            await emit(Chunk(part, chunk.stamp))


class Timeout(Stage):
    """Black hole: drop all data; close `timeout` ms after the last data, or never if 0."""

    defaults = {"timeout": 0}

    def __init__(self, *args):
        super().__init__(*args)
        self._timer: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self):
        if self._timer:
            self._timer.cancel()
        if self.attributes["timeout"] > 0:
            self._timer = self.loop.call_later(self.attributes["timeout"] / 1000, self.conn.close)

    async def process(self, chunk, emit):
        if not chunk.data:
            await emit(chunk)
        elif not self.stopped:
            self._arm()  # Toxiproxy restarts its timer with every chunk it drops

    def stop(self):
        if self._timer:
            self._timer.cancel()
        super().stop()

    def remove(self):
        # Bytes have been dropped mid-stream, so the connection cannot carry
        # on; Toxiproxy closes it when the toxic goes away.
        self.stop()
        self.conn.close()


class ResetPeer(Stage):
    """On the first data (or end of stream) in its direction, wait `timeout` ms, then RST."""

    defaults = {"timeout": 0}

    def __init__(self, *args):
        super().__init__(*args)
        self._triggered = False

    async def process(self, chunk, emit):
        # Whatever arrives is dropped, as in Toxiproxy: passing it on could
        # let a clean FIN out before the reset.
        if self._triggered or self.stopped:
            return
        self._triggered = True
        await self.sleep_until(self.loop.time() + self.attributes["timeout"] / 1000)
        if not self.stopped:
            self.conn.reset()


class SlowClose(Stage):
    defaults = {"delay": 0}

    async def process(self, chunk, emit):
        if not chunk.data:
            await self.sleep_until(self.loop.time() + self.attributes["delay"] / 1000)
        await emit(chunk)


class LimitData(Stage):
    """Pass `bytes` bytes in its direction, then close the connection."""

    defaults = {"bytes": 0}

    def __init__(self, *args):
        super().__init__(*args)
        self._passed = 0

    async def process(self, chunk, emit):
        if not chunk.data:
            await emit(chunk)
            return
        part = chunk.data[:max(self.attributes["bytes"] - self._passed, 0)]
        if part:
            self._passed += len(part)
            await emit(Chunk(part, chunk.stamp))
        if self._passed >= self.attributes["bytes"]:
            self.conn.close()


class Slicer(Stage):
    """Split chunks into pieces of average_size +/- size_variation bytes, `delay` µs apart."""

    defaults = {"average_size": 0, "size_variation": 0, "delay": 0}

    async def process(self, chunk, emit):
        average = self.attributes["average_size"]
        if average <= 0 or not chunk.data:
            await emit(chunk)
            return
        variation = min(self.attributes["size_variation"], average - 1)
        data = chunk.data
        while data:
            size = average + self.rng.randint(-variation, variation) if variation > 0 else average
            await emit(Chunk(data[:size], chunk.stamp))
            data = data[size:]
            if data:
                await self.sleep_until(self.loop.time() + self.attributes["delay"] / 1_000_000)


TYPES: dict[str, type[Stage]] = {
    "latency": Latency,
    "bandwidth": Bandwidth,
    "timeout": Timeout,
    "reset_peer": ResetPeer,
    "slow_close": SlowClose,
    "limit_data": LimitData,
    "slicer": Slicer,
}


def _attributes(stage: type[Stage], given: Any, base: dict[str, int]) -> dict[str, int]:
    if not isinstance(given, dict):
        raise InvalidToxic("bad request body: attributes must be an object")
    attributes = dict(base)
    for key in stage.defaults.keys() & given.keys():  # unknown keys are ignored, as in Toxiproxy
        value = given[key]
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidToxic(f"bad request body: attribute {key} must be an integer")
        attributes[key] = value
    return attributes


def _toxicity(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidToxic("bad request body: toxicity must be a number")
    return float(value)


class Toxic:
    """A toxic as the API defines it; `stage()` puts it to work on a connection."""

    def __init__(self, name: str, type: str, stream: str, toxicity: float, attributes: dict[str, int]):
        self.name = name
        self.type = type
        self.stream = stream
        self.toxicity = toxicity
        self.attributes = attributes

    @classmethod
    def from_json(cls, body: Any) -> Toxic:
        if not isinstance(body, dict):
            raise InvalidToxic("bad request body: expected a JSON object")
        stream = body.get("stream", "downstream")
        if not isinstance(stream, str) or stream.lower() not in STREAMS:
            raise InvalidToxic("stream was invalid, can be either upstream or downstream")
        stream = stream.lower()
        kind = body.get("type")
        stage = TYPES.get(kind) if isinstance(kind, str) else None
        if stage is None:
            raise InvalidToxic("invalid toxic type")
        name = body.get("name") or f"{kind}_{stream}"
        if not isinstance(name, str):
            raise InvalidToxic("bad request body: name must be a string")
        return cls(name, kind, stream, _toxicity(body.get("toxicity", 1.0)),
                   _attributes(stage, body.get("attributes", {}), stage.defaults))

    def updated(self, body: Any) -> Toxic:
        """This toxic with the attributes and toxicity in `body` changed (Toxiproxy's toxic update)."""
        if not isinstance(body, dict):
            raise InvalidToxic("bad request body: expected a JSON object")
        return Toxic(self.name, self.type, self.stream,
                     _toxicity(body.get("toxicity", self.toxicity)),
                     _attributes(TYPES[self.type], body.get("attributes", {}), self.attributes))

    def stage(self, conn: Any, rng: random.Random) -> Stage | None:
        """A stage for one connection, or None when toxicity says this one is spared."""
        if rng.random() >= self.toxicity:
            return None
        return TYPES[self.type](self.attributes, conn, rng)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "stream": self.stream,
                "toxicity": self.toxicity, "attributes": dict(self.attributes)}
