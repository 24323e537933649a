"""Fork servers: a loop of many trials starts each worker in milliseconds instead of seconds.

A fork server is a process started exactly like a worker (the instance's CPUs, memory binding, thread and
allocator environment, all set before the interpreter starts) that imports what the worker would (its own modules
and its backend's, measure/imports.py) once and then waits. Each worker of a later trial with the same launch is a
fork of it, so the guarantee "affinity and thread environment are set before any framework import" holds: the
imports ran under that very launch. It forks twice, so the worker is re-parented to this process (a child
subreaper) and is waited for, signalled and killed like any child; it has its own session, and dies with this
process.

Only what cannot differ between the worker's own start and a fork is shared: the key is the whole launch
(command prefix, environment, CPUs, backend) and the repeat. Repeats never share a server: their spread is the
measurement's uncertainty, and a fresh start randomises what forks of one server share (library addresses, the
interpreter's heap). A backend whose registry entry says it may not be forked (TensorFlow starts threads on import)
never forks from here; nor does a server whose imports left threads running that are not known to be fork-safe
(a fork copies a lock such a thread holds, never the thread: the worker could deadlock). Known fork-safe: OpenBLAS's
workers (its pthread_atfork handler stops them around a fork), counted from threadpoolctl's view of each OpenBLAS,
and jemalloc's background threads (by name; its fork handlers restart them).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from corescale.backends import entry
from corescale.machine import instance_env
from corescale.machine.scratch import scratch
from corescale.measure import imports

LIMIT = 4  # fork servers kept at once (least recently used goes); each holds its frameworks in memory
READY_TIMEOUT_S = 180.0
PR_SET_CHILD_SUBREAPER = 36


def server_modules(backend: str, model_type: str) -> list[str]:
    """What a worker of this backend imports before it loads it (the worker's own modules and its backend's)."""
    return ["corescale.measure.worker", *imports.JOB_MODULES, *imports.modules_for(backend, model_type)]


def become_subreaper(on: bool = True) -> bool:
    """Orphans of our descendants (the forked workers) are re-parented to this process, which can wait for them."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap_orphans(keep: set[int]) -> list[int]:
    """Waits for this process's children that have exited and that nobody waits for: orphans of killed workers
    (a compile worker pool, a helper a framework started) that the kernel re-parented to this subreaper. Only
    zombies are touched, never a pid in `keep` (children that a Popen still waits for). Returns the pids reaped."""
    from corescale.machine.topology import read_text

    me, reaped = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in keep:
            continue
        stat = read_text(f"/proc/{name}/stat") or ""
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[0] == "Z" and fields[1] == str(me):
            try:
                os.waitpid(int(name), os.WNOHANG)
                reaped.append(int(name))
            except ChildProcessError:
                pass
    return reaped


class AdoptedProcess:
    """A forked worker, re-parented to this process: the part of subprocess.Popen the launcher uses."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes], server_pid: int):
        self.pid, self.stdin, self.stdout, self.server_pid = pid, stdin, stdout, server_pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its exit status is gone
                self.returncode = -9
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        started = time.monotonic()
        while (code := self.poll()) is None:
            if timeout is not None and time.monotonic() - started >= timeout:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
            time.sleep(0.005)
        return code


@dataclass
class ForkServer:
    process: subprocess.Popen
    channel: socket.socket
    threads: int | None = None  # known once its imports are done (the "ready" line)
    unknown_threads: int = 0  # of those, how many are not known to be fork-safe

    def wait_ready(self) -> bool:
        """Its imports are done and forking it is safe (no thread running that a fork could break)."""
        if self.threads is None:
            self.channel.settimeout(READY_TIMEOUT_S)
            try:
                reply = _read_line(self.channel)
            except OSError:
                reply = ""
            self.channel.settimeout(None)
            words = reply.split()
            if len(words) != 3 or words[0] != "ready" or not all(w.isdigit() for w in words[1:]):
                return False
            self.threads, self.unknown_threads = int(words[1]), int(words[2])
        return self.unknown_threads == 0

    def fork(self, job_path: Path, stderr_path: Path) -> AdoptedProcess:
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            socket.send_fds(self.channel, [f"fork {job_path}\n".encode()], [stdin_r, stdout_w, stderr])
            reply = _read_line(self.channel)
        finally:
            for fd in (stdin_r, stdout_w, stderr):
                os.close(fd)
        if not reply.startswith("pid "):
            os.close(stdin_w)
            os.close(stdout_r)
            raise OSError(f"fork server {self.process.pid}: {reply or 'no reply'}")
        return AdoptedProcess(int(reply.split()[1]), os.fdopen(stdin_w, "wb"), os.fdopen(stdout_r, "rb"),
                              self.process.pid)

    def close(self) -> None:
        """It holds nothing to save: killed at once (its forked workers are not its children any more)."""
        with contextlib.suppress(OSError):
            self.channel.close()
        self.process.kill()
        self.process.wait()


class ForkServers:
    """The fork servers of one trial loop; close() (or the with-block's end) stops them all."""

    def __init__(self, work_dir: Path, limit: int = LIMIT):
        self.work_dir, self.limit = work_dir, limit
        self.servers: OrderedDict[tuple, ForkServer | None] = OrderedDict()  # None: this launch cannot fork
        self.enabled = become_subreaper()

    @classmethod
    @contextlib.contextmanager
    def temporary(cls):
        """Fork servers whose logs live in a temporary directory, all stopped at the end of the block."""
        with scratch("forkservers") as work, cls(work) as servers:
            yield servers

    def __enter__(self) -> ForkServers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def for_repeat(self, repeat: int) -> RepeatServers:
        """The servers of the next trial (every earlier trial's workers have been waited for)."""
        for key in [key for key in self.servers if key[0] < repeat]:  # earlier repeats are over
            server = self.servers.pop(key)
            if server is not None:
                server.close()
        self.reap()
        return RepeatServers(self, repeat)

    def reap(self) -> list[int]:
        """Orphans adopted since the last trial (reap_orphans), the servers' own pids left to their Popen."""
        if not self.enabled:
            return []
        return reap_orphans({server.process.pid for server in self.servers.values() if server is not None})

    def prepare(self, prefix: list[str], env: dict[str, str], cpus, backend: str, model_type: str,
                repeat: int = 0) -> tuple | None:
        """Starts the server for this launch unless there is one, without waiting for its imports (a trial's
        servers import side by side); returns its key, None when this launch never forks."""
        if not self.enabled or not entry(backend).forkable:
            return None
        key = (repeat, tuple(prefix), tuple(sorted(env.items())), tuple(sorted(cpus)), backend)
        if key not in self.servers:
            self._evict()
            self.servers[key] = self._start(prefix, env, cpus, server_modules(backend, model_type))
        self.servers.move_to_end(key)
        return key

    def spawn(self, prefix: list[str], env: dict[str, str], cpus, backend: str, model_type: str,
              job_path: Path, stderr_path: Path, repeat: int = 0) -> AdoptedProcess | None:
        """A worker forked from the server for this launch (started now if needed); None: start it fresh."""
        key = self.prepare(prefix, env, cpus, backend, model_type, repeat)
        server = None if key is None else self.servers.get(key)
        if key is None or server is None:
            return None
        try:
            if server.wait_ready():
                return server.fork(job_path, stderr_path)
        except OSError:
            pass
        server.close()
        self.servers[key] = None  # this launch starts fresh from now on
        return None

    def _evict(self) -> None:
        while len(self.servers) >= self.limit:
            _, server = self.servers.popitem(last=False)
            if server is not None:
                server.close()

    def _start(self, prefix: list[str], env: dict[str, str], cpus, modules: list[str]) -> ForkServer | None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        log = self.work_dir / f"forkserver-{len(self.servers)}-{time.monotonic_ns()}.log"
        try:
            with open(log, "wb") as stderr:
                process = instance_env.spawn(
                    instance_env.Launch(prefix, env, tuple(cpus)), "corescale.measure.forkserver",
                    str(theirs.fileno()), *modules, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr,
                    pass_fds=[theirs.fileno()])
        except OSError:
            ours.close()
            return None
        finally:
            theirs.close()
        return ForkServer(process, ours)

    def close(self) -> None:
        for server in self.servers.values():
            if server is not None:
                server.close()
        self.servers.clear()
        if self.enabled:
            self.reap()
            become_subreaper(False)


@dataclass
class RepeatServers:
    """The fork servers of one repeat (what a Launcher is handed)."""

    servers: ForkServers
    repeat: int

    def prepare(self, prefix: list[str], env: dict[str, str], cpus, backend: str, model_type: str) -> None:
        self.servers.prepare(prefix, env, cpus, backend, model_type, repeat=self.repeat)

    def spawn(self, prefix: list[str], env: dict[str, str], cpus, backend: str, model_type: str,
              job_path: Path, stderr_path: Path) -> AdoptedProcess | None:
        return self.servers.spawn(prefix, env, cpus, backend, model_type, job_path, stderr_path, repeat=self.repeat)


def _read_line(channel: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = channel.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


# --- the server process -------------------------------------------------------------------------------------


def serve(channel: socket.socket, supervisor: int) -> int:
    while True:
        message, fds, _, _ = socket.recv_fds(channel, 4096, 3)
        if not message:
            return 0  # the loop is over
        job_path = message.decode().split(maxsplit=1)[1].strip()
        try:
            pid = _fork_worker(channel, job_path, fds, supervisor)
            channel.sendall(f"pid {pid}\n".encode())
        except OSError as exc:
            channel.sendall(f"error {exc}\n".encode())
        finally:
            for fd in fds:
                os.close(fd)


def _fork_worker(channel: socket.socket, job_path: str, fds: list[int], supervisor: int) -> int:
    """Forks twice; the grandchild runs the worker once its parent is gone (re-parented to the supervisor)."""
    read_end, write_end = os.pipe()
    first = os.fork()
    if first == 0:
        try:
            second = os.fork()
            if second == 0:
                os.close(read_end)
                os.close(write_end)
                _run_worker(channel, job_path, fds, supervisor)
            os.write(write_end, str(second).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    pid = int(os.read(read_end, 64) or b"0")
    os.close(read_end)
    os.waitpid(first, 0)
    if pid <= 0:
        raise OSError("the worker could not be forked")
    return pid


def _run_worker(channel: socket.socket, job_path: str, fds: list[int], supervisor: int) -> None:
    code = 70
    try:
        channel.close()
        deadline = time.monotonic() + 5
        while os.getppid() != supervisor and time.monotonic() < deadline:
            time.sleep(0.001)  # until the middle process has exited and the supervisor adopted this one
        os.setsid()
        instance_env.die_with_parent()
        if os.getppid() != supervisor:
            os._exit(code)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own standard streams
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        from corescale.measure import worker

        code = worker.main([job_path])
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def main(argv: list[str]) -> int:
    channel = socket.socket(fileno=int(argv[0]))
    supervisor = os.getppid()
    imports.PREIMPORTED.update(imports.timed_imports(argv[1:]))  # the forked workers report them
    threads = len(os.listdir("/proc/self/task"))
    channel.sendall(f"ready {threads} {max(threads - 1 - fork_safe_threads(), 0)}\n".encode())
    return serve(channel, supervisor)


FORK_SAFE_THREAD_NAMES = ("jemalloc_bg_thd",)  # jemalloc's background threads: its atfork handlers restart them


def fork_safe_threads() -> int:
    """Threads of this process known to survive a fork: each OpenBLAS's workers (num_threads - 1, started when
    it loads; its atfork handler stops them before a fork) and those named in FORK_SAFE_THREAD_NAMES."""
    from threadpoolctl import threadpool_info

    named = 0
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            named += Path(f"/proc/self/task/{task}/comm").read_text().strip() in FORK_SAFE_THREAD_NAMES
    return named + sum(max(int(pool.get("num_threads") or 1) - 1, 0) for pool in threadpool_info()
                       if pool.get("internal_api") == "openblas")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
