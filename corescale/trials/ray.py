"""Trials on a Ray cluster: one trial at a time per benchmark node, every result committed by the driver.

A benchmark node declares the custom resource `corescale_node: 1` (and optionally a type label
`corescale_type:<type>: 1`). The driver picks a free node for each trial and submits one Ray task pinned to
it (corescale_node=1, a fresh worker per task) that reserves every CPU the node declares to Ray, so Ray
schedules no other CPU work there while it measures, and holds that node's machine lock (machine/lock.py), so
nothing else of corescale measures there meanwhile (a local run, `info --peak`). The task re-prepares the trial
for its own topology, runs the normal launcher there and returns the UncommittedResult; the driver commits it.

Faults: a dead worker or node is retried on another node (executor.max_retries times); an error inside the
benchmark (bad input on that node) becomes a failed result at once. Ray is imported only here, lazily.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corescale.config import RayExecutorConfig
from corescale.errors import UserError
from corescale.machine import environment
from corescale.machine.lock import machine_lock
from corescale.measure.http.contract import is_loopback_host
from corescale.measure.runner import Trial, UncommittedResult, failed_result
from corescale.record.trial import Failure, machine_fingerprint
from corescale.trials.local import Listener, LoopState, Planned, Resume, commit_once, schedule, stamp

NODE_RESOURCE = "corescale_node"
TYPE_PREFIX = "corescale_type:"
LOOPBACK = "127.0.0.1"
LOCAL_OBJECT_STORE_BYTES = 256 * 2**20
POLL_S = 5.0  # how often the driver looks at the cluster again while it waits for results
THREAD_ENV_PREFIXES = ("OMP_", "KMP_", "MKL_", "GOMP_", "OPENBLAS_")

log = logging.getLogger(__name__)


def import_ray(loopback: bool = False):
    """Ray, or a UserError naming the extra. `loopback`: the cluster is (or will be) on 127.0.0.1 only."""
    if loopback:  # else Ray swaps 127.0.0.1 for this host's public IP, where a loopback cluster is not listening
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read at import, here and by Ray's processes
    try:
        import ray
    except ImportError:
        raise UserError("executor=ray needs Ray: pip install 'corescale[ray]'") from None
    if loopback:
        import ray._private.ray_constants as constants

        constants.ENABLE_RAY_CLUSTER = False  # in case ray was imported before the variable was set
    return ray


def split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of HOST:PORT (IPv6 as [::1]:PORT); None for "auto" and other forms Ray resolves itself."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def is_loopback(address: str | None) -> bool:
    if address is None:
        return True
    parsed = split_address(address)
    if parsed is None:
        return False
    return is_loopback_host(parsed[0])


def check_reachable(address: str, what: str = "executor.address", timeout_s: float = 5.0) -> None:
    """Fails fast with one line where ray.init would retry for minutes (`what`: the setting that names it)."""
    parsed = split_address(address)
    if parsed is None:
        return
    try:
        socket.create_connection(parsed, timeout=timeout_s).close()
    except OSError as exc:
        raise UserError(f"cannot reach the Ray cluster at '{address}' ({exc.strerror or exc}); start it with "
                        f"`ray start --head --port 6379 ...` or fix {what}") from None


# --- on the node ------------------------------------------------------------------------------------------------

def exec_environment() -> dict[str, str] | None:
    """The environment this process was started with (before Ray changed os.environ in it)."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return None
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def restore_thread_env() -> None:
    """Ray sets OMP_NUM_THREADS (to the task's num_cpus) inside its workers: undo it, so neither the recorded
    environment nor the instance processes inherit it (instances get their own thread counts explicitly)."""
    started_with = exec_environment()
    if started_with is None:
        os.environ.pop("OMP_NUM_THREADS", None)
        return
    for name in [k for k in os.environ if k.startswith(THREAD_ENV_PREFIXES)]:
        if name not in started_with:
            del os.environ[name]
        elif os.environ[name] != started_with[name]:
            os.environ[name] = started_with[name]


def run_on_node(trial: Trial, node: dict) -> UncommittedResult:
    """The Ray task: prepare the driver's trial for this node's topology, measure it, return everything."""
    from corescale.machine import environment
    from corescale.measure.runner import prepare_trial, run_instances

    restore_thread_env()
    started = time.time()
    host = environment.capture()
    node = {**node, "hostname": host.hostname, "cpu_model": host.cpu.model, "pid": os.getpid(),
            "reserved_cpus": reserved_cpus()}
    try:
        with machine_lock() as waited:  # this node's: a local run or `info --peak` there waits, or this task does
            here = prepare_trial(trial.cfg, on_node=True)
            measured = run_instances(dataclasses.replace(here, key=trial.key), None, host)  # the driver's key
        measured.record.lock_wait_s = waited
    except Exception as exc:  # everything raised here is the benchmark's, not the node's, fault
        measured = failed_result(trial, Failure.from_exception(exc), host, started)
    measured.record.node = node
    measured.record.executor = {"started": started, "finished": time.time()}
    return measured


def node_fingerprint() -> str:
    """The Ray task of resume: the machine and software fingerprint a trial measured on this node gets (in the
    environment run_on_node measures in: Ray's thread variables undone)."""
    restore_thread_env()
    return machine_fingerprint(environment.capture())


def reserved_cpus() -> float | None:
    """The CPUs Ray reserved for this task on its node (None outside a Ray task)."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_assigned_resources().get("CPU", 0.0)


# --- on the driver ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Node:
    id: str
    ip: str
    hostname: str
    types: tuple[str, ...]
    cpus: float = 0.0  # the CPUs the node declares to Ray: a benchmark task reserves them all

    @classmethod
    def from_ray(cls, entry: dict) -> "Node":
        types = tuple(sorted(k[len(TYPE_PREFIX):] for k, v in entry["Resources"].items()
                             if k.startswith(TYPE_PREFIX) and v > 0))
        return cls(entry["NodeID"], entry.get("NodeManagerAddress", ""), entry.get("NodeManagerHostname", ""), types,
                   float(entry["Resources"].get("CPU", 0.0)))

    def matches(self, node_type: str | None) -> bool:
        return node_type is None or node_type in self.types

    def identity(self, node_type: str | None) -> dict:
        label = node_type or (self.types[0] if len(self.types) == 1 else None)
        return {"node_type": label, "node_types": list(self.types), "ray_node_id": self.id, "ip": self.ip,
                "ray_hostname": self.hostname}

    def display_name(self) -> str:
        return f"{self.hostname or self.ip} ({self.id[:8]})"


def benchmark_nodes(ray) -> list[Node]:
    """Alive nodes that declare the corescale_node resource."""
    return [Node.from_ray(n) for n in ray.nodes() if n.get("Alive") and n["Resources"].get(NODE_RESOURCE, 0) >= 1]


def describe_target(node_type: str | None) -> str:
    return f"with resources {NODE_RESOURCE} and {TYPE_PREFIX}{node_type}" if node_type else \
        f"with the resource {NODE_RESOURCE}"


def no_node_error(node_type: str | None, nodes: list[Node], detail: str = "") -> UserError:
    types = sorted({t for n in nodes for t in n.types})
    have = f"{len(nodes)} corescale node(s) alive" + (f", types: {', '.join(types)}" if types else "")
    resources = f'{{"{NODE_RESOURCE}": 1' + (f', "{TYPE_PREFIX}{node_type}": 1' if node_type else "") + "}"
    return UserError(f"no alive Ray node {describe_target(node_type)} ({have}){detail}; start one with "
                     f"`ray start --address=HEAD:6379 --resources='{resources}'`")


@dataclass
class Attempt:
    """One trial on its way through the cluster, with the nodes where it already died."""

    item: Planned
    repeat: int = 0  # repeats of a trial run as separate tasks, anywhere of its type, each in fresh processes
    failures: list[dict] = field(default_factory=list)
    node: Node | None = None
    submitted: float = 0.0

    @property
    def trial(self) -> Trial:
        return self.item.trial

    @property
    def key(self) -> str:
        return self.item.key

    @property
    def node_type(self) -> str | None:
        return getattr(self.trial.cfg.executor, "node_type", None)

    @property
    def max_retries(self) -> int:
        return getattr(self.trial.cfg.executor, "max_retries", RayExecutorConfig.max_retries)

    @property
    def failed_nodes(self) -> set[str]:
        return {f["ray_node_id"] for f in self.failures}


def pick_node(nodes: list[Node], attempt: Attempt, busy: set[str]) -> Node | None:
    """A free node of the trial's type, preferring nodes where it has not died; None = wait."""
    matching = [n for n in nodes if n.matches(attempt.node_type)]
    free = [n for n in matching if n.id not in busy]
    fresh = [n for n in free if n.id not in attempt.failed_nodes]
    if fresh:
        return fresh[0]
    if any(n.id not in attempt.failed_nodes for n in matching):
        return None  # an untried node of this type is busy: wait for it rather than reuse a failed one
    return free[0] if free else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}".rstrip(": ")


class RayExecutor:
    """At most one trial per benchmark node in flight; results committed as they arrive."""

    def __init__(self, settings: RayExecutorConfig):
        self.settings = settings

    def run(self, planned: list[Planned], listener: Listener | None = None, resume: bool = True,
            fail_fast: bool = False, accept_foreign: bool = False) -> LoopState:
        """Like the local loop (local.run_trials): resume counts valid results measured on a machine and software
        of the trial's node type (any machine's: accept_foreign; none: resume=False, i.e. --rerun), and fail_fast
        submits nothing after the first failed trial (those already running on other nodes finish)."""
        listener = listener or Listener()
        order = schedule(planned)
        state = LoopState(len(order))
        ray: Any = None  # the ray module once connected
        started_here = False
        in_flight: dict[Any, Any] = {}  # a Ray ObjectRef -> what it measures
        try:
            if resume and not accept_foreign and self.settings.address is not None:
                ray, started_here = self._start()  # the nodes say which machines' results count
                done = Resume(resume, self._node_fingerprints(ray))
            else:  # a private local Ray runs on this machine: its results are this machine's
                done = Resume.here(resume, accept_foreign, environment.capture())
            queue = self._unfinished(order, state, listener, done)
            if not queue:
                return state
            if ray is None:
                ray, started_here = self._start()
            self._check_types(ray, queue)
            self._loop(ray, queue, in_flight, state, listener, done, fail_fast)
            return state
        finally:
            for ref in in_flight if ray is not None else ():
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # the task may already be gone
                    pass
            if started_here and ray is not None:
                ray.shutdown()

    def _start(self):
        """(ray, whether this call connected it)."""
        ray = import_ray(loopback=is_loopback(self.settings.address) and not _ray_initialized())
        return ray, self._connect(ray)

    @staticmethod
    def _node_fingerprints(ray):
        """machines(item) for Resume: the fingerprints of the alive benchmark nodes of the trial's node type (each
        node probed once, all at once)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = benchmark_nodes(ray)
        remote = ray.remote(num_cpus=0, max_retries=1)(node_fingerprint)
        found = ray.get([remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.id, soft=False)).remote()
                         for n in nodes])
        by_node = dict(zip(nodes, found))

        def machines(item: Planned) -> frozenset[str]:
            node_type = getattr(item.trial.cfg.executor, "node_type", None)
            return frozenset(fingerprint for node, fingerprint in by_node.items() if node.matches(node_type))

        return machines

    @staticmethod
    def _unfinished(order: list[tuple[Planned, int]], state: LoopState, listener: Listener,
                    done: Resume) -> list[Attempt]:
        """(trial, repeat)s without a valid result (and, resuming, no earlier twin in this list), round by round
        as the local loop orders them."""
        queued: dict[tuple, Planned] = {}
        queue = []
        for item, repeat in order:
            existing = done.find(item, repeat)
            twin = (item.root, item.key, repeat)
            if existing is None and done.enabled and twin in queued:
                existing = Path(f"(same key as trial {queued[twin].number} of this sweep)")
            if existing is not None:
                state.skip(item, existing, repeat, listener)
            else:
                queued[twin] = item
                queue.append(Attempt(item, repeat))
        return queue

    def _connect(self, ray) -> bool:
        return connect(ray, self.settings.address, {NODE_RESOURCE: 1})

    def _check_types(self, ray, queue: list[Attempt]) -> None:
        nodes = benchmark_nodes(ray)
        for node_type in dict.fromkeys(a.node_type for a in queue):
            if not any(n.matches(node_type) for n in nodes):
                raise no_node_error(node_type, nodes)

    def _loop(self, ray, queue: list[Attempt], in_flight: dict, state: LoopState, listener: Listener,
              done: Resume, fail_fast: bool = False) -> None:
        """Submits and collects; another sweep on the same results root (Ray or local) may commit a (trial,
        repeat) meanwhile: looked up again before each submit, and under the commit lock before each commit."""
        remote = ray.remote(num_cpus=0, resources={NODE_RESOURCE: 1}, max_calls=1, max_retries=0,
                            retry_exceptions=False)(run_on_node)
        while queue or in_flight:
            nodes = benchmark_nodes(ray)
            busy = {a.node.id for a in in_flight.values()}
            for attempt in list(queue):
                existing = done.find(attempt.item, attempt.repeat)
                if existing is not None:
                    queue.remove(attempt)
                    state.skip(attempt.item, existing, attempt.repeat, listener)
                    continue
                node = pick_node(nodes, attempt, busy)
                if node is not None:
                    queue.remove(attempt)
                    busy.add(node.id)
                    listener.starting(attempt.item, state)
                    in_flight[self._submit(ray, remote, attempt, node)] = attempt
            if not in_flight:
                raise no_node_error(queue[0].node_type, nodes,
                                    f"; {len(queue)} trial(s) not run (rerun the sweep to resume them)")
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=POLL_S)
            for ref in ready:
                attempt = in_flight.pop(ref)
                measured = self._collect(ray, ref, attempt, queue)
                if measured is None:
                    continue
                outcome = commit_once(measured, lambda a=attempt: done.find(a.item, a.repeat))
                if isinstance(outcome, Path):  # another sweep committed it while this one measured
                    state.skip(attempt.item, outcome, attempt.repeat, listener)
                elif state.finish(attempt.item, outcome, attempt.repeat, listener, fail_fast):
                    queue.clear()  # --fail-fast: nothing more is submitted

    @staticmethod
    def _submit(ray, remote, attempt: Attempt, node: Node):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        attempt.node, attempt.submitted = node, time.time()
        strategy = NodeAffinitySchedulingStrategy(node.id, soft=False)
        log.info("trial %s -> node %s", attempt.key, node.display_name())
        # every CPU of the node: Ray must not co-schedule CPU work there while the trial measures
        return remote.options(scheduling_strategy=strategy, num_cpus=node.cpus).remote(
            attempt.trial, node.identity(attempt.node_type))

    def _collect(self, ray, ref, attempt: Attempt, queue: list[Attempt]) -> UncommittedResult | None:
        """The trial's UncommittedResult, stamped for the store; None when it was queued again after a node fault."""
        from ray.exceptions import RayError, RayTaskError

        where = attempt.node
        assert where is not None, "a collected attempt was submitted to a node"
        node = where.identity(attempt.node_type)
        started = attempt.submitted
        try:
            measured = ray.get(ref)
        except RayTaskError as exc:  # raised inside the task: retrying would fail the same way
            cause = _first_line(exc.cause or exc)
            failure = Failure("error", f"trial raised on node {where.display_name()}: {cause}")
            measured = failed_result(attempt.trial, failure, None, started)  # stamped with its node below
        except RayError as exc:  # the worker or the node died
            attempt.failures.append({**node, "error": _first_line(exc)})
            if len(attempt.failures) <= attempt.max_retries:
                log.warning("trial %s: %s on %s; retrying", attempt.key, _first_line(exc), where.display_name())
                queue.insert(0, attempt)
                return None
            failure = Failure("crash", f"Ray worker or node died {len(attempt.failures)} time(s), last on "
                                       f"{where.display_name()}: {_first_line(exc)}")
            measured = failed_result(attempt.trial, failure, None, started)  # stamped with its node below
        executor = {**(measured.record.executor or {}), "name": "ray", "submitted": attempt.submitted,
                    "attempt": len(attempt.failures) + 1,
                    "failed_attempts": attempt.failures}
        return stamp(measured, node=measured.record.node or node, executor=executor, repeat=attempt.repeat,
                     repeats=attempt.trial.cfg.repeats)


def connect(ray, address: str | None, resources: dict[str, float] | None = None, what: str = "executor.address",
            ) -> bool:
    """Connects to `address`, or starts a private local Ray (loopback only, no dashboard, this process's CPUs,
    `resources` declared). Returns whether this call connected (and so must disconnect)."""
    if ray.is_initialized():
        return False
    options: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False,
                               **({"runtime_env": quoted} if (quoted := python_of_workers()) else {})}
    try:
        if address is None:
            ray.init(address="local", include_dashboard=False, _node_ip_address=LOOPBACK,
                     num_cpus=len(os.sched_getaffinity(0)), resources=resources or {},
                     object_store_memory=LOCAL_OBJECT_STORE_BYTES, **options)
        else:
            check_reachable(address, what)
            ray.init(address=address, **options)
    except ConnectionError as exc:
        raise UserError(f"cannot connect to the Ray cluster at '{address}': {_first_line(exc)}; start it with "
                        f"`ray start --head --port 6379 ...` or fix {what}") from None
    return True


def nodes_holding(ray, specs, what: str) -> list[dict]:
    """The alive nodes whose CPU resource holds the layout of `specs` (each runs one set of its instances)."""
    cpus = sum(len(spec.cpus) for spec in specs)
    nodes = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) >= cpus]
    if not nodes:
        raise UserError(f"{what}: no alive Ray node declares {cpus} CPUs (the bundle's layout): start nodes with "
                        f"`ray start ... --num-cpus {cpus}` or more")
    return nodes


def python_of_workers() -> dict[str, str]:
    """A runtime environment's workers start through `bash -c` with Ray's Python unquoted (ray 2.x,
    _private/runtime_env/context.py), so under a path with a space none starts (a Serve controller never does). Such
    a Python is named quoted, as the job's `py_executable` (a shell command by Ray's definition), which every actor of
    the job inherits; the nodes then run it from the same path (this machine's, or nodes made from one image)."""
    if shlex.quote(sys.executable) == sys.executable:
        return {}
    return {"py_executable": shlex.quote(sys.executable)}


def _ray_initialized() -> bool:
    import sys

    ray = sys.modules.get("ray")
    return bool(ray and ray.is_initialized())
