"""The server side of forked.py: an interpreter with the daemon's modules imported that
forks one child per `navrl-daemon` a test starts.

Run by forked.py as `python -m navrl_daemon.testing.fork_server SOCKET`. Each request is one
SOCK_SEQPACKET message on a new connection: JSON {args, script, env, cwd, new_session,
rlimits} with the child's stdin, stdout and stderr as SCM_RIGHTS file descriptors. The
server forks; the child takes those descriptors, the environment and the working
directory, and runs `navrl_daemon.cli.main(args)` to the end of the interpreter, as
`python -m navrl_daemon` does after its imports (with a `script`: that file as
`__main__`, as `python SCRIPT ARGS` runs it). The server answers {"pid": N} at once and
{"returncode": N} when the child is reaped (-N: killed by signal N, as subprocess reports
it).

Single-threaded (a fork copies only the forking thread): nothing here runs torch or starts
a thread; the imports start none (checked at start).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import runpy
import select
import signal
import socket
import sys
import threading

REAP_EVERY_S = 0.02
FDS = 3  # stdin, stdout, stderr


def import_the_daemon() -> None:
    import navrl_daemon.pipeline.daemon  # noqa: F401 (torch, tensordict, torchrl with it)
    from navrl_daemon import cli

    cli.build_parser()  # every command's module


def child(request: dict, fds: list[int]) -> None:
    """Becomes the daemon: returns only by raising SystemExit out of the server's loop."""
    from navrl_daemon import cli

    if request["new_session"]:
        os.setsid()
    for limit, (soft, hard) in request["rlimits"].items():
        resource.setrlimit(int(limit), (soft, hard))
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    script = request["script"]
    if script is not None:  # `python SCRIPT ARGS`
        path = os.path.join(request["cwd"], script)
        sys.argv = [script, *request["args"]]
        sys.path[0] = os.path.dirname(path)  # what `python SCRIPT` puts there
        runpy.run_path(path, run_name="__main__")
        raise SystemExit(0)
    sys.argv = [cli.__file__, *request["args"]]
    sys.path[0] = request["cwd"]  # what `python -m` puts there
    raise SystemExit(cli.main(request["args"]))


def serve(path: str) -> None:
    parent = os.getppid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(path)
    server.listen(16)
    waiting: dict[int, socket.socket] = {}  # child pid -> the connection that started it
    print("ready", flush=True)
    while os.getppid() == parent:  # the test worker is gone: so is the server
        readable, _, _ = select.select([server], [], [], REAP_EVERY_S)
        if readable:
            conn, _ = server.accept()
            message, fds, _, _ = socket.recv_fds(conn, 1 << 16, FDS)
            pid = os.fork()
            if pid == 0:
                server.close()
                conn.close()
                for other in waiting.values():
                    other.close()
                child(json.loads(message), fds)
            for fd in fds:
                os.close(fd)
            conn.send(json.dumps({"pid": pid}).encode())
            waiting[pid] = conn
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = waiting.pop(pid)
            returncode = os.waitstatus_to_exitcode(status)
            with contextlib.suppress(OSError):  # the test stopped waiting for it
                conn.send(json.dumps({"returncode": returncode}).encode())
            conn.close()
    for pid in waiting:
        os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    import_the_daemon()
    assert threading.active_count() == 1 and len(os.listdir("/proc/self/task")) == 1
    serve(sys.argv[1])
