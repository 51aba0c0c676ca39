"""The HTTP endpoint: a real server on a free loopback port, fetched with urllib."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from navrl_daemon.ops.http import Health, MetricsServer
from navrl_daemon.ops.metrics import Metrics

# Straight to the loopback server, whatever http_proxy the environment sets.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Reply:
    status: int
    content_type: str
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


def get(server: MetricsServer, path: str) -> Reply:
    try:
        with OPENER.open(f"http://127.0.0.1:{server.port}{path}", timeout=5) as response:
            return Reply(response.status, response.headers["Content-Type"], response.read())
    except urllib.error.HTTPError as err:
        with err:
            return Reply(err.code, err.headers["Content-Type"], err.read())


def make_metrics() -> Metrics:
    return Metrics(version="0.1.0", torch_version="2.13.0", device="cpu")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def health(clock: Clock) -> Health:
    return Health(stall_after_s=30.0, clock=clock)


@pytest.fixture
def server(health: Health) -> Iterator[MetricsServer]:
    server = MetricsServer(make_metrics(), health, "127.0.0.1", 0)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_metrics_serves_the_registry_with_the_prometheus_content_type(
    server: MetricsServer,
) -> None:
    server.metrics.iteration(frames_delta=64, policy_version=1, policy_lag=0, losses={})
    reply = get(server, "/metrics?debug=1")  # a query string does not change the path
    assert reply.status == 200
    assert reply.content_type == CONTENT_TYPE_LATEST
    assert b"# TYPE navrl_daemon_state gauge\n" in reply.body
    samples = {
        s.name: s.value
        for f in text_string_to_metric_families(reply.body.decode())
        for s in f.samples
    }
    assert samples["navrl_frames_total"] == 64
    assert samples["navrl_iterations_total"] == 1


def test_healthz_follows_the_lifecycle_and_reports_a_stall(
    server: MetricsServer, health: Health, clock: Clock
) -> None:
    def healthz() -> tuple[int, dict]:
        reply = get(server, "/healthz")
        assert reply.content_type == "application/json"
        return reply.status, reply.json()

    status, body = healthz()
    assert (status, body["status"], body["state"]) == (503, "unavailable", "starting")

    health.set_state("running")
    clock.now += 29.0  # no iteration yet, but within stall_after_s of entering running
    assert healthz() == (200, {"status": "ok", "state": "running", "last_iteration_age_s": None})

    clock.now += 2.0
    status, body = healthz()
    assert (status, body["status"]) == (503, "stalled")
    assert "31.0 s" in body["reason"] and "stall_after_s = 30.0" in body["reason"]

    health.iteration_done()
    clock.now += 5.0
    assert healthz() == (200, {"status": "ok", "state": "running", "last_iteration_age_s": 5.0})

    clock.now += 30.5
    status, body = healthz()
    assert (status, body["status"], body["last_iteration_age_s"]) == (503, "stalled", 35.5)

    health.iteration_done()
    assert healthz()[0] == 200
    for state in ("draining", "stopped"):
        health.set_state(state)
        status, body = healthz()
        assert (status, body["state"], body["reason"]) == (503, state, f"daemon is {state}")


def test_health_measures_without_a_server() -> None:
    health = Health(stall_after_s=1.0)  # the real monotonic clock, times passed in
    health.set_state("running", now=10.0)
    assert health.check(now=10.9)[0] == 200
    assert health.check(now=11.1)[0] == 503
    health.iteration_done(now=11.5)
    assert health.check(now=12.0) == (
        200,
        {"status": "ok", "state": "running", "last_iteration_age_s": 0.5},
    )
    with pytest.raises(ValueError, match="paused"):
        health.set_state("paused")


def test_health_is_safe_to_read_while_the_loop_feeds_it() -> None:
    health = Health(stall_after_s=60.0)
    health.set_state("running")
    stop = threading.Event()

    def feed() -> None:
        while not stop.is_set():
            health.iteration_done()

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        assert all(health.check()[0] == 200 for _ in range(2000))
    finally:
        stop.set()
        feeder.join()


@pytest.mark.parametrize("path", ["/", "/metrics/", "/metricsx", "/healthz/x", "/favicon.ico"])
def test_other_paths_are_not_found(server: MetricsServer, path: str) -> None:
    assert get(server, path).status == 404


def test_stop_releases_the_port_and_is_idempotent(health: Health) -> None:
    first = MetricsServer(make_metrics(), health, "127.0.0.1", 0)
    first.stop()  # never started: nothing to do
    first.start()
    port = first.port
    assert port != 0
    assert get(first, "/metrics").status == 200
    first.stop()
    first.stop()
    with pytest.raises(urllib.error.URLError):
        OPENER.open(f"http://127.0.0.1:{port}/metrics", timeout=5)

    again = MetricsServer(make_metrics(), health, "127.0.0.1", port)
    again.start()
    try:
        assert again.port == port
        assert get(again, "/healthz").status == 503  # starting
    finally:
        again.stop()


def test_a_taken_port_fails_with_the_address_in_the_message(health: Health) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = MetricsServer(make_metrics(), health, "127.0.0.1", port)
        with pytest.raises(OSError, match=f"127.0.0.1:{port}"):
            server.start()
        server.stop()  # nothing was started: still fine


# A TLS ClientHello's first bytes: what a scraper configured for https sends.
TLS_HELLO = bytes.fromhex("160301020001000200fc03035d3b")


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """Whether the server closes `sock` within `within_s` (EOF or reset on our side)."""
    sock.settimeout(within_s)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_idle_and_garbage_connections_cost_one_thread_and_a_bounded_number_of_sockets(
    health: Health,
) -> None:
    server = MetricsServer(make_metrics(), health, "127.0.0.1", 0)  # 16 connections, 5 s
    threads = threading.active_count()
    server.start()
    held: list[socket.socket] = []
    try:
        assert threading.active_count() == threads + 1
        for _ in range(200):  # far more than the cap, held open and silent
            held.append(socket.create_connection(("127.0.0.1", server.port)))
        assert threading.active_count() == threads + 1
        # A scrape still gets through: the oldest silent connection makes room for it.
        assert get(server, "/metrics").status == 200
        assert get(server, "/healthz").status == 503  # still "starting"
        assert server.dropped["evicted"] >= 200 - 16

        tls = socket.create_connection(("127.0.0.1", server.port))
        no_line_end = socket.create_connection(("127.0.0.1", server.port))
        held += [tls, no_line_end]
        tls.sendall(TLS_HELLO)
        no_line_end.sendall(b"GET /metrics HTTP/1.1")
        # Neither ever completes a request; both are closed at request_timeout_s (5 s).
        assert closed_by_server(tls, within_s=15.0)
        assert closed_by_server(no_line_end, within_s=15.0)
        assert server.dropped["timeout"] >= 2
        assert threading.active_count() == threads + 1
    finally:
        for sock in held:
            sock.close()
        server.stop()
    assert threading.active_count() == threads


def test_a_request_larger_than_a_get_needs_is_refused(server: MetricsServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Junk: " + b"a" * 20_000)
        sock.settimeout(5)
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 431 ")
    assert server.dropped["oversized"] == 1


def test_head_has_no_body_and_other_methods_are_refused(server: MetricsServer) -> None:
    def exchange(request: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(request)
            sock.settimeout(5)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)

    head = exchange(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
    assert b"Content-Length: 0\r\n" not in head
    post = exchange(b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert post.startswith(b"HTTP/1.1 405 ") and b"Allow: GET, HEAD\r\n" in post
    assert exchange(b"nonsense\r\n\r\n").startswith(b"HTTP/1.1 400 ")


def exchange_once(server: MetricsServer, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(request)
        sock.settimeout(5)
        return sock.recv(4096)


def test_malformed_request_lines_get_400_and_no_log_line_each(server: MetricsServer) -> None:
    """A target urlsplit cannot parse (`//[`) logged a 715-byte traceback per request:
    200 requests, 201 error lines. It is a bad request like any other."""
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        for _ in range(200):
            assert exchange_once(server, b"GET //[ HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert [e for e in logs if e["log_level"] != "debug"] == []
    assert get(server, "/metrics").status == 200


def test_a_failing_request_is_logged_once_per_interval_without_a_traceback(
    health: Health, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever else fails while answering (a bug) closes that connection; the failures
    are counted and logged with the drops, once per interval, without a traceback."""
    from structlog.testing import capture_logs

    from navrl_daemon.ops import http

    monkeypatch.setattr(http, "DROP_LOG_INTERVAL_S", 0.5)
    server = MetricsServer(make_metrics(), health, "127.0.0.1", 0)

    def broken(head: bytes, peer: str) -> bytes:
        raise KeyError("a bug")

    monkeypatch.setattr(server, "_answer", broken)
    server.start()
    try:
        with capture_logs() as logs:
            for _ in range(50):
                assert exchange_once(server, b"GET /metrics HTTP/1.1\r\n\r\n") == b""
            deadline = time.monotonic() + 10
            while not any(e.get("failed") for e in logs) and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        server.stop()
    assert server.dropped["failed"] == 50
    lines = [e for e in logs if e["log_level"] != "debug"]
    assert 1 <= len(lines) <= 3, lines
    assert sum(e.get("failed", 0) for e in lines) == 50
    assert all("exc_info" not in e for e in lines)
    assert "KeyError: 'a bug'" in lines[0]["last_error"]
