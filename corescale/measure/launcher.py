"""Starts one pinned worker process per instance, holds them at a barrier, starts them together, collects.

Any instance that crashes, is killed, reports an error or overruns the timeout fails the whole run: the
others are stopped and no process outlives the launcher. Each worker runs in its own session (process
group), so stopping it also stops anything it spawned.
"""

from __future__ import annotations

import dataclasses
import json
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable

from corescale.machine import instance_env
from corescale.machine.placement import InstanceSpec
from corescale.measure import protocol
from corescale.measure.forkserver import AdoptedProcess, RepeatServers
from corescale.record.trial import Failure

START_DELAY_NS = 100_000_000  # the common start instant is this far (plus two calls) after the last is ready
STDERR_TAIL_LINES = 12
STOP_GRACE_S = 3.0  # SIGTERM, then SIGKILL after this long

EventHandler = Callable[[int, dict], None]


@dataclass
class InstanceProcess:
    id: int
    process: subprocess.Popen | AdoptedProcess
    stderr_path: Path
    launch: dict  # command prefix and the variables set for it (recorded with the result)
    buffer: bytes = b""
    state: str = "starting"  # starting -> loaded -> warming -> ready -> running -> done
    call_ns: int = 0  # a warm call's duration, from its ready event
    done: int = 0  # timed calls completed, from progress events
    single_ns: int | None = None  # serving: one warm query at sequence_length, from its ready event
    result: dict | None = None

    @property
    def stdin(self) -> IO[bytes]:
        assert self.process.stdin is not None, "workers start with their stdin piped"
        return self.process.stdin

    @property
    def stdout(self) -> IO[bytes]:
        assert self.process.stdout is not None, "workers start with their stdout piped"
        return self.process.stdout

    def stderr_tail(self) -> str:
        try:
            lines = self.stderr_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-STDERR_TAIL_LINES:])

    def loader_errors(self) -> list[str]:
        """The dynamic loader's complaints (e.g. an LD_PRELOAD it ignored)."""
        return [line.strip() for line in self.stderr_tail().splitlines() if "ld.so:" in line]


@dataclass
class LaunchOutcome:
    results: dict[int, dict] = field(default_factory=dict)
    start_ns: int | None = None
    failure: Failure | None = None
    states: dict[str, dict] = field(default_factory=dict)  # per instance id: state and calls done when it ended
    interrupted: BaseException | None = None  # the interrupt to raise again once the record is written


class InstanceFailed(Exception):
    def __init__(self, failure: Failure):
        super().__init__(failure.reason)
        self.failure = failure


class Launcher:
    def __init__(self, work_dir: Path, timeout_s: float, on_event: EventHandler | None = None, server=None,
                 job: dict | None = None, forkservers: RepeatServers | None = None):
        self.work_dir = work_dir
        self.forkservers = forkservers
        self.timeout_s = timeout_s
        self.on_event = on_event or (lambda instance, event: None)
        self.instances: dict[int, InstanceProcess] = {}
        self.server = server  # measure/server.py's Server: serves LoadGen's queries once every instance is ready
        self.job = job or {}  # more for every worker's job file (the query set's path)
        self.deadline = 0.0

    def start(self, specs: list[InstanceSpec], cfg, model) -> None:
        preload = instance_env.preload_paths(cfg)  # a missing library is a UserError before anything starts
        job = {"config": cfg.to_dict(), "model": dataclasses.asdict(model),
               "trial_cpus": sorted(c for spec in specs for c in spec.cpus), **self.job}  # siblings: not foreign
        launches = [(spec, instance_env.Launch.of(cfg, spec, preload)) for spec in specs]
        servers = self.forkservers
        for _, launch in launches:
            if servers is not None:  # their servers import side by side
                servers.prepare(launch.prefix, launch.env, launch.cpus, cfg.backend.name, model.model_type)
        for spec, launch in launches:
            spec_path = self.work_dir / f"instance-{spec.id}.json"
            spec_path.write_text(json.dumps({**job, "instance": spec.to_json()}))
            stderr_path = self.work_dir / f"instance-{spec.id}.stderr.log"
            process: subprocess.Popen | AdoptedProcess | None = None
            if self.forkservers is not None:
                process = self.forkservers.spawn(launch.prefix, launch.env, launch.cpus, cfg.backend.name,
                                                 model.model_type, spec_path, stderr_path)
            recorded = {"command_prefix": launch.prefix, "env": instance_env.instance_variables(cfg, spec, preload),
                        "forked_from": getattr(process, "server_pid", None)}
            if process is None:
                with open(stderr_path, "wb") as stderr:
                    process = instance_env.spawn(launch, "corescale.measure.worker", str(spec_path),
                                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
            self.instances[spec.id] = InstanceProcess(spec.id, process, stderr_path, recorded)

    def run(self, specs: list[InstanceSpec], cfg, model) -> LaunchOutcome:
        outcome = LaunchOutcome()
        try:
            self.start(specs, cfg, model)
            self._supervise(outcome)
        except InstanceFailed as failed:
            outcome.failure = failed.failure
        except KeyboardInterrupt as stop:  # SIGINT, or SIGTERM/SIGHUP through the loop's handlers
            what = getattr(stop, "signal_name", "SIGINT")
            outcome.failure = Failure("interrupted", f"interrupted by {what}: every instance was stopped")
            outcome.interrupted = stop
        finally:
            if self.server is not None:
                self.server.abort()
            self.stop_all()
            outcome.results = {i: {**p.result, "launch": p.launch} for i, p in self.instances.items()
                               if p.result is not None}
            outcome.states = {str(i): {"state": p.state, "calls_done": p.done, "pid": p.process.pid}
                              for i, p in self.instances.items()}
            if self.server is not None:
                self.server.wait_ended()  # last: the instances are stopped whatever happens here
        return outcome

    def _supervise(self, outcome: LaunchOutcome) -> None:
        self.extend_deadline()
        selector = selectors.DefaultSelector()
        for inst in self.instances.values():
            os.set_blocking(inst.stdout.fileno(), False)
            selector.register(inst.stdout, selectors.EVENT_READ, inst)
        while any(inst.state != "done" for inst in self.instances.values()):
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self._timed_out()
            if self.server is not None and self.server.failure is not None:
                raise InstanceFailed(self.server.failure)
            for key, _ in selector.select(timeout=min(remaining, 0.5)):
                inst = key.data
                chunk = inst.stdout.read()
                if not chunk:  # EOF: the process is gone
                    selector.unregister(inst.stdout)
                    self._check_exit(inst)
                    continue
                inst.buffer += chunk
                *lines, inst.buffer = inst.buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._handle(inst, self._decode(inst, line), outcome)

    def _timed_out(self) -> None:
        waiting = [i for i in self.instances.values() if i.state != "done"]
        first = waiting[0]
        states = ", ".join(f"{i.id}: {i.state}" for i in waiting)
        message = f"timed out after {self.timeout_s:g} s (unfinished instances {states})"
        raise InstanceFailed(Failure("timeout", message, first.id, stderr_tail=first.stderr_tail()))

    def extend_deadline(self) -> None:
        """The timeout runs from now: from the start, and again from each LoadGen test (target_qps=auto)."""
        self.deadline = time.monotonic() + self.timeout_s

    @staticmethod
    def _decode(inst: InstanceProcess, line: bytes) -> protocol.Message:
        try:
            return protocol.decode(line)
        except protocol.ProtocolError as bad:
            raise InstanceFailed(Failure("error", f"sent a malformed message while {inst.state}: {bad}", inst.id,
                                         stderr_tail=inst.stderr_tail())) from None

    def _handle(self, inst: InstanceProcess, message: protocol.Message, outcome: LaunchOutcome) -> None:
        if isinstance(message, protocol.Served):  # one per batch: for the server's dispatcher only
            self.server.served(inst.id, message)
            return
        self.on_event(inst.id, {**protocol.fields(message), "pid": inst.process.pid})
        if isinstance(message, protocol.WorkerFailure):
            text = message.message
            if message.kind == "user" and inst.loader_errors():
                text += f" [{inst.loader_errors()[-1]}]"
            raise InstanceFailed(Failure(message.kind, text, inst.id, stderr_tail=inst.stderr_tail(),
                                         traceback=message.traceback))
        if isinstance(message, protocol.Ready):
            inst.state, inst.call_ns, inst.single_ns = "ready", message.call_ns, message.single_ns
            if all(i.state == "ready" for i in self.instances.values()):
                self._start_all(outcome)
        elif isinstance(message, protocol.Progress):
            inst.done = message.done
        elif isinstance(message, protocol.Result):
            inst.result = message.report
            inst.state = "done"
        elif isinstance(message, protocol.Profiled):
            raise InstanceFailed(Failure("error", f"sent an explain worker's '{message.EVENT}'", inst.id))
        elif isinstance(message, protocol.Loaded):
            inst.state = "loaded"
            if all(i.state == "loaded" for i in self.instances.values()):
                self._tell_all("warmup", "warming")  # warm-up starts when every instance is loaded

    def _start_all(self, outcome: LaunchOutcome) -> None:
        """The barrier: every instance is ready; all get the same start instant on one monotonic clock, far
        enough ahead for each to finish the warm call it is in."""
        slowest = max(i.call_ns for i in self.instances.values())
        outcome.start_ns = time.perf_counter_ns() + START_DELAY_NS + 2 * slowest
        self._tell_all(f"start {outcome.start_ns}", "running")
        self.on_event(-1, {"event": "started", "start_ns": outcome.start_ns})
        if self.server is not None:
            self.server.begin(self, outcome.start_ns)

    def tell(self, instance: int, line: str) -> bool:
        """One line to one instance (the server's dispatchers); False when it is gone."""
        try:
            stdin = self.instances[instance].stdin
            stdin.write(f"{line}\n".encode())
            stdin.flush()
            return True
        except (BrokenPipeError, ValueError, OSError):
            return False

    def tell_all_quietly(self, line: str) -> None:
        for instance in self.instances:
            self.tell(instance, line)

    def _tell_all(self, line: str, state: str) -> None:
        for inst in self.instances.values():
            try:
                inst.stdin.write(f"{line}\n".encode())
                inst.stdin.flush()
            except BrokenPipeError:
                pass  # it died meanwhile: its end of file is reported on the next select
            inst.state = state

    def _check_exit(self, inst: InstanceProcess) -> None:
        code = inst.process.wait()
        if inst.state == "done":
            return
        name = signal.Signals(-code).name if code < 0 else None
        how = f"killed by {name}" if name else f"exited with code {code}"
        raise InstanceFailed(Failure("signal" if name else "crash", f"{how} while {inst.state}", inst.id, code,
                                     name, inst.stderr_tail()))

    def stop_all(self) -> None:
        """SIGTERM the process groups, then SIGKILL what is left: no orphans."""
        for inst in self.instances.values():
            if inst.process.poll() is None:
                self._signal_group(inst, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for inst in self.instances.values():
            try:
                inst.process.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                pass
        for inst in self.instances.values():
            self._signal_group(inst, signal.SIGKILL)  # also whatever the worker spawned
            inst.process.wait()
            for stream in (inst.stdin, inst.stdout):
                try:
                    stream.close()
                except OSError:
                    pass

    @staticmethod
    def _signal_group(inst: InstanceProcess, sig: int) -> None:
        try:
            os.killpg(inst.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
