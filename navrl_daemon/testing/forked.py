"""Real `navrl-daemon` processes without paying the imports for each: forks of one
pre-imported interpreter per test worker (fork_server.py).

Each `start` is a process of its own (its own pid, signals, exit status, kill -9, file
descriptors and lock), running `cli.main` from argument parsing to the interpreter's
exit, as `python -m navrl_daemon` does once torch, tensordict and torchrl are imported
(~5 s of CPU per start, most of a short test's time). What only a fresh interpreter shows
(a signal during those imports, a torch that fails to import, torchrun's ranks) is tested
with `subprocess` instead; backends and their entry points are looked up at run time, in
the child, as in a fresh process. `run_script` runs a benchmarks/ script the same way, as
`python SCRIPT ARGS` would.

An `env` that changes what is read while importing (OMP_*, TORCH*, CUDA*, PYTHON*, ...)
gets a fresh interpreter too: `start` falls back to `subprocess.Popen`.
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from navrl_daemon.testing import CHECKOUT, SUBPROCESS_ENV

# Read while importing: a request that changes one of these runs in a fresh interpreter.
IMPORT_TIME_ENV = ("OMP_", "MKL_", "KMP_", "TORCH", "PYTORCH", "CUDA", "PYTHON", "LD_")

# The Popen arguments a fork takes, and `rlimits` ({resource.RLIMIT_*: (soft, hard)}, set
# in the child before `main`); any other (preexec_fn, ...) gets `subprocess.Popen`.
FORKABLE = {"stdout", "stderr", "text", "start_new_session", "rlimits", "script"}

_server: subprocess.Popen[str] | None = None
_path: str | None = None


def _server_path() -> str:
    global _server, _path
    if _server is not None and _server.poll() is None:
        assert _path is not None
        return _path
    _path = os.path.join(tempfile.mkdtemp(prefix="navrl-fork-"), "server.sock")
    _server = subprocess.Popen(
        [sys.executable, "-m", "navrl_daemon.testing.fork_server", _path],
        cwd=CHECKOUT,
        env=SUBPROCESS_ENV,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert _server.stdout is not None
    line = _server.stdout.readline()
    assert line == "ready\n", f"fork server did not start: {line!r}"
    atexit.register(_stop_server, _server, os.path.dirname(_path))
    return _path


def _stop_server(server: subprocess.Popen[str], folder: str) -> None:
    server.kill()
    server.wait()
    shutil.rmtree(folder, ignore_errors=True)


def _import_time_change(env: dict[str, str]) -> bool:
    """`env` (SUBPROCESS_ENV and more) sets a variable read while importing differently."""
    return any(k.startswith(IMPORT_TIME_ENV) and SUBPROCESS_ENV.get(k) != v for k, v in env.items())


class Forked:
    """The part of `subprocess.Popen` the tests use, for a forked `navrl-daemon ARGS`
    (stdin is /dev/null: no test writes to a daemon's)."""

    def __init__(
        self,
        args: list[str],
        *,
        stdout: Any = None,
        stderr: Any = None,
        text: bool = False,
        env: dict[str, str],
        cwd: Path | str,
        start_new_session: bool = False,
        rlimits: dict[int, tuple[int, int]] | None = None,
        script: str | None = None,
    ) -> None:
        self.args = args
        self.returncode: int | None = None
        self.stdout: IO[Any] | None = None
        self.stderr: IO[Any] | None = None
        fds, to_close = [], []
        stdin = os.open(os.devnull, os.O_RDONLY)
        fds.append(stdin)
        to_close.append(stdin)
        for name, spec, default in (("stdout", stdout, 1), ("stderr", stderr, 2)):
            if spec is subprocess.PIPE:
                r, w = os.pipe()
                setattr(self, name, open(r, "r" if text else "rb"))  # noqa: SIM115
                fds.append(w)
                to_close.append(w)
            elif spec is subprocess.DEVNULL:
                fd = os.open(os.devnull, os.O_WRONLY)
                fds.append(fd)
                to_close.append(fd)
            elif spec is subprocess.STDOUT:
                fds.append(fds[-1])
            elif spec is None:
                fds.append(default)
            else:
                fds.append(spec if isinstance(spec, int) else spec.fileno())
        request = {
            "args": args,
            "script": script,
            "env": env,
            "cwd": str(cwd),
            "new_session": start_new_session,
            "rlimits": rlimits or {},
        }
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._conn.connect(_server_path())
            socket.send_fds(self._conn, [json.dumps(request).encode()], fds)
            self.pid: int = json.loads(self._conn.recv(4096))["pid"]
        finally:
            for fd in to_close:
                os.close(fd)

    def poll(self) -> int | None:
        if self.returncode is None:
            self._conn.setblocking(False)
            try:
                self._read_status()
            except BlockingIOError:
                pass
            finally:
                if self.returncode is None:
                    self._conn.setblocking(True)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._conn.settimeout(timeout)
            try:
                self._read_status()
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
            finally:
                if self.returncode is None:
                    self._conn.settimeout(None)
        assert self.returncode is not None
        return self.returncode

    def _read_status(self) -> None:
        message = self._conn.recv(4096)
        assert message, f"fork server gone before pid {self.pid} ended"
        self.returncode = json.loads(message)["returncode"]
        self._conn.close()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any]:
        """Both pipes read to their end, each on a thread (neither may fill and block the
        child), then the exit status; TimeoutExpired after `timeout` seconds in all."""
        deadline = None if timeout is None else time.monotonic() + timeout
        got: dict[str, Any] = {}
        readers = [
            threading.Thread(target=lambda n=n: got.__setitem__(n, self._read(getattr(self, n))))
            for n in ("stdout", "stderr")
        ]
        for reader in readers:
            reader.daemon = True
            reader.start()
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if deadline is None else max(0.01, deadline - time.monotonic()))
        return got["stdout"], got["stderr"]

    @staticmethod
    def _read(pipe: IO[Any] | None) -> Any:
        if pipe is None:
            return None
        with pipe:
            return pipe.read()


Process = Forked | subprocess.Popen[Any]


def start(
    args: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None, **popen: Any
) -> Process:
    """`navrl-daemon ARGS` as its own process: forked, or with `subprocess` where a fresh
    interpreter is needed (see the module's docstring). `popen`: stdout, stderr, text,
    start_new_session, as `subprocess.Popen` takes them."""
    full_env = {**SUBPROCESS_ENV, **(env or {})}
    if _import_time_change(full_env) or set(popen) - FORKABLE:
        limits = popen.pop("rlimits", None) or {}
        if limits:
            popen["preexec_fn"] = lambda: [resource.setrlimit(k, v) for k, v in limits.items()]
        script = popen.pop("script", None)
        command = ["-m", "navrl_daemon"] if script is None else [script]
        return subprocess.Popen(
            [sys.executable, *command, *args], env=full_env, cwd=cwd or CHECKOUT, **popen
        )
    return Forked(args, env=full_env, cwd=cwd or CHECKOUT, **popen)


def run(
    args: list[str],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    **popen: Any,
) -> subprocess.CompletedProcess[str]:
    """`start`, then its output and exit code, as `subprocess.run(capture_output=True)`."""
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    proc = start(args, env=env, cwd=cwd, **pipes, **popen)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return subprocess.CompletedProcess(["navrl-daemon", *args], proc.returncode, out, err)


def run_script(script: str, args: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
    """`python SCRIPT ARGS` from the repository root (SCRIPT relative to it, e.g.
    "benchmarks/diagnose.py"), forked, as `run` runs the CLI."""
    return run(args, timeout=timeout, script=script)
