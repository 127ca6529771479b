"""The MQTT transport: one broker connection per process, carrying any number of agents.

`Session` is the connection: it connects with exponential backoff, subscribes to what
its agents receive, announces itself on its retained status topic (and leaves a last will
saying it went offline), republishes that status as a heartbeat, and reconnects and
resubscribes whenever the broker goes away. Agents are the sans-I/O state machines of
the virtual mesh, unchanged: `Session.run` hands them decoded messages and publishes
what they return. Payloads are the binary codec's bytes; anything else is counted and
dropped.

Quality of service per message class:
- PARAMS and BATCH (the edge's broadcasts): QoS 1. Each starts a wave on every node, and
  there are only two per wave, so the acknowledgement costs nothing that matters.
- Everything inside a wave (halo, pool, gather, scatter, route, grad-halo, reduce): QoS 0.
  They are thousands per wave, and the wave is the unit of recovery: a lost message
  stalls the wave, the edge restarts it under a new step number (`EdgeMachine.tick`) and
  no gradient of the stalled wave is ever applied. QoS 1 would double the packets to
  recover from losses that happen only when a connection breaks.
- PUSH and WEIGHTS (between the edges and a parameter server): QoS 1. One of each per
  mesh and step; a step whose answer does not come is pushed again, and the server
  answers a push it has already applied with its weights again (training/ps_run.py).
- Status and alerts: QoS 1, retained, so that a late subscriber sees the last state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import ssl
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import aiomqtt

from meshdl.errors import MeshdlError, UsageError
from meshdl.protocol.auth import SealError
from meshdl.protocol.kinds import KINDS
from meshdl.protocol.messages import Message
from meshdl.protocol.topics import TopicNames, check_id, status_topic
from meshdl.protocol.wire import Wire

# The kinds sent at QoS 1, from the protocol's table of kinds; every other kind: 0 (see
# the module's docstring).
QOS = {row.kind: row.qos for row in KINDS if row.qos}
USER_ENV, PASSWORD_ENV = "MESHDL_MQTT_USER", "MESHDL_MQTT_PASSWORD"
STOP_POLL_S = 0.1  # how often a wait for the broker looks whether to stop
CLOSE_STEP_S = 0.5  # each of a closing session's goodbye and disconnect
DRAIN_AT_ONCE = 256  # received messages handled before their replies are published
MiB = 1024 * 1024
# aiomqtt warns whenever more than 10 publishes are pending, which `send` does on purpose,
# and paho logs the errors it also raises (which we report, once, our way).
_CLIENT_LOG = logging.getLogger("meshdl.mqtt.session.client")
_CLIENT_LOG.setLevel(logging.CRITICAL)
# A process still waiting for its broker says so (a daemon's only sign of life): on
# stderr through logging's last resort unless the application logs elsewhere.
_LOG = logging.getLogger("meshdl.mqtt.session")


@dataclass(frozen=True)
class BrokerAddress:
    """Where the broker is and how to log in: `mqtt://[user[:password]@]host[:port]`, or
    `mqtts://` for TLS (port 8883 by default, the system's CA store). A login missing
    from the URL comes from MESHDL_MQTT_USER / MESHDL_MQTT_PASSWORD."""

    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, url: str, env: dict[str, str] | None = None) -> BrokerAddress:
        env = os.environ if env is None else env
        parts = urlsplit(url if "://" in url else f"mqtt://{url}")
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
            raise UsageError(f"broker URL {url!r}: expected mqtt://host[:port] or mqtts://...")
        try:
            port = parts.port or (8883 if parts.scheme == "mqtts" else 1883)
        except ValueError:
            raise UsageError(f"broker URL {url!r}: bad port") from None
        username = unquote(parts.username) if parts.username else env.get(USER_ENV)
        password = unquote(parts.password) if parts.password else env.get(PASSWORD_ENV)
        return cls(parts.hostname, port, parts.scheme == "mqtts", username, password)

    def __str__(self) -> str:  # never shows the password
        login = f"{self.username}@" if self.username else ""
        return f"{'mqtts' if self.tls else 'mqtt'}://{login}{self.host}:{self.port}"

    def check_reachable(self, timeout_s: float = 5.0) -> None:
        """Fail at once, in one line, when nothing listens at the broker's address (a
        refused or unroutable connection, an unknown host): a one-shot command such as
        `meshdl train --transport mqtt` must not start a run that cannot work. Services
        (node hosts, `edge serve`) do not ask: they wait for a broker that comes later."""
        try:
            socket.create_connection((self.host, self.port), timeout=timeout_s).close()
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            hint = "; is it running? (`meshdl broker --port P` starts a local one)" \
                if isinstance(exc, ConnectionRefusedError) else ""
            raise MeshdlError(f"cannot reach the broker at {self}: {reason}{hint}") from None


# A client name is a topic level (`meshdl/<mesh>/status/<name>`) and part of the MQTT
# client id. MQTT allows ids of 65,535 bytes and Mosquitto 2.0 has no option to bound
# them, so the bound is on our side only: our clients refuse a longer name, while any
# other client with a login may still connect with a 60,000-byte id. The broker could
# bound it with `use_username_as_clientid` (the id becomes the login name, which `deploy
# credentials` chooses), at the cost of one connection per login: a second connection
# with the same login takes over the first. 128 bytes hold `host-<hostname>-<pid>` of a
# long cloud host name; the id adds ~45 to it.
MAX_CLIENT_NAME_BYTES = 128


def check_client_name(name: str) -> str:
    """`name` if it can name a client (the default login name, `meshdl nodes run
    --name`); UsageError saying why not: empty, a topic wildcard or separator, NUL, or
    over MAX_CLIENT_NAME_BYTES in UTF-8. `Session` calls it for every connection it
    makes, before anything is sent (the `nodes run` CLI checks its host names with the
    ACL's own rule, `acl.check_host_name`)."""
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_CLIENT_NAME_BYTES:
        raise UsageError(f"client name of {size} bytes: at most {MAX_CLIENT_NAME_BYTES} "
                         "(it is a topic level and part of the MQTT client id)")
    try:
        return check_id(name, "client name")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


@dataclass(frozen=True)
class Backoff:
    """Waits between connection attempts: first, doubling up to `most`. A wait that has
    failed for `say_after` seconds is reported (a warning), then every `say_every`."""

    first: float = 0.2
    most: float = 5.0
    say_after: float = 10.0
    say_every: float = 60.0

    def delays(self) -> Iterable[float]:
        delay = self.first
        while True:
            yield delay
            delay = min(delay * 2, self.most)


HEARTBEAT_S = 5.0  # a client's status record, republished: how others see it alive
OPERATION_TIMEOUT_S = 10.0  # the longest one acknowledgement is waited for


@dataclass(frozen=True)
class InboxLimits:
    """How much a connection keeps of what it has received but not yet handled.

    The inbox is the only place where a process's memory grows with what others send:
    while the process computes, the client keeps reading its socket into it. Past these
    bounds a message is dropped (counted as `rejected:inbox_full`); in a wave that is a
    lost QoS 0 message, which the edge recovers by restarting the wave. Each sender (a
    topic's mesh and publisher level, which the broker's ACL authenticates; a status
    topic's client) has its own share (`share_of`) of both, so that one login flooding
    large messages, or many small ones, fills only its own and the others' messages
    still get in.

    - `bytes`: 32 MiB holds a whole training wave of the 500-cell mesh the broker is
      sized for (31.6 MB, deploy/mosquitto/production.conf), though a process receives
      only its own share of it; under a flood it is most of what a process grows by.
    - `messages`: 20,000, the broker's own per-client queue (two waves of a floor host).
    - `sender_bytes`: 8 MiB, eight of the largest messages the broker passes; no cell
      sends one neighbour more than ~1 MB in a wave (its subtree's pooled features).
    - `sender_messages`: 1,000. No sender sends one receiver more than a few dozen
      messages a wave (a cell: halo and gradient-halo strips per layer, pool, gather,
      route, reduce; the edge: PARAMS and BATCH; an edge to the parameter server: its
      step's push), so this is tens of waves of any genuine one; and it is a
      twentieth of `messages`: one login sending small junk as fast as it can fills its
      own share, and the total needs twenty such senders at once.
    """

    messages: int = 20_000
    bytes: int = 32 * MiB
    sender_bytes: int = 8 * MiB
    sender_messages: int = 1_000


def share_of(topic: str) -> str:
    """The inbox share a topic's message counts against: its sender within its mesh
    (`meshdl/<m>/<src>`, `meshdl/<m>/status/<client>`). The mesh is part of it because
    a publisher level is a role, not a login: every mesh's edge pushes as `edge`, and the
    parameter server hears them all over one connection (with the role alone, junk from
    one mesh's edge login would fill the share of every mesh's pushes)."""
    levels = topic.split("/", 4)
    if len(levels) < 3:
        return topic
    return "/".join(levels[:4] if levels[2] == "status" else levels[:3])


class InboxBudget:
    """The accounting of a bounded inbox (sans-I/O): what is held, in total and per
    sender; `admit` says whether one more message fits and counts it in if so."""

    def __init__(self, limits: InboxLimits) -> None:
        self.limits = limits
        self.messages = 0
        self.bytes = 0
        self.by_sender: Counter[str] = Counter()  # bytes held per sender
        self.count_by_sender: Counter[str] = Counter()  # messages held per sender

    def admit(self, sender: str, size: int) -> bool:
        limits = self.limits
        if self.messages >= limits.messages or self.bytes + size > limits.bytes or \
                self.by_sender[sender] + size > limits.sender_bytes or \
                self.count_by_sender[sender] >= limits.sender_messages:
            return False
        self.messages += 1
        self.bytes += size
        self.by_sender[sender] += size
        self.count_by_sender[sender] += 1
        return True

    def release(self, sender: str, size: int) -> None:
        self.messages -= 1
        self.bytes -= size
        self.by_sender[sender] -= size
        self.count_by_sender[sender] -= 1
        if not self.count_by_sender[sender]:
            del self.count_by_sender[sender], self.by_sender[sender]


Handler = Callable[[str, Message], list[Message]]
# (client name, its JSON record, whether the broker replayed it from its retained store
# rather than the client publishing it now)
StatusHandler = Callable[[str, bytes, bool], None]


class Session:
    """One MQTT connection for the agents of this process."""

    def __init__(self, address: BrokerAddress, mesh: int, client: str,
                 subscriptions: list[str], status: dict[str, Any] | None = None,
                 heartbeat_s: float = HEARTBEAT_S, backoff: Backoff = Backoff(),
                 connect_timeout_s: float | None = 30.0,
                 on_status: StatusHandler | None = None, presence: bool = True,
                 wire: Wire | None = None,
                 status_extra: Callable[[], dict[str, Any]] | None = None,
                 stats: Counter[str] | None = None,
                 sign_status: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 inbox: InboxLimits = InboxLimits()) -> None:
        """`presence`: announce this client on its status topic (heartbeat, last will);
        off for observers such as `meshdl doctor`, which may not write there. `wire`:
        how messages become bytes and back (with the process's keys when the mesh
        authenticates); `status_extra`: what each heartbeat adds to the status (counts
        that change while the client runs); `stats`: where to count (a node host's own
        counter, so that one count holds what its cells and its connection saw);
        `sign_status`: adds the tag to each status record (meshdl/protocol/auth.py); `inbox`:
        how much of what arrived may wait to be handled."""
        self.address = address
        self.mesh = mesh
        self.client_name = check_client_name(client)
        self.subscriptions = subscriptions
        self.status = {**(status or {}), "mesh": mesh}
        self.on_status = on_status
        self.presence = presence
        self._status_prefix = status_topic(mesh, "x")[:-1]
        self.heartbeat_s = heartbeat_s
        self.backoff = backoff
        self.connect_timeout_s = connect_timeout_s
        self.stats: Counter[str] = Counter() if stats is None else stats
        self.wire = wire or Wire(mesh)
        self.status_extra = status_extra
        self.sign_status = sign_status or (lambda record: record)
        self._client: aiomqtt.Client | None = None
        self._stack: contextlib.AsyncExitStack | None = None  # leaves the client's context
        self._pending: asyncio.Future[aiomqtt.Message] | None = None  # a read under way
        self._pending_client: aiomqtt.Client | None = None
        self._topics = TopicNames(mesh)
        self._inbox: asyncio.Queue[aiomqtt.Message] | None = None  # the client's, see Inbox
        self._beating: asyncio.Future[None] | None = None  # the heartbeat's publish
        self.inbox_limits = inbox

    # ------------------------------------------------------------- connection
    def _new_client(self) -> aiomqtt.Client:
        offline = self._status_json("offline")
        session = self

        class Inbox(asyncio.Queue):  # type: ignore[type-arg]
            """aiomqtt's queue of received messages, made through its `queue_type`
            option, so that the session can take what has already arrived without a
            task per message (`anext(client.messages)` starts one each time); bounded
            by the session's `InboxLimits` (what does not fit is dropped, counted)."""

            def __init__(self, maxsize: int = 0) -> None:
                super().__init__(maxsize)
                self.budget = InboxBudget(session.inbox_limits)
                self.held: deque[tuple[str, int]] = deque()  # (sender, bytes), in order
                session._inbox = self

            def put_nowait(self, item: aiomqtt.Message) -> None:
                # aiomqtt calls this from paho's read callback: dropping here costs
                # nothing more than the read, and the socket keeps being drained.
                payload = item.payload
                size = len(payload) if isinstance(payload, bytes | bytearray) else 0
                sender = share_of(item.topic.value)
                if not self.budget.admit(sender, size):
                    session.stats["rejected:inbox_full"] += 1
                    return
                self.held.append((sender, size))
                super().put_nowait(item)

            def _get(self) -> aiomqtt.Message:  # every get and get_nowait comes here
                self.budget.release(*self.held.popleft())
                return super()._get()

        return aiomqtt.Client(
            self.address.host, self.address.port, username=self.address.username,
            password=self.address.password,
            # Unique per process: two clients with one id would keep taking over each
            # other's session (the status topic, not the id, names the client).
            identifier=f"meshdl-{self.mesh}-{self.client_name}-{os.getpid()}-{id(self):x}",
            will=aiomqtt.Will(status_topic(self.mesh, self.client_name), offline, 1, True)
            if self.presence else None,
            # MQTT 5: a broker that drops us says why (a packet too large, ...).
            protocol=aiomqtt.ProtocolVersion.V5, keepalive=15, timeout=self._operation_timeout,
            tls_context=ssl.create_default_context() if self.address.tls else None,
            max_queued_outgoing_messages=None, logger=_CLIENT_LOG, queue_type=Inbox)

    @property
    def _operation_timeout(self) -> float:
        """Seconds one operation (a connection's CONNACK, a subscription's or a QoS 1
        publish's acknowledgement, the heartbeat's) may take: 10, or the broker's
        patience when it is shorter, but at least 1 s. A broker that stops answering
        without closing the socket (frozen, a dead link) held `--broker-patience 2` for
        31 s, 10 s waits before the patience was looked at (now 16 s). The price: with a
        patience under 10 s, a live broker slower than it to acknowledge counts as away
        (a publish not acknowledged in time is dropped and counted, its wave restarted)."""
        patience = self.connect_timeout_s
        most = OPERATION_TIMEOUT_S
        return most if patience is None else min(most, max(1.0, patience))

    async def connect(self, stop: Callable[[], bool] | None = None) -> bool:
        """Connect, subscribe and announce, retrying with backoff for up to
        `connect_timeout_s` (None: until `stop()` holds). False if stopped first."""
        started = time.monotonic()
        deadline = None if self.connect_timeout_s is None else \
            started + self.connect_timeout_s
        last: Exception | None = None
        said_at: float | None = None  # when the wait was last reported
        for delay in self.backoff.delays():
            if stop is not None and stop():
                return False
            client, stack = self._new_client(), contextlib.AsyncExitStack()
            try:  # the client is an async context manager: the stack leaves it later
                if not await _unless_stopped(stack.enter_async_context(client), stop):
                    return False
            except aiomqtt.MqttCodeError as exc:
                if exc.rc in (4, 5, 134, 135):  # bad credentials, not authorized: final
                    raise MeshdlError(f"broker {self.address} refused {self.client_name}: "
                                      f"{exc}") from None
                last = exc
            except (aiomqtt.MqttError, OSError) as exc:
                last = exc
            else:
                try:  # the broker may go away again right now: then start over
                    await client.subscribe([(f, 1) for f in self.subscriptions])
                    self._client, self._stack = client, stack
                    await self.announce("online")
                except (aiomqtt.MqttError, OSError) as exc:
                    last, self._client, self._stack = exc, None, None
                    await _leave(stack)
                    settle_client(client)
                else:
                    self.stats["connections"] += 1
                    return True
            now = time.monotonic()
            if deadline is not None and now + delay > deadline:
                raise MeshdlError(f"cannot reach the broker at {self.address}: {last}")
            if now - started >= self.backoff.say_after and (
                    said_at is None or now - said_at >= self.backoff.say_every):
                said_at = now
                until = "until stopped" if deadline is None else \
                    f"for {deadline - now:.0f} s more"
                _LOG.warning("%s: still cannot reach the broker at %s after %.0f s (%s); "
                             "trying again %s", self.client_name, self.address,
                             now - started, last, until)
            self.stats["connect_retries"] += 1
            if not await _unless_stopped(asyncio.sleep(delay), stop):
                return False
        raise AssertionError("unreachable: the backoff never ends")

    def _drop_pending(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
        self._pending = self._pending_client = None

    async def close(self) -> None:
        """Say goodbye (status offline) and disconnect, in at most about a second: a
        stopped process must go even when its broker hangs (the will says goodbye)."""
        self._drop_pending()
        self._stop_beating()
        client, self._client = self._client, None
        stack, self._stack = self._stack, None
        if client is None or stack is None:
            return
        with contextlib.suppress(aiomqtt.MqttError, asyncio.TimeoutError):
            if self.presence:
                await client.publish(status_topic(self.mesh, self.client_name),
                                     self._status_json("offline"), 1,
                                     True, timeout=CLOSE_STEP_S)
        await _leave(stack)
        settle_client(client)

    async def __aenter__(self) -> Session:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _disconnected(self, cause: aiomqtt.MqttError | None = None) -> None:
        """The connection broke: forget it (the run loop connects again), and count why
        when the broker said (`refused:packet_too_large`: a message above its limit)."""
        self.stats["reconnects"] += 1
        reason = refusal(cause)
        if reason is not None:
            self.stats[f"refused:{reason}"] += 1
        self._drop_pending()
        self._stop_beating()
        settle_client(self._client)
        stack, self._client, self._stack = self._stack, None, None
        if stack is not None:
            await _leave(stack)

    # ---------------------------------------------------------------- traffic
    async def announce(self, state: str) -> None:
        """Publish this client's retained status (also the heartbeat)."""
        if not self.presence:
            return
        await self._client.publish(status_topic(self.mesh, self.client_name),
                                   self._status_json(state), 1, True)

    def beat(self) -> bool:
        """Publish this client's status (online) beside the loop, not in it: the
        heartbeat, and any announcement a loop's tick makes. Awaited in the loop, its
        acknowledgement held up the handling of everything received (the broker's PUBACK
        comes behind what it sent before: under a flood, seconds of it), and one not
        acknowledged within the operation timeout tore the connection down: a host
        flooded with small junk reconnected every 20 s and lost every wave. One still
        unacknowledged at the next is counted, not repeated (False: not published); a
        broken connection shows in the read (and paho's keepalive), which reconnects."""
        beating = self._beating
        if beating is not None and not beating.done():
            self.stats["heartbeats_unacknowledged"] += 1
            return False
        if beating is not None and not beating.cancelled() and \
                isinstance(beating.exception(), aiomqtt.MqttError):
            self.stats["heartbeats_failed"] += 1
        client = self._client
        if client is None or not self.presence:
            return False
        self._beating = asyncio.ensure_future(client.publish(
            status_topic(self.mesh, self.client_name), self._status_json("online"), 1,
            True))
        return True

    def _stop_beating(self) -> None:
        beating, self._beating = self._beating, None
        if beating is not None and not beating.done():
            beating.cancel()
        elif beating is not None and not beating.cancelled():
            beating.exception()  # taken: a failure is counted by `beat`, not printed

    def _status_json(self, state: str) -> str:
        """This client's status record now (signed, when the mesh authenticates)."""
        extra = self.status_extra() if self.status_extra is not None else {}
        record = {**self.status, **extra, "state": state, "time": time.time()}
        return json.dumps(self.sign_status(record))

    async def publish_record(self, name: str, record: dict[str, Any]) -> None:
        """A retained JSON record (QoS 1): alerts, anything a late subscriber must see."""
        client = self._client
        if client is None:
            raise MeshdlError(f"not connected to {self.address}")
        await client.publish(name, json.dumps(record), 1, True)

    async def send(self, messages: list[Message]) -> None:
        """Publish agents' messages; while the broker is away they are dropped (counted):
        the wave they belong to is restarted by the edge. All of them are handed to the
        client before any is awaited, so that one socket write carries them all (awaiting
        each publish in turn costs an event-loop cycle per message)."""
        client = self._client
        if client is None:
            self.stats["dropped_while_offline"] += len(messages)
            return
        publishing, name_of_topic = [], self._topics.of
        for message in messages:
            data = self._sealed(message)
            if data is not None:
                publishing.append(client.publish(name_of_topic(message.header), data,
                                                 QOS.get(message.header.kind, 0)))
        for outcome in await asyncio.gather(*publishing, return_exceptions=True):
            if outcome is None:
                self.stats["sent"] += 1
            elif isinstance(outcome, aiomqtt.MqttError):
                self.stats["dropped_while_offline"] += 1
            else:
                raise outcome

    def _sealed(self, message: Message) -> bytes | None:
        """The bytes of an agent's message, or None (counted as `unsendable:<reason>`,
        said once per reason) when this process cannot seal it: an agent asking for
        something its keys cannot do (a repair whose signature is gone, a link it holds
        no key for) loses that one message, never the process and all its cells."""
        try:
            return self.wire.seal(message)
        except MeshdlError as exc:
            reason = exc.reason if isinstance(exc, SealError) else "error"
            key = f"unsendable:{reason}"
            if not self.stats[key]:
                _LOG.warning("%s: dropped a %s it cannot seal (%s); further ones are "
                             "only counted, as %s", self.client_name,
                             message.header.kind.name, exc, key)
            self.stats[key] += 1
            return None

    async def run(self, handle: Handler, tick: Callable[[], Awaitable[None]] | None = None,
                  tick_s: float = 0.05, until: Callable[[], bool] | None = None) -> None:
        """Deliver received messages to `handle` and publish what it returns, until
        `until()` holds (or forever); reconnect whenever the connection breaks. `tick`
        runs at least every `tick_s` seconds (timeouts), the heartbeat every
        `heartbeat_s`."""
        next_beat = time.monotonic() + self.heartbeat_s
        while until is None or not until():
            client = self._client
            try:
                if client is None:
                    await self.connect(until)
                    continue
                if time.monotonic() >= next_beat:
                    self.beat()
                    next_beat = time.monotonic() + self.heartbeat_s
                incoming = await self._next_message(client, tick_s)
                if incoming is not None:
                    out = self._dispatch(incoming, handle)
                    # Take what has already arrived too (up to a bound, so that replies
                    # are not held back long), then publish all the replies at once.
                    for _ in range(DRAIN_AT_ONCE):
                        if until is not None and until():
                            break
                        queued = self._queued()
                        if queued is None:
                            break
                        out += self._dispatch(queued, handle)
                    await self.send(out)
                if tick is not None:
                    await tick()
            except aiomqtt.MqttError as exc:
                await self._disconnected(exc)

    async def _next_message(self, client: aiomqtt.Client,
                            timeout: float) -> aiomqtt.Message | None:
        """The next received message, or None after `timeout` seconds. The pending read
        outlives a timeout (cancelling it could lose a message it has just taken)."""
        if self._pending is None or self._pending_client is not client:
            self._pending = asyncio.ensure_future(anext(client.messages))
            self._pending_client = client
        done, _ = await asyncio.wait({self._pending}, timeout=timeout)
        if not done:
            return None
        pending, self._pending = self._pending, None
        return pending.result()  # raises MqttError if the connection broke

    def _queued(self) -> aiomqtt.Message | None:
        """A message the client has already received, without waiting (None if none)."""
        inbox = self._inbox
        return None if inbox is None or inbox.empty() else inbox.get_nowait()

    def _dispatch(self, incoming: aiomqtt.Message, handle: Handler) -> list[Message]:
        """Decode one received message and hand it to `handle`; returns the replies."""
        payload, name = incoming.payload, incoming.topic.value
        if name.startswith(self._status_prefix):
            if self.on_status is not None and isinstance(payload, bytes | bytearray):
                self.on_status(name[len(self._status_prefix):], bytes(payload),
                               bool(incoming.retain))
            return []
        if incoming.retain:  # a wave's messages are never retained: the broker would
            self.stats["rejected:retained"] += 1  # replay them at every resubscription
            return []
        if not isinstance(payload, bytes | bytearray):
            self.stats["rejected:not_binary"] += 1
            return []
        message = self.wire.receive(bytes(payload), self.stats)
        if message is None:
            return []
        self.stats["received"] += 1
        return handle(name, message)


# MQTT 5 reason codes with which a broker drops a client for what it sent.
REFUSALS = {0x95: "packet_too_large", 0x87: "not_authorized", 0x97: "quota_exceeded",
            0x90: "topic_name_invalid", 0x99: "payload_format_invalid"}


def refusal(error: BaseException | None) -> str | None:
    """Why the broker dropped this connection, if it said so: the reason code of the
    error or of its cause (aiomqtt raises "disconnected" from the broker's code)."""
    while error is not None:
        if isinstance(error, aiomqtt.MqttCodeError):
            code = getattr(error.rc, "value", error.rc)
            return REFUSALS.get(code) if isinstance(code, int) else None
        error = error.__cause__
    return None


def settle_client(client: aiomqtt.Client | None) -> None:
    """Take the error with which a client's connection broke. aiomqtt keeps it in a
    future that only a read under way looks at; when the break is noticed elsewhere (a
    publish, a heartbeat) nobody does, and asyncio prints "Future exception was never
    retrieved" with a traceback when the client is collected. The break itself is
    handled (counted, and the session connects again)."""
    broken = getattr(client, "_disconnected", None)  # aiomqtt's, private: no other way
    if isinstance(broken, asyncio.Future) and broken.done() and not broken.cancelled():
        broken.exception()


async def _leave(stack: contextlib.AsyncExitStack) -> None:
    """Disconnect (leave the client's context), in at most CLOSE_STEP_S: a broker that
    went away does not answer, and the connection is gone all the same."""
    with contextlib.suppress(aiomqtt.MqttError, OSError, asyncio.TimeoutError):
        await asyncio.wait_for(stack.aclose(), CLOSE_STEP_S)


def close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Close an event loop as `asyncio.run` does: cancel what still runs on it (such as
    the housekeeping task of a connection attempt that timed out) and wait for that, so
    that nothing is left to complain about a closed loop."""
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:  # (gather of nothing would make its future on another loop)
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


async def _unless_stopped(step: Awaitable[Any], stop: Callable[[], bool] | None) -> bool:
    """Await `step` unless `stop()` comes first (looked at every STOP_POLL_S): False
    then, and the step is cancelled. A process told to stop while it waits for its
    broker (a connection attempt, a pause between attempts) goes at once."""
    task = asyncio.ensure_future(step)
    while True:
        done, _ = await asyncio.wait({task}, timeout=STOP_POLL_S)
        if done:
            task.result()  # its exception, if it failed
            return True
        if stop is not None and stop():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            return False
