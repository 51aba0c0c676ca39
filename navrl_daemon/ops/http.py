"""The daemon's HTTP endpoint: `GET /metrics` (Prometheus text) and `GET /healthz` (JSON).

It runs a stdlib `ThreadingHTTPServer` in its own daemon thread, so a slow or stuck
scraper never blocks the event loop: the loop only feeds `Metrics` and `Health`, both
safe to read from another thread. There is no authentication; bind to loopback unless a
firewall guards the port.
"""

from __future__ import annotations

import json
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


class MetricsServer:
    def __init__(self, metrics: Metrics, health: Health, address: str, port: int) -> None:
        self.metrics = metrics
        self.health = health
        self.address = address
        self.port = port  # the bound port once started (port 0 picks a free one)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and serve in a daemon thread; raises OSError naming address:port."""
        if self._server is not None:
            raise RuntimeError("metrics server already started")
        family = socket.AF_INET6 if ":" in self.address else socket.AF_INET
        try:
            server = _Server((self.address, self.port), _Handler, family)
        except OSError as err:
            raise OSError(
                err.errno,
                f"cannot serve metrics on {self.url_host}:{self.port}: {err.strerror or err} "
                "(set metrics.address / metrics.port, port 0 picks a free one)",
            ) from err
        server.metrics, server.health = self.metrics, self.health
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.1},  # how long stop() may wait for the loop to notice
            name="metrics-http",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and release the port; does nothing if not running."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self._server = self._thread = None
        server.shutdown()
        server.server_close()
        thread.join()

    @property
    def url_host(self) -> str:
        return f"[{self.address}]" if ":" in self.address else self.address


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    metrics: Metrics
    health: Health

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        family: socket.AddressFamily,
    ) -> None:
        self.address_family = family
        super().__init__(address, handler)

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hung up (a scrape or `status` that timed out) is not an error worth
        a traceback on stderr, where it would break the JSON log stream."""
        err = sys.exc_info()[1]
        if isinstance(err, BrokenPipeError | ConnectionResetError | TimeoutError):
            log.debug("metrics client went away", client=str(client_address), error=str(err))
            return
        log.warning("metrics request failed", client=str(client_address), error=repr(err))

    def server_bind(self) -> None:
        # HTTPServer.server_bind also resolves the host's FQDN, which can hang for seconds
        # without DNS; the name is only used in CGI environments.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/metrics":
            try:
                body = self.server.metrics.render()
            except Exception:
                log.exception("metrics collection failed")
                self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, b"collection failed\n", "text/plain")
                return
            self._reply(HTTPStatus.OK, body, CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            status, doc = self.server.health.check()
            self._reply(status, json.dumps(doc).encode() + b"\n", "application/json")
        else:
            self._reply(
                HTTPStatus.NOT_FOUND, b"not found: try /metrics or /healthz\n", "text/plain"
            )

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("request", client=self.client_address[0], line=format % args)
