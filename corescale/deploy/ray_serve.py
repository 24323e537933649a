"""`corescale deploy BUNDLE --target ray`: the bundle as a Ray Serve application (docs/ray.md, "Serving on Ray").

One deployment whose replicas are the bundle's instances. The replica of local rank r on a node (Ray Serve's
ReplicaRank.local_rank: 0..k-1 on each node) runs instance r of the measured layout as the pinned child process
`corescale serve` runs (serve/pool.py: the recorded launch checked and derived here, Launch.from_recorded, so its
CPUs, threads, OpenMP binding, allocator preload and artifact are the bundle's; the server scenario's dynamic
batching at the bundle's batch; restarts and deadlines as serve/supervisor.py has them). A child, not the Ray
worker itself: a preloaded allocator (LD_PRELOAD) and OpenMP's binding are read when a process starts, which a
Ray worker did long before it became a replica. In front of the child: `corescale serve`'s own app (serve/app.py,
serve/routes.py: the same routes, answers, limits and errors), behind Ray Serve's proxy.

Each node holds one replica set: num_replicas = the layout's instances x the nodes whose CPU resource holds the
layout, max_replicas_per_node = the layout's instances. A node whose CPU set lacks the measured CPUs (a container's
cpuset, or the nodes of a local test cluster each pinned to its own CPUs) runs the same blocks placed on its own
CPUs, as `corescale serve` does there (serve/opened.placed_here: a warning line; one line when they do not fit).
The replica's own threads (the HTTP front, tokenization) move to the node's CPUs no block uses when there are any,
as serve's front does.

Order: the bundle is checked here, as serve checks it, and the port bound once, before Ray starts (bad input: one
line, exit 2); then Ray (a private local cluster on loopback, or `--address`), Serve's proxy on --host/--port, the
application; its URL printed once /health answers. SIGTERM or Ctrl-C: Ray Serve drains the application (each
replica finishes its accepted requests, then its pool stops its child), the application is deleted, and a cluster
(and Serve instance) this process started is stopped.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from corescale.deploy import DeployOptions
from corescale.errors import UserError
from corescale.machine.cpulist import format_cpulist
from corescale.machine.scratch import scratch
from corescale.measure.http.contract import authority, is_loopback_host, ready_line
from corescale.serve.app import Front
from corescale.serve.opened import Bundle, open_bundle, part
from corescale.serve.service import (
    KEEP_ALIVE_S,
    Options,
    Stopped,
    bind,
    front_app,
    front_parts,
    model_names,
    stop_signal,
)
from corescale.serve.supervisor import say as said

APPLICATION = "corescale"  # the Ray Serve application's name (and its deployment's)
ENGINE = "ray serve"  # what GET /info's corescale.engine says
READY_S = 60.0  # after the application runs, the longest its proxy may take to answer /health
DRAIN_S = 60.0  # a replica's graceful shutdown: its accepted requests answered within this (serve's GRACEFUL_S)
UNHEALTHY_S = 30.0  # a replica's instance down this long (its restarts failing): the replica reports unhealthy
CONSTRUCTOR_RETRIES = 1  # a replica whose instance cannot start is not started again and again


def say(text: str, stream=None) -> None:
    said(text, stream, "corescale deploy")


# --- on the node: one replica ------------------------------------------------------------------------------------

class EngineFront(Front):
    """serve's front, whose GET /info also says which engine serves (and, in its extra, which replica answered)."""

    def info(self):
        described = super().info()
        return dataclasses.replace(described, corescale=dataclasses.replace(described.corescale, engine=ENGINE))


class Replica:
    """One replica of the deployment: instance `local_rank` of the layout as a pinned child it owns, behind
    `corescale serve`'s app (Ray Serve calls __serve_build_asgi_app__ after this constructor)."""

    def __init__(self, bundle: str, options: Options):
        from corescale.trials.ray import restore_thread_env

        restore_thread_env()  # Ray's OMP_NUM_THREADS=1 reaches neither the front nor the child
        self.stack = ExitStack()
        self.options = options
        self.down_since: float | None = None  # since when no instance of this replica has been ready
        try:
            self.start(options, bundle)
        except BaseException:
            self.stack.close()
            raise

    def start(self, options: Options, bundle: str) -> None:
        from ray import serve

        from corescale.measure.trial import housekeeping_cpus
        from corescale.serve.metrics import Metrics
        from corescale.serve.pool import Pool

        context = serve.get_replica_context()
        rank = context.rank
        work = self.stack.enter_context(scratch("deploy"))
        opened = open_bundle(bundle, work, options.trust, options.key)
        for line in opened.warnings:
            say(f"warning: {line}", sys.stderr)
        block = rank.local_rank % len(opened.specs)
        mine = part(opened, [block])
        metrics = Metrics()
        self.pool = Pool(mine, work, metrics, options.max_queue, options.batch_timeout, options.queue_timeout)
        self.stack.callback(self.pool.stop)
        self.pool.start(opened.cfg.timeout)
        metrics.watch(self.pool)
        self.stack.enter_context(housekeeping_cpus(opened.specs))  # the front off every block of this node
        tokens, width = front_parts(mine, options)
        self.front = EngineFront(self.pool, tokens, mine.head, model_names(options, mine), metrics, width)
        self.front.extra["replica"] = {"replica": context.replica_tag, "rank": rank.rank, "node_rank": rank.node_rank,
                                       "local_rank": rank.local_rank, "cpus": list(mine.specs[0].cpus),
                                       "pid": os.getpid(), "instance_pid": self.instance_pid()}
        say(f"replica {context.replica_tag} (rank {rank.rank}, node {rank.node_rank}, local {rank.local_rank}): "
            f"instance {mine.specs[0].id} on CPUs {format_cpulist(mine.specs[0].cpus)}")

    def check_health(self) -> None:
        """Ray Serve's health check (every health_check_period_s): a replica whose instance has been down longer
        than UNHEALTHY_S (its restarts failing) says so, and Ray replaces it and stops routing to it meanwhile."""
        import time

        if self.pool.ready_count():
            self.down_since = None
            return
        self.down_since = self.down_since or time.monotonic()
        if time.monotonic() - self.down_since > UNHEALTHY_S:
            instance = self.pool.instances[0]
            raise RuntimeError(f"instance {instance.id} has not been ready for {UNHEALTHY_S:g} s "
                               f"({instance.failure or 'restarting'})")

    def instance_pid(self) -> int | None:
        handle = self.pool.instances[0].handle
        return handle.process.pid if handle is not None else None

    def __serve_build_asgi_app__(self):
        return front_app(self.front, self.options)

    def __del__(self) -> None:
        """Ray Serve's graceful shutdown ends here, after the replica's accepted requests were answered: the pool
        finishes what is queued and stops its child, the work folder goes."""
        stack = getattr(self, "stack", None)
        if stack is not None:
            if getattr(self, "pool", None) is not None:
                self.pool.draining = True
            stack.close()


# --- on the driver -------------------------------------------------------------------------------------------------

def serve_on_ray(bundle: Path, options: DeployOptions) -> int:
    """The registry's entry (deploy/__init__.py): the command line's options as `corescale serve`'s."""
    from corescale.serve.opened import Trust

    if not is_loopback_host(options.host) and not options.behind_proxy:
        raise UserError(f"deploy --target ray --host {options.host[:60]}: Ray Serve's own proxy would face the network "
                        "without corescale serve's connection protections (a receive deadline, a header bound, a "
                        "connection limit); listen on loopback behind a reverse proxy that bounds them "
                        "(docs/deploy.md), and say so with --behind-proxy")
    served = Options(options.host, options.port, options.api_key, trust=options.trust or Trust(), key=options.key,
                     served_model_names=options.served_model_names, **options.protections)
    return run(str(bundle), served, options.address, options.name or APPLICATION)


def run(bundle: str, options: Options, address: str | None = None, name: str = APPLICATION) -> int:
    """Deploys `bundle` on the Ray cluster at `address` (None: a private local one on loopback) and serves until
    SIGTERM or Ctrl-C; the exit status."""
    from corescale.trials.ray import connect, import_ray, is_loopback

    root = Path(bundle).expanduser().resolve()
    with scratch("deploy") as work:  # every check serve makes, before Ray starts
        opened = open_bundle(root, work, options.trust, options.key)
    for line in opened.warnings:
        say(f"warning: {line}", sys.stderr)
    sock = bind(options.host, options.port)  # the address is free (port 0: one is chosen), then handed to Ray
    port = sock.getsockname()[1]
    sock.close()
    caught: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop_signal)
    ray = import_ray(loopback=is_loopback(address))
    try:
        import ray.serve  # noqa: F401 (its proxy's dependencies: ray's serve extra)
    except ImportError as exc:
        raise UserError(f"deploy --target ray needs Ray Serve's dependencies ({exc.name} is missing): "
                        "pip install 'corescale[ray]'") from None
    started_here = False
    try:
        started_here = connect(ray, address)
        return serve_until_signal(ray, str(root), opened, dataclasses.replace(options, port=port), caught,
                                  started_here, name)
    except Stopped as stopped:
        say(f"{stopped} before the application was ready; stopping")
        return 0
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        if started_here and ray.is_initialized():
            ray.shutdown()


def serve_until_signal(ray, root: str, opened: Bundle, options: Options, caught: list[int],
                       started_here: bool, name: str) -> int:
    from ray import serve

    from corescale.trials.ray import nodes_holding

    blocks = len(opened.specs)
    cpus = sum(len(spec.cpus) for spec in opened.specs)
    nodes = nodes_holding(ray, opened.specs, "deploy --target ray")
    shared_address = len({n.get("NodeManagerAddress") for n in nodes}) == 1
    began = time.monotonic()
    serve.start(proxy_location="HeadOnly" if shared_address else "EveryNode",
                http_options={"host": options.host, "port": options.port, "keep_alive_timeout_s": KEEP_ALIVE_S,
                              # a request ends within the queue's and a batch's deadlines: the proxy's bound above
                              "request_timeout_s": options.receive_timeout_s + options.queue_timeout + DRAIN_S},
                logging_config={"log_level": logging.WARNING}, controller_options={"runtime_env": {"env_vars": {
                    # every replica set takes requests from any proxy: Ray's default sends a proxy's requests to
                    # its own node's replicas until they hold max_ongoing_requests (the proxies inherit this)
                    "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0"}}})
    deployment: Any = serve.deployment(
        serve.ingress()(Replica), name=name, num_replicas=blocks * len(nodes), max_replicas_per_node=blocks,
        ray_actor_options={"num_cpus": cpus / blocks}, max_ongoing_requests=options.max_queue,
        max_queued_requests=options.max_queue,  # past it the proxy answers 503 at once (Ray's default: no bound)
        graceful_shutdown_timeout_s=DRAIN_S, graceful_shutdown_wait_loop_s=0.5,
        max_constructor_retry_count=CONSTRUCTOR_RETRIES, health_check_period_s=5)
    try:
        try:
            serve.run(deployment.bind(root, options), name=name, route_prefix="/")
        except RuntimeError as failed:  # a replica could not start (its instance did not load): why, exit 1
            print(f"corescale: error: the Ray Serve application did not start: {first_line(failed)}",
                  file=sys.stderr)
            return 1
        url = f"http://{authority(options.host, options.port)}"
        try:
            wait_answering(url, options.api_key)
        except RuntimeError as silent:  # the application runs but its proxy never answered: why, exit 1
            print(f"corescale: error: {silent}", file=sys.stderr)
            return 1
        stop = threading.Event()

        def stopping(number: int, frame) -> None:
            caught.append(number)
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stopping)
        where = "the node's CPUs no block uses, else shared with its block"
        say(ready_line(f"{blocks * len(nodes)} replica(s) of {opened.model} on Ray Serve {ray.__version__} "
                       f"({len(nodes)} node(s) x {blocks} instance(s), {opened.cfg.backend.name}, "
                       f"{opened.cfg.precision})", where, options.host, options.port))
        say(f"ready {time.monotonic() - began:.2f} s after Ray was connected")
        while not stop.wait(1.0):
            pass
        say(f"{signal.Signals(caught[0]).name}: draining the application")
    finally:
        drained = time.monotonic()
        deleting = threading.Thread(target=serve.delete, args=(name,), daemon=True, name="corescale-deploy-delete")
        deleting.start()  # each replica answers what it accepted, then stops its instance
        deleting.join(DRAIN_S + 30)  # bounded: a cluster whose raylet died with a group signal never answers
        if deleting.is_alive():
            say(f"the application was not deleted within {DRAIN_S + 30:g} s (is the Ray cluster alive?)", sys.stderr)
        elif started_here:
            serve.shutdown()
        say(f"the application was drained and deleted in {time.monotonic() - drained:.1f} s"
            + ("; stopping the Ray cluster it started" if started_here else ""))
    return 130 if signal.SIGINT in caught else 0


def wait_answering(url: str, key: str | None) -> None:
    """GET /health through the proxy answers 200 (the proxy starts routing a moment after the application runs)."""
    deadline = time.monotonic() + READY_S
    request = urllib.request.Request(f"{url}/health", headers={"Authorization": f"Bearer {key}"} if key else {})
    while True:
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310 (our own URL)
                if answer.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"Ray Serve's proxy at {url} did not answer /health within {READY_S:g} s")
        time.sleep(0.2)


def first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else type(exc).__name__
