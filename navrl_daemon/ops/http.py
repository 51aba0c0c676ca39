"""The daemon's HTTP endpoint: `GET /metrics` (Prometheus text) and `GET /healthz` (JSON).

One thread serves every connection with a selector, so whatever clients do, the endpoint
holds at most `max_connections` sockets and one thread: a scraper that connects and sends
nothing, raw bytes without a line end or a TLS hello, or a thousand idle connections cost
training no file descriptors and no threads. Each connection has `request_timeout_s` for
its request and reply together; beyond `max_connections` the oldest connection still
waiting for its request is closed to make room, so a scrape gets through while idle
connections come and go. Metrics and health can degrade; training cannot.

The event loop only feeds `Metrics` and `Health`, both safe to read from this thread.
There is no authentication; bind to loopback unless a firewall guards the port.
"""

from __future__ import annotations

import collections
import errno
import json
import selectors
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import structlog
from prometheus_client import CONTENT_TYPE_LATEST

from navrl_daemon.ops.metrics import STATES, Metrics

log = structlog.get_logger("http")


class Health:
    """What `/healthz` answers: 200 while running and an iteration completed within
    `stall_after_s` (counted from entering `running` until the first), 503 otherwise.

    Fed from the event loop, read from the HTTP thread. Times are `clock()` readings
    (monotonic seconds); the `now` arguments let tests pass their own."""

    def __init__(
        self, *, stall_after_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.stall_after_s = stall_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._state = "starting"
        self._last_iteration: float | None = None
        # When the last iteration completed, or when `running` began before the first.
        self._quiet_since = 0.0

    def set_state(self, state: str, now: float | None = None) -> None:
        """One of `metrics.STATES` (a `supervisor.State` will do)."""
        if state not in STATES:
            raise ValueError(f"unknown daemon state {state!r}; expected one of {STATES}")
        with self._lock:
            if state == "running" and self._state != "running" and self._last_iteration is None:
                self._quiet_since = self._now(now)
            self._state = str(state)

    def iteration_done(self, now: float | None = None) -> None:
        with self._lock:
            self._last_iteration = self._quiet_since = self._now(now)

    def check(self, now: float | None = None) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body)."""
        with self._lock:
            now = self._now(now)
            state, last, quiet_s = self._state, self._last_iteration, now - self._quiet_since
        age = None if last is None else round(now - last, 3)
        body: dict[str, Any] = {"state": state, "last_iteration_age_s": age}
        if state != "running":
            return 503, {"status": "unavailable", "reason": f"daemon is {state}", **body}
        if quiet_s > self.stall_after_s:
            reason = (
                f"no iteration completed for {quiet_s:.1f} s "
                f"(metrics.stall_after_s = {self.stall_after_s})"
            )
            return 503, {"status": "stalled", "reason": reason, **body}
        return 200, {"status": "ok", **body}

    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else now


# Connections held at once (each one file descriptor); Prometheus needs one per scrape.
MAX_CONNECTIONS = 16
# Seconds a client has for sending its request and reading the reply.
REQUEST_TIMEOUT_S = 5.0
# A request (line and headers) larger than this is refused: a GET needs a few hundred bytes.
MAX_REQUEST_BYTES = 8192
# Pending connections the kernel queues until the serving thread accepts them.
BACKLOG = 128
# After EMFILE/ENFILE on accept, seconds before accepting again (instead of spinning).
ACCEPT_PAUSE_S = 0.5
# At most one log line about dropped connections per this many seconds.
DROP_LOG_INTERVAL_S = 60.0


class MetricsServer:
    def __init__(
        self,
        metrics: Metrics,
        health: Health,
        address: str,
        port: int,
        *,
        max_connections: int = MAX_CONNECTIONS,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.metrics = metrics
        self.health = health
        self.address = address
        self.port = port  # the bound port once started (port 0 picks a free one)
        self.max_connections = max_connections
        self.request_timeout_s = request_timeout_s
        # Connections closed before a reply, by reason: timeout, evicted, refused, oversized,
        # failed (an error while answering, `last_error` the newest).
        self.dropped: collections.Counter[str] = collections.Counter()
        self.last_error = ""
        self._listener: socket.socket | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and serve in a daemon thread; raises OSError naming address:port."""
        if self._listener is not None:
            raise RuntimeError("metrics server already started")
        family = socket.AF_INET6 if ":" in self.address else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.address, self.port))
            listener.listen(BACKLOG)
        except OSError as err:
            listener.close()
            raise OSError(
                err.errno,
                f"cannot serve metrics on {self.url_host}:{self.port}: {err.strerror or err} "
                "(set metrics.address / metrics.port, port 0 picks a free one)",
            ) from err
        listener.setblocking(False)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._wake = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, name="metrics-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and release the port; does nothing if not running."""
        listener, wake, thread = self._listener, self._wake, self._thread
        if listener is None or wake is None or thread is None:
            return
        self._listener = self._wake = self._thread = None
        wake[1].send(b"x")
        thread.join()
        for sock in (listener, *wake):
            sock.close()

    @property
    def url_host(self) -> str:
        return f"[{self.address}]" if ":" in self.address else self.address

    def _serve(self) -> None:
        listener, wake = self._listener, self._wake
        assert listener is not None and wake is not None
        clients: dict[socket.socket, _Exchange] = {}
        paused_until = 0.0
        last_drop_log = time.monotonic()
        logged = collections.Counter(self.dropped)
        with selectors.DefaultSelector() as sel:
            sel.register(wake[0], selectors.EVENT_READ)
            sel.register(listener, selectors.EVENT_READ)
            try:
                while True:
                    now = time.monotonic()
                    deadlines = [c.deadline for c in clients.values()]
                    if paused_until:
                        deadlines.append(paused_until)
                    timeout = max(0.0, min(deadlines, default=now + 1.0) - now)
                    for key, events in sel.select(min(timeout, 1.0)):
                        if key.fileobj is wake[0]:
                            return
                        if key.fileobj is listener:
                            if not self._accept(listener, sel, clients):
                                sel.unregister(listener)
                                paused_until = time.monotonic() + ACCEPT_PAUSE_S
                        elif clients.get(key.fileobj) is key.data:
                            self._step(key.data, events, sel, clients)
                        # else: closed earlier in this batch (evicted by an accept)
                    now = time.monotonic()
                    if paused_until and now >= paused_until:
                        sel.register(listener, selectors.EVENT_READ)
                        paused_until = 0.0
                    for client in [c for c in clients.values() if c.deadline <= now]:
                        self._close(client, sel, clients, dropped="timeout")
                    if now - last_drop_log >= DROP_LOG_INTERVAL_S and self.dropped != logged:
                        failed = self.dropped["failed"] != logged["failed"]
                        log.warning(
                            "metrics connections closed before a reply",
                            since_s=round(now - last_drop_log),
                            **{k: v - logged[k] for k, v in self.dropped.items()},
                            **({"last_error": self.last_error} if failed else {}),
                        )
                        logged, last_drop_log = collections.Counter(self.dropped), now
            finally:
                for client in list(clients.values()):
                    self._close(client, sel, clients)

    def _accept(
        self,
        listener: socket.socket,
        sel: selectors.BaseSelector,
        clients: dict[socket.socket, _Exchange],
    ) -> bool:
        """Accept what is queued (at most a backlog's worth); False when out of fds."""
        for _ in range(BACKLOG):
            try:
                sock, peer = listener.accept()
            except BlockingIOError:
                return True
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.dropped["refused"] += 1
                    return False
                log.debug("metrics accept failed", error=str(err))
                return True
            if len(clients) >= self.max_connections:
                waiting = [c for c in clients.values() if c.reply is None]
                if not waiting:  # every slot is sending a reply: this one waits its turn
                    self.dropped["refused"] += 1
                    sock.close()
                    continue
                self._close(min(waiting, key=lambda c: c.deadline), sel, clients, "evicted")
            client = _Exchange(sock, str(peer[0]), time.monotonic() + self.request_timeout_s)
            try:
                sock.setblocking(False)
                sel.register(sock, selectors.EVENT_READ, client)
            except OSError as err:  # the kernel's epoll watches ran out, say
                log.debug("metrics connection not served", error=str(err))
                self.dropped["refused"] += 1
                sock.close()
                continue
            clients[sock] = client
        return True

    def _step(
        self,
        client: _Exchange,
        events: int,
        sel: selectors.BaseSelector,
        clients: dict[socket.socket, _Exchange],
    ) -> None:
        try:
            if client.reply is None and events & selectors.EVENT_READ:
                data = client.sock.recv(4096)
                if not data:  # the client hung up before asking
                    self._close(client, sel, clients)
                    return
                client.request += data
                head = _request_head(client.request)
                if head is None and len(client.request) <= MAX_REQUEST_BYTES:
                    return
                if head is None:
                    self.dropped["oversized"] += 1
                    client.reply = _response(431, b"request too large\n", "text/plain")
                else:
                    client.reply = self._answer(head, client.peer)
                sel.modify(client.sock, selectors.EVENT_WRITE, client)
            elif client.reply is not None and events & selectors.EVENT_WRITE:
                client.reply = client.reply[client.sock.send(client.reply) :]
                if not client.reply:
                    self._close(client, sel, clients)
        except OSError as err:  # reset, broken pipe: the client went away
            log.debug("metrics client went away", client=client.peer, error=str(err))
            self._close(client, sel, clients)
        except Exception as err:  # a bug must not end the endpoint for every later client
            # Counted and logged with the drops, once per interval: a client repeating the
            # request that meets it must not flood the journal with tracebacks.
            self.last_error = f"{type(err).__name__}: {err}"[:300]
            self._close(client, sel, clients, dropped="failed")

    def _answer(self, head: bytes, peer: str) -> bytes:
        parts = head.split(b"\r\n", 1)[0].split(b"\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return _response(400, b"bad request\n", "text/plain")
        method, target = parts[0], parts[1].decode("latin-1")
        if method not in (b"GET", b"HEAD"):
            return _response(405, b"only GET and HEAD\n", "text/plain", allow="GET, HEAD")
        try:
            path = urlsplit(target).path
        except ValueError:  # "//[": an unclosed IPv6 host
            return _response(400, b"bad request\n", "text/plain")
        status, body, content_type = self._route(path)
        log.debug("request", client=peer, line=f"{method.decode()} {target}", status=status)
        return _response(status, body, content_type, head_only=method == b"HEAD")

    def _route(self, path: str) -> tuple[int, bytes, str]:
        if path == "/metrics":
            try:
                return HTTPStatus.OK, self.metrics.render(), CONTENT_TYPE_LATEST
            except Exception:
                log.exception("metrics collection failed")
                return HTTPStatus.INTERNAL_SERVER_ERROR, b"collection failed\n", "text/plain"
        if path == "/healthz":
            status, doc = self.health.check()
            return status, json.dumps(doc).encode() + b"\n", "application/json"
        return HTTPStatus.NOT_FOUND, b"not found: try /metrics or /healthz\n", "text/plain"

    def _close(
        self,
        client: _Exchange,
        sel: selectors.BaseSelector,
        clients: dict[socket.socket, _Exchange],
        dropped: str | None = None,
    ) -> None:
        """Close a connection once: `clients` holds exactly the open, registered ones."""
        if clients.pop(client.sock, None) is None:
            return
        if dropped is not None:
            self.dropped[dropped] += 1
        sel.unregister(client.sock)
        client.sock.close()


class _Exchange:
    """One connection: the request bytes so far, then the reply bytes still to send."""

    __slots__ = ("deadline", "peer", "reply", "request", "sock")

    def __init__(self, sock: socket.socket, peer: str, deadline: float) -> None:
        self.sock = sock
        self.peer = peer
        self.deadline = deadline
        self.request = b""
        self.reply: bytes | None = None


def _request_head(data: bytes) -> bytes | None:
    """The request line and headers once complete (up to the blank line), else None."""
    for end in (b"\r\n\r\n", b"\n\n"):
        at = data.find(end)
        if at >= 0:
            return data[:at]
    return None


def _response(
    status: int, body: bytes, content_type: str, *, head_only: bool = False, allow: str = ""
) -> bytes:
    phrase = HTTPStatus(status).phrase
    lines = [
        f"HTTP/1.1 {status} {phrase}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *([f"Allow: {allow}"] if allow else []),
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body
