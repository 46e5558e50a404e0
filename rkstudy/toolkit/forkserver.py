"""How a toolkit child is started (host): forked from a fork server that has imported the toolkit once, or
as a fresh interpreter of another toolkit version's environment.

Why a fork server: importing torch, onnx and rknn.api is most of a small build's time, and the studies
build hundreds of one-op probes. A build with another toolkit version's environment (or with
RKSTUDY_FORK_SERVER=0) starts a fresh interpreter instead. The child itself, whichever way it starts,
is rkstudy.toolkit._child; what it builds and reports is rkstudy.toolkit.build's.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

from ..errors import Failed
from .envs import Toolkit

# Set to 0 to start every toolkit child as a fresh interpreter instead of forking it from the fork server.
FORK_SERVER_ENV = "RKSTUDY_FORK_SERVER"


class _Exec:
    """A toolkit child started as a fresh interpreter (another toolkit version's environment, or with
    the fork server turned off): `python -m rkstudy.toolkit._child SPEC FD`."""

    def __init__(self, python: str, spec: str, conn_sock: socket.socket, workdir: str, env: dict):
        child_fd = conn_sock.detach()
        self._proc = subprocess.Popen([python, "-m", "rkstudy.toolkit._child", spec, str(child_fd)],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      pass_fds=(child_fd,), env=env, cwd=workdir, start_new_session=True)
        os.close(child_fd)
        self.pid = self._proc.pid
        self.stdout = self._proc.stdout

    def alive(self) -> bool:
        return self._proc.poll() is None

    def wait(self, timeout: float | None) -> int | None:
        """Its exit code (negative: the signal that ended it), or None when `timeout` passed first."""
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


class ForkServer:
    """One long-lived toolkit process per interpreter that has imported the toolkit (torch, onnx, rknn.api:
    about 2.5 s here) and forks a child per build on request (rkstudy.toolkit._child.fork_server). The
    server reaps its children and reports each exit status; a reader thread here hands them to whoever
    waits. Started on first use, in this process only (a forked copy of this process starts its own)."""

    _instances: dict[int, ForkServer] = {}
    _lock = threading.Lock()

    def __init__(self):
        # datagram-like: one request (its JSON and its two fds) per message, never split or merged
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd = theirs.detach()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self._server = subprocess.Popen([sys.executable, "-m", "rkstudy.toolkit._child", "--fork-server", str(fd)],
                                        stdin=subprocess.DEVNULL, pass_fds=(fd,), env=env, start_new_session=True)
        os.close(fd)
        self._sock = ours
        self._replies = ours.makefile("rb")
        self._cond = threading.Condition()
        self._pids: list[int] = []          # replies to requests, in order
        self._status: dict[int, int] = {}   # exit statuses reported, by pid
        self._closed = False
        threading.Thread(target=self._read, daemon=True).start()

    @classmethod
    def get(cls) -> ForkServer:
        with cls._lock:
            server = cls._instances.get(os.getpid())
            if server is None or server._closed:
                server = cls._instances[os.getpid()] = ForkServer()
            return server

    def _read(self) -> None:
        for line in self._replies:
            msg = json.loads(line)
            with self._cond:
                if "status" in msg:
                    self._status[msg["pid"]] = msg["status"]
                else:
                    self._pids.append(msg["pid"])
                self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def fork(self, spec: str, workdir: str, conn_fd: int, out_fd: int) -> int:
        """Start a child running `spec` in `workdir`; its pid."""
        with self._lock:
            request = {"spec": spec, "workdir": workdir, "env": {**os.environ, "PYTHONUNBUFFERED": "1"}}
            socket.send_fds(self._sock, [json.dumps(request).encode()], [conn_fd, out_fd])
            with self._cond:
                if not self._cond.wait_for(lambda: self._pids or self._closed, timeout=120) or not self._pids:
                    raise Failed("the toolkit fork server did not answer; set RKSTUDY_FORK_SERVER=0 to start each "
                                 "build in a fresh interpreter instead")
                return self._pids.pop(0)

    def wait(self, pid: int, timeout: float | None) -> int | None:
        """`pid`'s exit code once the server has reaped it, or None when `timeout` passed first."""
        with self._cond:
            self._cond.wait_for(lambda: pid in self._status or self._closed, timeout=timeout)
            return self._status.pop(pid, None)


class _Forked:
    """A toolkit child forked from the ForkServer: the same child as _Exec, without importing torch,
    onnx and the toolkit again."""

    def __init__(self, spec: str, conn_sock: socket.socket, workdir: str):
        out_parent, out_child = socket.socketpair()
        self._server = ForkServer.get()
        try:
            self.pid = self._server.fork(spec, workdir, conn_sock.fileno(), out_child.fileno())
        finally:
            conn_sock.close()
            out_child.close()
        self.stdout = out_parent.makefile("rb")
        out_parent.close()  # the file object keeps the socket open
        self._rc: int | None = None

    def alive(self) -> bool:
        return self.wait(0) is None

    def wait(self, timeout: float | None) -> int | None:
        if self._rc is None:
            self._rc = self._server.wait(self.pid, timeout)
        return self._rc


def start_child(toolkit: Toolkit, spec: str, conn_sock: socket.socket, workdir: str, env: dict):
    """A toolkit child running `spec`: forked from the fork server when it builds with this interpreter's
    toolkit (a one-op probe then takes a third of the time: the imports are the server's), else a fresh
    interpreter of the toolkit's own environment."""
    if toolkit.python == sys.executable and os.environ.get(FORK_SERVER_ENV, "1") != "0":
        return _Forked(spec, conn_sock, workdir)
    return _Exec(toolkit.python, spec, conn_sock, workdir, env)
