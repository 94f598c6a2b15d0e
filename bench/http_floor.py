"""What aiohttp alone costs a lone put's request: the floor under a front's CPU per put.

    .venv/bin/python -m bench.http_floor [--seconds 5]

A bare aiohttp server, in a process of its own on this machine, answers the
request a lone put makes (raftq's own client, the same path, JSON body and
bearer token, one request at a time) as a put is answered, 201 and a JSON
body, after decoding the request's body, and does nothing else: no
middleware, no validation, no engine. Its CPU per request is what any
aiohttp front pays for one; `bench.put_cpu` reports the leader's front
beside it, so the front's own share of a put is read in one run.

The last line is one JSON object with its figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.measure import percentile, user_system_by_process  # noqa: E402
from bench.put_bench import put_load  # noqa: E402

WARM_UP_S = 1.0


def serve(port: int) -> None:
    import orjson
    from aiohttp import web

    async def put(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        ids = [f"floor-{n}" for n in range(len(body["messages"]))]
        return web.Response(body=orjson.dumps({"ids": ids, "index": 1}), status=201,
                            content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/queues/{name}/messages", put)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def measure(seconds: float) -> dict:
    """Lone requests to a bare aiohttp server for `seconds`: its CPU per request (user and
    system µs) and the requests' latency percentiles."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "bench.http_floor", "--serve", str(port)], cwd=ROOT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the bare aiohttp server did not start")
                await asyncio.sleep(0.05)
        await put_load([url], "floor-token", "warm-up", 1, 1, WARM_UP_S)
        before = user_system_by_process([server.pid])[server.pid]
        _, latencies = await put_load([url], "floor-token", "floor", 1, 1, seconds)
        after = user_system_by_process([server.pid])[server.pid]
    finally:
        server.terminate()
        server.wait(30)
    requests = len(latencies)
    return {"requests": requests,
            "user_us": round((after[0] - before[0]) * 1e6 / requests),
            "system_us": round((after[1] - before[1]) * 1e6 / requests),
            "p50_ms": round(percentile(latencies, 50) * 1000, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    figures = asyncio.run(measure(args.seconds))
    print(f"{figures['requests']} lone requests to a bare aiohttp server: {figures['user_us']} µs user, "
          f"{figures['system_us']} µs system of its CPU each, p50 {figures['p50_ms']} ms")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
