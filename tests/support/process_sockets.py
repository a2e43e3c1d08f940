"""Run processes and record the TCP sockets of their process trees while they run: the
addresses distributed engines (gloo, torchrun's store, TF's gRPC servers) really listen on."""
from __future__ import annotations

import subprocess
import tempfile
import time
from dataclasses import dataclass

import pytest

psutil = pytest.importorskip("psutil")

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
WILDCARD = {"0.0.0.0", "::"}


@dataclass(frozen=True)
class Socket:
    command: str        # the owning process's command line
    status: str         # psutil.CONN_LISTEN, CONN_ESTABLISHED, ...
    ip: str
    port: int
    remote_ip: str      # "" for a listener

    @property
    def listening(self) -> bool:
        return self.status == psutil.CONN_LISTEN


@dataclass
class Finished:
    returncode: int
    output: str


def run_watching_sockets(commands: list[list[str]], envs: list[dict[str, str]], cwd,
                         timeout: float) -> tuple[list[Finished], set[Socket]]:
    """Start every command, sample their trees' inet sockets every 0.2 s until all exit."""
    logs = [tempfile.TemporaryFile("w+") for _ in commands]
    procs = [subprocess.Popen(command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                              text=True) for command, env, log in zip(commands, envs, logs)]
    seen: set[Socket] = set()
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            assert time.monotonic() < deadline, f"still running after {timeout} s"
            for proc in procs:
                seen |= _sockets_of_tree(proc.pid)
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finished = []
    for proc, log in zip(procs, logs):
        log.seek(0)
        finished.append(Finished(proc.returncode, log.read()))
        log.close()
    return finished, seen


def _sockets_of_tree(pid: int) -> set[Socket]:
    found = set()
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return found
    for process in tree:
        try:
            command = " ".join(process.cmdline())
            for c in process.net_connections(kind="inet"):
                if c.laddr:
                    found.add(Socket(command, c.status, c.laddr.ip, c.laddr.port,
                                     c.raddr.ip if c.raddr else ""))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found
