"""Starts one pinned worker process per instance, holds them at a barrier, starts them together, collects.

Any instance that crashes, is killed, reports an error or overruns the timeout fails the whole run: the
others are stopped and no process outlives the launcher. Each worker runs in its own session (process
group), so stopping it also stops anything it spawned.
"""

from __future__ import annotations

import os
import selectors
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from corescale.machine import instance_env
from corescale.machine.placement import InstanceSpec
from corescale.measure import protocol
from corescale.measure.forkserver import RepeatServers
from corescale.measure.instance import Handshake, InstanceHandle, how_it_ended, stop_all
from corescale.record.trial import Failure

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

START_DELAY_NS = 100_000_000  # the common start instant is this far (plus two calls) after the last is ready
STOP_GRACE_S = 3.0  # SIGTERM, then SIGKILL after this long

EventHandler = Callable[[int, dict], None]


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
                 files: protocol.TrialFiles = protocol.NO_FILES, forkservers: RepeatServers | None = None):
        self.work_dir = work_dir
        self.forkservers = forkservers
        self.timeout_s = timeout_s
        self.on_event = on_event or (lambda instance, event: None)
        self.instances: dict[int, InstanceHandle] = {}
        self.launches: dict[int, dict[str, Any]] = {}  # command prefix and the variables set (recorded)
        self.handshake = Handshake([], START_DELAY_NS)
        self.server = server  # loadgen.py's LoadGenServer: serves LoadGen's queries once every instance is ready
        self.files = files  # the trial's files every worker's job names (the query set's path)
        self.deadline = 0.0

    def start(self, specs: list[InstanceSpec], cfg: BenchmarkConfig, model) -> None:
        preload = instance_env.preload_paths(cfg)  # a missing library is a UserError before anything starts
        jobs = protocol.Job.each(cfg, model, specs, self.files)
        launches = [(spec, instance_env.Launch.of(cfg, spec, preload)) for spec in specs]
        servers = self.forkservers
        for _, launch in launches:
            if servers is not None:  # their servers import side by side
                servers.prepare(launch.prefix, launch.env, launch.cpus, cfg.backend.name, model.model_type)
        for job, (spec, launch) in zip(jobs, launches):
            spec_path = job.write(self.work_dir / f"instance-{spec.id}.json")
            stderr_path = self.work_dir / f"instance-{spec.id}.stderr.log"
            forked = None if self.forkservers is None else self.forkservers.spawn(
                launch.prefix, launch.env, launch.cpus, cfg.backend.name, model.model_type, spec_path, stderr_path)
            self.launches[spec.id] = {**launch.recorded(), "forked_from": getattr(forked, "server_pid", None)}
            self.instances[spec.id] = (InstanceHandle.spawn(spec.id, launch, spec_path, stderr_path)
                                       if forked is None else InstanceHandle(spec.id, forked, stderr_path))
        self.handshake = Handshake(self.instances.values(), START_DELAY_NS)

    def run(self, specs: list[InstanceSpec], cfg: BenchmarkConfig, model) -> LaunchOutcome:
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
            outcome.results = {i: {**p.result, "launch": self.launches[i]} for i, p in self.instances.items()
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
                for line in inst.lines(chunk):
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
    def _decode(inst: InstanceHandle, line: bytes) -> protocol.Message:
        try:
            return protocol.decode(line)
        except protocol.ProtocolError as bad:
            raise InstanceFailed(Failure("error", f"sent a malformed message while {inst.state}: {bad}", inst.id,
                                         stderr_tail=inst.stderr_tail())) from None

    def _handle(self, inst: InstanceHandle, message: protocol.Message, outcome: LaunchOutcome) -> None:
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
        if isinstance(message, protocol.Profiled):
            raise InstanceFailed(Failure("error", f"sent an explain worker's '{message.EVENT}'", inst.id))
        inst.heard(message)
        start_ns = self.handshake.heard(message)
        if start_ns is not None:  # every instance is ready, and told when to start
            outcome.start_ns = start_ns
            self.on_event(-1, {"event": "started", "start_ns": start_ns})
            if self.server is not None:
                self.server.begin(self, start_ns)

    def tell(self, instance: int, command: protocol.Command) -> bool:
        """One command to one instance (the server's dispatchers); False when it is gone."""
        return self.instances[instance].tell(command)

    def tell_all_quietly(self, command: protocol.Command) -> None:
        for inst in self.instances.values():
            inst.tell(command)

    def _check_exit(self, inst: InstanceHandle) -> None:
        code = inst.process.wait()
        if inst.state == "done":
            return
        how, name = how_it_ended(code)
        raise InstanceFailed(Failure("signal" if name else "crash", f"{how} while {inst.state}", inst.id, code,
                                     name, inst.stderr_tail()))

    def stop_all(self) -> None:
        """SIGTERM the process groups, then SIGKILL what is left: no orphans."""
        stop_all(self.instances.values(), STOP_GRACE_S)
