"""RabbitMQ quorum queues as one side of `python -m bench compare`: three
RabbitMQ nodes (Debian's rabbitmq-server) clustered on 127.0.0.1 in a scratch
folder, driven with pika, publisher confirms on, persistent messages.

Each node gets private ports, its own epmd port and a shared private Erlang
cookie (HOME); Erlang's scheduler busy-waiting is off so idle nodes leave the
two cores alone. Everything started here is stopped here, by PID.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pika

from bench.measure import Pacer
from raftq.local import free_ports

BIN = Path("/usr/lib/rabbitmq/bin")
PAYLOAD = b"x" * 100
PERSISTENT = pika.BasicProperties(delivery_mode=2)
W2_WINDOW = 1000
W3_PREFETCH, W3_ACK_EVERY = 1000, 100
NODE_CONFIG = """listeners.tcp.1 = 127.0.0.1:{amqp}
loopback_users = none
default_user = guest
default_pass = guest
log.console = false
log.file.level = warning
vm_memory_high_watermark.relative = 0.1
disk_free_limit.absolute = 1GB
"""


def publish_window(params: pika.ConnectionParameters, queue: str, seconds: float, count: int | None, window: int,
                   pacer: Pacer | None = None, stamp: bool = False, ready=None) -> dict:
    """Asynchronous publishing with confirms, at most `window` unconfirmed, for `seconds`
    or `count` messages; `ready()` is called once the channel is open, before the clock starts."""
    state = {"sent": 0, "confirmed": 0, "started": None, "elapsed": None}
    conn: pika.SelectConnection

    def done_sending(now: float) -> bool:
        return (count is not None and state["sent"] >= count) or \
            (count is None and now - state["started"] >= seconds)

    def pump():
        channel = state["channel"]
        now = time.perf_counter()
        budget = window - (state["sent"] - state["confirmed"])
        if pacer is not None:
            budget = min(budget, pacer.due())
        while budget > 0 and not done_sending(now):
            body = repr(time.perf_counter()).encode().ljust(100) if stamp else PAYLOAD
            channel.basic_publish("", queue, body, PERSISTENT)
            state["sent"] += 1
            budget -= 1
            if pacer is not None:
                pacer.took(1)
        if done_sending(now) and state["confirmed"] >= state["sent"]:
            state["elapsed"] = time.perf_counter() - state["started"]
            conn.close()
        elif pacer is not None:
            conn.ioloop.call_later(0.001, pump)

    def on_confirm(frame):
        method = frame.method
        tag = method.delivery_tag
        newly = tag - state["last_tag"] if method.multiple else 1
        state["last_tag"] = max(state["last_tag"], tag)
        if not isinstance(method, pika.spec.Basic.Ack):
            raise RuntimeError("RabbitMQ refused a publish (nack)")
        state["confirmed"] += newly
        if pacer is None:
            pump()

    def on_channel(channel):
        state["channel"], state["last_tag"] = channel, 0
        channel.confirm_delivery(on_confirm)
        if ready is not None:
            ready()
        state["started"] = time.perf_counter()
        pump()

    conn = pika.SelectConnection(params, on_open_callback=lambda c: c.channel(on_open_callback=on_channel))
    conn.add_on_close_callback(lambda *_: conn.ioloop.stop())
    conn.ioloop.call_later(seconds + 120, conn.ioloop.stop)   # a bound, whatever happens
    conn.ioloop.start()
    return {"n": state["confirmed"], "secs": state["elapsed"] or seconds}


def scale_producer(port: int, queue: str, seconds: float, ready) -> dict:
    """One of W6's client processes: W2's publishing, into a queue of its own, through its leader's node."""
    return publish_window(connection_params(port), queue, seconds, None, W2_WINDOW, ready=ready)


def connection_params(port: int) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(host="127.0.0.1", port=port, heartbeat=30,
                                     blocked_connection_timeout=30, socket_timeout=5)


class RabbitMQ:
    name = "rabbitmq"
    fails_over = True
    scales = True
    w6_only = False
    durability = "confirmed after a majority fsynced it (quorum queue, persistent messages)"

    def __init__(self, root: Path):
        self.root = root / "rabbitmq"
        self.nodes = [1, 2, 3]
        amqp = free_ports(7)
        self.amqp = dict(zip(self.nodes, amqp[:3]))
        self.dist = dict(zip(self.nodes, amqp[3:6]))
        self.epmd_port = amqp[6]
        self.procs: dict[int, subprocess.Popen] = {}
        self._rounds = 0
        self.version = "(not started)"
        self.epmd: subprocess.Popen | None = None

    @property
    def label(self) -> str:
        return f"RabbitMQ {self.version} quorum queue (3 nodes)"

    # ---- life cycle ----------------------------------------------------------------------------
    def _env(self, n: int) -> dict:
        base = self.root
        return {**os.environ,
                "HOME": str(base / "home"),
                "RABBITMQ_CONF_ENV_FILE": str(base / "empty-env.conf"),
                "RABBITMQ_NODENAME": f"rabbit{n}@localhost",
                "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                "RABBITMQ_NODE_PORT": str(self.amqp[n]),
                "RABBITMQ_DIST_PORT": str(self.dist[n]),
                "RABBITMQ_CONFIG_FILE": str(base / f"rabbit{n}.conf"),
                "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
                "RABBITMQ_LOG_BASE": str(base / f"log{n}"),
                "RABBITMQ_PID_FILE": str(base / f"rabbit{n}.erlpid"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
                "RABBITMQ_ENABLED_PLUGINS": "",
                "ERL_EPMD_ADDRESS": "127.0.0.1",
                "ERL_EPMD_PORT": str(self.epmd_port),
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS":
                    "+sbwt none +sbwtdcpu none +sbwtdio none -kernel inet_dist_use_interface {127,0,0,1}",
                "RABBITMQ_CTL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}"}

    def _ctl(self, n: int, *args: str, tool: str = "rabbitmqctl", timeout: float = 60) -> str:
        done = subprocess.run([str(BIN / tool), *args], env=self._env(n), capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} on rabbit{n}: {done.stderr.strip()[-500:]}")
        return done.stdout

    def _start_node(self, n: int) -> None:
        with open(self.root / f"rabbit{n}.out", "ab") as out:
            self.procs[n] = subprocess.Popen([str(BIN / "rabbitmq-server")], env=self._env(n), stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True,
                                             cwd=self.root)   # where a crash dump lands
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if subprocess.run([str(BIN / "rabbitmq-diagnostics"), "-q", "check_running"], env=self._env(n),
                              capture_output=True, timeout=60).returncode == 0:
                return
            if self.procs[n].poll() is not None:
                break
            time.sleep(0.5)
        raise RuntimeError(f"rabbit{n} did not come up; see {self.root / f'rabbit{n}.out'}")

    def start(self) -> None:
        (self.root / "home").mkdir(parents=True, exist_ok=True)   # the Erlang cookie lives here
        # Our own epmd on the private port: a node would otherwise start one as a daemon that
        # outlives it (and `epmd -kill` refuses while a dead node is still registered).
        self.epmd = subprocess.Popen(["epmd", "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while not self._epmd_listening():
            if self.epmd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"epmd did not listen on 127.0.0.1:{self.epmd_port}")
            time.sleep(0.05)
        (self.root / "empty-env.conf").write_text("")
        (self.root / "enabled_plugins").write_text("[].\n")
        for n in self.nodes:
            (self.root / f"rabbit{n}.conf").write_text(NODE_CONFIG.format(amqp=self.amqp[n]))
        for n in self.nodes:
            self._start_node(n)
        for n in self.nodes[1:]:
            for step in (("stop_app",), ("reset",), ("join_cluster", "rabbit1@localhost"), ("start_app",)):
                self._ctl(n, *step)
        self.version = self._ctl(1, "-q", "server_version", tool="rabbitmq-diagnostics").strip()

    def stop(self) -> None:
        for n in self.nodes:
            try:
                self._ctl(n, "stop", timeout=60)
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
        for n, proc in self.procs.items():
            beam = self._beam_pid(n)
            for pid in (beam, proc.pid):
                if pid is not None:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            self._reap(n)
        if self.epmd is not None:
            self.epmd.kill()
            self.epmd.wait()

    def _epmd_listening(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.epmd_port), timeout=1).close()
            return True
        except OSError:
            return False

    def _reap(self, n: int) -> None:
        """Wait for a node whose beam was killed; its start script goes with it, or is killed."""
        proc = self.procs[n]
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _beam_pid(self, n: int) -> int | None:
        try:
            return int((self.root / f"rabbit{n}.erlpid").read_text().strip())
        except (OSError, ValueError):
            return None

    def server_pids(self) -> list[int]:
        return [p for p in (self._beam_pid(n) for n in self.nodes) if p is not None]

    # ---- clients ---------------------------------------------------------------------------------
    def _params(self, n: int = 1) -> pika.ConnectionParameters:
        return connection_params(self.amqp[n])

    def _queue(self, what: str, via: int = 1) -> str:
        self._rounds += 1
        name = f"bench-{what}-{self._rounds}"
        conn = pika.BlockingConnection(self._params(via))
        conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
        conn.close()
        return name

    def _leader(self, queue: str, via: int) -> int | None:
        return self._leaders(via).get(queue)

    def _leaders(self, via: int) -> dict[str, int]:
        """Every quorum queue's leader node, by one question to node `via`."""
        leaders = {}
        for line in self._ctl(via, "list_queues", "-q", "name", "leader").splitlines():
            found = re.fullmatch(r"(\S+)\s+rabbit(\d+)@\S+", line.strip())   # not the header, "name leader"
            if found:
                leaders[found.group(1)] = int(found.group(2))
        return leaders

    # ---- workloads ---------------------------------------------------------------------------------
    def w1(self, seconds: float) -> dict:
        queue = self._queue("w1")
        conn = pika.BlockingConnection(self._params(self._leader(queue, 1)))
        channel = conn.channel()
        channel.confirm_delivery()
        channel.basic_publish("", queue, PAYLOAD, PERSISTENT)
        latencies = []
        started = time.perf_counter()
        stop_at = started + seconds
        while time.perf_counter() < stop_at:
            sent = time.perf_counter()
            channel.basic_publish("", queue, PAYLOAD, PERSISTENT)   # returns once confirmed
            latencies.append((time.perf_counter() - sent) * 1000)
        elapsed = time.perf_counter() - started
        conn.close()
        return {"n": len(latencies), "secs": elapsed, "latencies_ms": latencies}

    def _publish_window(self, queue: str, seconds: float, count: int | None, window: int,
                        pacer: Pacer | None = None, stamp: bool = False) -> dict:
        return publish_window(self._params(self._leader(queue, 1)), queue, seconds, count, window, pacer, stamp)

    def w2(self, seconds: float) -> dict:
        return self._publish_window(self._queue("w2"), seconds, None, W2_WINDOW)

    def fill(self, count: int) -> str:
        queue = self._queue("backlog")
        self._publish_window(queue, 600, count, W2_WINDOW)
        return queue

    def _consume(self, queue: str, count: int | None, until: float, on_message=None,
                 params: pika.ConnectionParameters | None = None) -> int:
        conn = pika.BlockingConnection(params or self._params(self._leader(queue, 1)))
        channel = conn.channel()
        channel.basic_qos(prefetch_count=W3_PREFETCH)
        received, unacked_tag = 0, None
        for method, _, body in channel.consume(queue, auto_ack=False, inactivity_timeout=0.2):
            if method is None:
                if (count is not None and received >= count) or time.perf_counter() > until:
                    break
                continue
            received += 1
            if on_message is not None:
                on_message(body)
            unacked_tag = method.delivery_tag
            if received % W3_ACK_EVERY == 0:
                channel.basic_ack(unacked_tag, multiple=True)
                unacked_tag = None
            if count is not None and received >= count:
                break
        if unacked_tag is not None:
            channel.basic_ack(unacked_tag, multiple=True)
        channel.cancel()
        conn.close()
        return received

    def w3(self, queue: str, count: int) -> dict:
        """Consume and ack a backlog: prefetch 1 000, one ack (multiple) per 100 — RabbitMQ's best mode."""
        started = time.perf_counter()
        received = self._consume(queue, count, started + 300)
        return {"n": received, "secs": time.perf_counter() - started}

    def w4(self, rounds: int) -> dict:
        took, lost = [], 0
        for r in range(rounds):
            via = 1 + r % 3
            queue = self._queue("w4", via)
            time.sleep(1)
            victim = self._leader(queue, via)
            client_node = next(n for n in self.nodes if n != victim)
            conn = pika.BlockingConnection(self._params(client_node))
            channel = conn.channel()
            channel.confirm_delivery()
            confirmed = 0
            warm_until = time.perf_counter() + 1.0
            while time.perf_counter() < warm_until:
                channel.basic_publish("", queue, PAYLOAD, PERSISTENT)
                confirmed += 1
            os.kill(self._beam_pid(victim), signal.SIGKILL)
            killed_at = time.perf_counter()
            while time.perf_counter() - killed_at < 60:
                try:
                    channel.basic_publish("", queue, PAYLOAD, PERSISTENT)
                    confirmed += 1
                    break
                except pika.exceptions.AMQPError:
                    try:
                        conn = pika.BlockingConnection(self._params(client_node))
                        channel = conn.channel()
                        channel.confirm_delivery()
                    except pika.exceptions.AMQPError:
                        time.sleep(0.01)
            took.append(time.perf_counter() - killed_at)
            conn.close()
            self._reap(victim)
            self._start_node(victim)
            time.sleep(2)
            check = pika.BlockingConnection(self._params(client_node))
            stored = check.channel().queue_declare(queue, durable=True, passive=True).method.message_count
            check.close()
            lost += max(0, confirmed - stored)
        return {"rounds_s": took, "lost": lost}

    def w5(self, rate: float, seconds: float) -> dict:
        queue = self._queue("w5")
        # Asked once, before the clock: rabbitmqctl takes seconds on a busy machine, and a
        # consumer that asked it itself could start after its deadline and take nothing.
        leader = self._params(self._leader(queue, 1))
        e2e: list[float] = []
        consumer = threading.Thread(target=self._consume, args=(
            queue, None, time.perf_counter() + seconds + 1,
            lambda body: e2e.append((time.perf_counter() - float(body)) * 1000), leader))
        consumer.start()
        sent = publish_window(leader, queue, seconds, None, W2_WINDOW, pacer=Pacer(rate), stamp=True)["n"]
        consumer.join()
        return {"n": len(e2e), "sent": sent, "e2e_ms": e2e}

    # ---- W6: one queue per client process -----------------------------------------------------------
    def raft_groups(self, queues: int) -> int:
        """Each quorum queue is a Raft group of its own."""
        return queues

    def w6_jobs(self, k: int) -> list[tuple]:
        """Queues declared through each node in turn: RabbitMQ puts a new queue's leader on the
        node it was declared through, so the leaders spread as an operator would spread them."""
        queues = [self._queue("w6", via=self.nodes[i % len(self.nodes)]) for i in range(k)]
        leaders = self._leaders(1)
        return [(scale_producer, (self.amqp[leaders[queue]], queue)) for queue in queues]
