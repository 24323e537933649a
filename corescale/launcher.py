"""Starts one pinned worker process per instance, holds them at a barrier, starts them together, collects.

Any instance that crashes, is killed, reports an error or overruns the timeout fails the whole run: the
others are stopped and no process outlives the launcher.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from corescale import instance_env

START_DELAY_NS = 100_000_000  # the common start instant is this far after the last instance is ready
STDERR_TAIL_LINES = 12

EventHandler = Callable[[int, dict], None]


@dataclass
class InstanceProcess:
    id: int
    process: subprocess.Popen
    stderr_path: Path
    buffer: bytes = b""
    state: str = "starting"  # starting -> loaded -> ready -> running -> done | failed
    result: dict | None = None
    error: dict | None = None

    def stderr_tail(self) -> str:
        try:
            lines = self.stderr_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(line for line in lines[-STDERR_TAIL_LINES:])


@dataclass
class LaunchOutcome:
    results: dict[int, dict] = field(default_factory=dict)
    start_ns: int | None = None
    failure: dict | None = None  # {"instance", "reason", "exit_code", "signal", "stderr_tail", "user_error"}


class InstanceFailed(Exception):
    def __init__(self, info: dict):
        super().__init__(info["reason"])
        self.info = info


def _exit_description(code: int | None) -> dict:
    if code is None:
        return {"exit_code": None, "signal": None}
    if code < 0:
        return {"exit_code": code, "signal": signal.Signals(-code).name}
    return {"exit_code": code, "signal": None}


class Launcher:
    def __init__(self, work_dir: Path, timeout_s: float, on_event: EventHandler | None = None):
        self.work_dir = work_dir
        self.timeout_s = timeout_s
        self.on_event = on_event or (lambda instance, event: None)
        self.instances: dict[int, InstanceProcess] = {}

    def start(self, specs: list[dict], cfg) -> None:
        for spec in specs:
            placement = spec["instance"]
            iid = placement["id"]
            spec_path = self.work_dir / f"instance-{iid}.json"
            spec_path.write_text(json.dumps(spec))
            stderr_path = self.work_dir / f"instance-{iid}.stderr.log"
            command = instance_env.command(placement, [sys.executable, "-m", "corescale.worker", str(spec_path)])
            with open(stderr_path, "wb") as stderr:
                process = subprocess.Popen(
                    command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                    env=instance_env.environment(cfg, placement), start_new_session=True,
                )
            self.instances[iid] = InstanceProcess(iid, process, stderr_path)

    def run(self, specs: list[dict], cfg) -> LaunchOutcome:
        outcome = LaunchOutcome()
        try:
            self.start(specs, cfg)
            self._supervise(outcome)
        except InstanceFailed as failed:
            outcome.failure = failed.info
        except KeyboardInterrupt:
            outcome.failure = {"instance": None, "reason": "interrupted by the user", "user_error": False}
            raise
        finally:
            self.stop_all()
            outcome.results = {i: p.result for i, p in self.instances.items() if p.result is not None}
        return outcome

    def _supervise(self, outcome: LaunchOutcome) -> None:
        deadline = time.monotonic() + self.timeout_s
        selector = selectors.DefaultSelector()
        for inst in self.instances.values():
            os.set_blocking(inst.process.stdout.fileno(), False)
            selector.register(inst.process.stdout, selectors.EVENT_READ, inst)
        while any(inst.state != "done" for inst in self.instances.values()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                waiting = [i.id for i in self.instances.values() if i.state != "done"]
                raise InstanceFailed({"instance": waiting[0], "reason": (
                    f"instance {waiting[0]} timed out after {self.timeout_s:g} s (state: "
                    f"{self.instances[waiting[0]].state})"), "stderr_tail": self.instances[waiting[0]].stderr_tail(),
                    "user_error": False, **_exit_description(None)})
            for key, _ in selector.select(timeout=min(remaining, 0.5)):
                inst = key.data
                chunk = inst.process.stdout.read()
                if not chunk:  # EOF: the process is gone
                    selector.unregister(inst.process.stdout)
                    self._check_exit(inst)
                    continue
                inst.buffer += chunk
                *lines, inst.buffer = inst.buffer.split(b"\n")
                for line in lines:
                    self._handle(inst, json.loads(line), outcome)

    def _handle(self, inst: InstanceProcess, event: dict, outcome: LaunchOutcome) -> None:
        kind = event["event"]
        self.on_event(inst.id, event)
        if kind == "error":
            inst.error = event
            raise InstanceFailed({"instance": inst.id, "reason": f"instance {inst.id}: {event['message']}",
                                  "traceback": event.get("traceback"), "user_error": event.get("user_error", False),
                                  "stderr_tail": inst.stderr_tail(), **_exit_description(None)})
        if kind == "ready":
            inst.state = "ready"
            if all(i.state == "ready" for i in self.instances.values()):
                outcome.start_ns = time.perf_counter_ns() + START_DELAY_NS
                for other in self.instances.values():
                    other.process.stdin.write(f"start {outcome.start_ns}\n".encode())
                    other.process.stdin.flush()
                    other.state = "running"
                self.on_event(-1, {"event": "started", "start_ns": outcome.start_ns})
        elif kind == "result":
            inst.result = event
            inst.state = "done"
        elif kind == "loaded":
            inst.state = "loaded"

    def _check_exit(self, inst: InstanceProcess) -> None:
        code = inst.process.wait()
        if inst.state == "done":
            return
        exit_info = _exit_description(code)
        how = f"was killed by {exit_info['signal']}" if exit_info["signal"] else f"exited with code {code}"
        raise InstanceFailed({"instance": inst.id, "reason": f"instance {inst.id} {how} while {inst.state}",
                              "stderr_tail": inst.stderr_tail(), "user_error": False, **exit_info})

    def stop_all(self) -> None:
        """SIGTERM the process groups, then SIGKILL what is left: no orphans."""
        for inst in self.instances.values():
            if inst.process.poll() is None:
                self._signal_group(inst, signal.SIGTERM)
        deadline = time.monotonic() + 3
        for inst in self.instances.values():
            try:
                inst.process.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                pass
        for inst in self.instances.values():
            self._signal_group(inst, signal.SIGKILL)
            inst.process.wait()
            for stream in (inst.process.stdin, inst.process.stdout):
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
