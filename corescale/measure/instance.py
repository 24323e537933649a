"""One pinned worker process seen from its parent, for every parent: the measurement's launcher (and its LoadGen
server scenario) and `corescale serve`'s pool.

`InstanceHandle` spawns the worker (`python -m corescale.measure.worker JOB` through `instance_env.spawn`, or a
process forked from a fork server), reads its messages (measure/protocol.py), tells it commands, follows its
state and stops its whole process group. `Handshake` is the loaded -> warmup -> ready -> start barrier over a
group of instances. `dispatch` is the one loop that feeds an instance batches from a `Batcher`. What to do when an
instance fails is the parent's: the launcher fails the run, the pool starts it again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from corescale.machine import instance_env
from corescale.measure import protocol

if TYPE_CHECKING:
    from corescale.measure.batching import Batcher, Waiting
    from corescale.measure.forkserver import AdoptedProcess

STDERR_TAIL_LINES = 12
WORKER = "corescale.measure.worker"


@dataclass
class InstanceHandle:
    """A worker process, its pipes and what its messages said so far."""

    id: int
    process: subprocess.Popen | AdoptedProcess
    stderr_path: Path
    buffer: bytes = b""
    state: str = "starting"  # starting -> loaded -> warming -> ready -> running -> done
    call_ns: int = 0  # a warm call's duration, from its ready event
    single_ns: int | None = None  # serving: one warm query at sequence_length, from its ready event
    real_calls: list | None = None  # serving LoadGen: [rows, ns] of warm calls of real queries, from its ready event
    quality: dict | None = None  # instance 0 of a served trial: its quality check before serving (checked event)
    done: int = 0  # timed calls completed, from progress events
    artifact: str | None = None  # the file its backend runs (its loaded event), where it has one
    result: dict[str, Any] | None = None  # its report (its result event)
    failure: protocol.WorkerFailure | None = None  # its error event

    @classmethod
    def spawn(cls, number: int, launch: instance_env.Launch, job: Path, stderr_path: Path,
              append: bool = False) -> InstanceHandle:
        """The worker started pinned (`append`: its stderr log is kept from an earlier start)."""
        with open(stderr_path, "ab" if append else "wb") as stderr:
            process = instance_env.spawn(launch, WORKER, str(job), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=stderr)
        return cls(number, process, stderr_path)

    @property
    def stdin(self) -> IO[bytes]:
        assert self.process.stdin is not None, "workers start with their stdin piped"
        return self.process.stdin

    @property
    def stdout(self) -> IO[bytes]:
        assert self.process.stdout is not None, "workers start with their stdout piped"
        return self.process.stdout

    def tell(self, command: protocol.Command) -> bool:
        """One command; False when the worker is gone."""
        try:
            self.stdin.write(protocol.say(command).encode())
            self.stdin.flush()
            return True
        except (BrokenPipeError, ValueError, OSError):
            return False

    def lines(self, chunk: bytes) -> list[bytes]:
        """The whole lines of what was read so far (a non-blocking reader's chunk added)."""
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return [line for line in lines if line.strip()]

    def messages(self) -> Iterator[protocol.Message | protocol.ProtocolError]:
        """Its messages until its end of output, read blocking (a reader thread's); a malformed line as its
        ProtocolError. Ends too when its output was closed (stop_all)."""
        try:
            for line in self.stdout:
                try:
                    yield protocol.decode(line)
                except protocol.ProtocolError as bad:
                    yield bad
        except ValueError:  # read from a closed file
            return

    def heard(self, message: protocol.Message) -> None:
        """The state its message tells."""
        if isinstance(message, protocol.Loaded):
            self.state, self.artifact = "loaded", message.artifact
        elif isinstance(message, protocol.Ready):
            self.state, self.call_ns, self.single_ns = "ready", message.call_ns, message.single_ns
            self.real_calls = message.real_calls
        elif isinstance(message, protocol.Checked):
            self.quality = message.quality
        elif isinstance(message, protocol.Progress):
            self.done = message.done
        elif isinstance(message, protocol.Result):
            self.state, self.result = "done", message.report
        elif isinstance(message, protocol.WorkerFailure):
            self.failure = message

    def stderr_tail(self) -> str:
        try:
            lines = self.stderr_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-STDERR_TAIL_LINES:])

    def loader_errors(self) -> list[str]:
        """The dynamic loader's complaints (e.g. an LD_PRELOAD it ignored)."""
        return [line.strip() for line in self.stderr_tail().splitlines() if "ld.so:" in line]

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def how_it_ended(code: int) -> tuple[str, str | None]:
    """`killed by SIGNAME` or `exited with code N`, and the signal's name (None: it exited)."""
    name = signal.Signals(-code).name if code < 0 else None
    return (f"killed by {name}" if name else f"exited with code {code}"), name


def stop_all(handles: Iterable[InstanceHandle], grace_s: float, terminate: bool = True) -> None:
    """SIGTERM the process groups (`terminate`; else they were told to stop), wait at most `grace_s`, then
    SIGKILL what is left, whatever each spawned too: no orphans."""
    handles = list(handles)
    for handle in handles:
        if terminate and handle.process.poll() is None:
            handle.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for handle in handles:
        try:
            handle.process.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            pass
    for handle in handles:
        handle.signal_group(signal.SIGKILL)
        handle.process.wait()
        for stream in (handle.process.stdin, handle.process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass


class Handshake:
    """Warm-up starts once every instance of the group is loaded (so it runs under the load the window will see);
    the start once every one is ready, at one instant on one monotonic clock, far enough ahead (`delay_ns` plus
    two of the slowest warm calls) for each to finish the warm call it is in."""

    def __init__(self, handles: Iterable[InstanceHandle], delay_ns: int = 0):
        self.handles, self.delay_ns = list(handles), delay_ns

    def heard(self, message: protocol.Message) -> int | None:
        """After a handle heard `message`: the start instant when this message completed the barrier."""
        if isinstance(message, protocol.Loaded) and all(h.state == "loaded" for h in self.handles):
            self.tell_all(protocol.Warmup(), "warming")
        elif isinstance(message, protocol.Ready) and all(h.state == "ready" for h in self.handles):
            slowest = max(h.call_ns for h in self.handles)
            start_ns = time.perf_counter_ns() + self.delay_ns + 2 * slowest
            self.tell_all(protocol.Start(start_ns), "running")
            return start_ns
        return None

    def tell_all(self, command: protocol.Command, state: str) -> None:
        for handle in self.handles:
            handle.tell(command)  # one that died meanwhile is reported by its end of output
            handle.state = state


class Feeder(Protocol):
    """An instance fed by `dispatch`: LoadGen's (measure/loadgen.py) or an HTTP request's (serve/pool.py)."""

    def idle(self) -> bool:
        """Blocks until the instance may take a batch; False when no batch will come any more."""

    def send(self, batch: list[Waiting]) -> bool:
        """The batch told to the instance; False when it was not."""

    def reply(self) -> protocol.Served | None:
        """The instance's answer to the batch sent; None when it has none (it died, or the run was stopped)."""

    def unsent(self, batch: list[Waiting]) -> None:
        """A batch that could not be sent."""

    def complete(self, batch: list[Waiting], taken_ns: int, reply: protocol.Served | None) -> None:
        """A batch answered (`reply`), or failed (None)."""


def dispatch(batcher: Batcher, feeder: Feeder) -> None:
    """Whenever the instance is idle: the next batch, sent, its reply waited for, completed; until the batcher is
    closed and empty."""
    while feeder.idle():
        batch = batcher.take()
        if batch is None:
            return
        taken_ns = time.perf_counter_ns()
        if feeder.send(batch):
            feeder.complete(batch, taken_ns, feeder.reply())
        else:
            feeder.unsent(batch)
