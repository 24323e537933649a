"""`corescale serve BUNDLE`: the checks, the pinned instances, the HTTP front on uvicorn, the drain at the end.

Order: the bundle is checked and the address bound (bad input: one line, exit 2, no worker started); the
instances start and warm up; the front moves to the CPUs no instance uses when there are any (else it shares
them: the layout says which; every thread of the front moves); uvicorn serves on the bound socket.

SIGTERM (or Ctrl-C) stops the restarts at once, stops accepting connections, waits for every accepted request to
be answered (at most GRACEFUL_S, then the pool's DRAIN_S: within measure/http/contract.py's STOP_S; what is left then
gets 503), stops the instances and exits 0 (130 after Ctrl-C), printing the front's CPU time and each instance's
share of busy time. A second signal after the drain ends the process at once. The instances ignore SIGTERM (they
end when told, or when this process ends), so a signal to every process of the service (a process manager's
control group) drains the same way. A signal during warm-up stops the instances and exits 0 without serving. The
work folder (job files, instance logs) is under $RUNTIME_DIRECTORY when systemd sets it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from corescale.errors import UserError
from corescale.machine.cpulist import format_cpulist
from corescale.machine.placement import InstanceSpec
from corescale.machine.scratch import scratch
from corescale.measure.http.contract import GRACEFUL_S, ready_line
from corescale.measure.trial import housekeeping_cpus
from corescale.serve.limits import Limits
from corescale.serve.opened import Bundle, Trust, from_config_file, from_overrides, open_bundle
from corescale.serve.pool import QUEUE_DEADLINE_S, Pool
from corescale.serve.supervisor import BATCH_DEADLINE_S, say

if TYPE_CHECKING:
    from corescale.serve.tokens import Tokens

KEEP_ALIVE_S = 5  # an idle kept-alive connection is closed after this (uvicorn's default, set here on purpose)
HEADER_BYTES = 16_384  # the request line and headers, at most (past it: 400)
FRONTS_DIR = "fronts"  # in the work folder, with several fronts: each one's metrics for the others


@dataclass(frozen=True)
class Options:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    max_queue: int = 256  # inputs accepted and not answered, then 429
    max_inputs: int = 32  # inputs in one request, then 413 (TEI's --max-client-batch-size)
    access_log: bool = False
    limits: Limits = Limits()  # what one request may hold (max_inputs above is its count)
    max_connections: int = 1000  # connections and requests at once (uvicorn's limit_concurrency), then 503
    receive_timeout_s: float = 30.0  # a request's headers and body must arrive within this
    trust: Trust = Trust()  # what a bundle may ask for: --trust-remote-code, --allow-pickle (serve/opened.py)
    key: bytes | None = None  # --verify KEYFILE: the bundle's signature must verify with it
    batch_timeout: float = BATCH_DEADLINE_S  # the floor of a batch's deadline, seconds
    queue_timeout: float = QUEUE_DEADLINE_S  # the longest an input waits in the queue for an instance, then 503
    # front processes sharing the port, each before its share of the instances (serve/fronts.py); None: the
    # config's server.fronts (a bundle's: what was measured)
    fronts: int | None = None
    served_model_names: tuple[str, ...] = ()  # --served-model-name: the first canonical (serve/names.py); () derived


def model_names(options: Options, opened: Bundle) -> list[str]:
    """What the service answers to (serve/names.py), from the options or the bundle's model and its folder."""
    from corescale.serve.names import served_names

    folder = Path(opened.cfg.model)
    return served_names(list(options.served_model_names), opened.model, folder if folder.is_dir() else None)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)  # connections wait in the backlog until uvicorn accepts them
    sock.set_inheritable(False)
    return sock


def opened_source(source: list[str], work: Path, options: Options) -> Bundle:
    """Overrides (key=value), a config file (CONFIG.json: endpoint=managed's trials), or a bundle folder (copied,
    verified, into `work`; the front's HTTP stack is imported meanwhile, while the copy hashes and writes)."""
    if "=" in source[0]:
        return from_overrides(source)
    if Path(source[0]).is_file():
        return from_config_file(Path(source[0]))
    return open_bundle(source[0], work, options.trust, options.key, meanwhile=http_stack)


class Stopped(BaseException):
    """A stop signal during warm-up (a BaseException, as KeyboardInterrupt: no `except Exception` swallows it)."""


def stop_signal(number: int, frame) -> None:
    raise Stopped(signal.Signals(number).name)


def run(source: list[str], options: Options) -> int:
    """`source`: a bundle's path, overrides or a config file (a layout that was not measured)."""
    import corescale.serve.metrics  # noqa: F401 - before any fork: every front's clock starts with this process
    from corescale.config_server import check_fronts
    from corescale.serve.fronts import serve_fronts

    more_files()
    runtime = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0] or None  # systemd's RuntimeDirectory=
    with scratch("serve", runtime) as work:
        opened = opened_source(source, work, options)
        for line in opened.warnings:
            print(f"corescale serve: warning: {line}", file=sys.stderr, flush=True)
        fronts = options.fronts or opened.cfg.server.fronts
        check_fronts(fronts, len(opened.specs), f"--fronts {fronts}" if options.fronts else f"server.fronts={fronts}")
        options = dataclasses.replace(options, fronts=fronts)
        tokens, width = front_parts(opened, options)
        sock = bind(options.host, options.port)
        serving = Serving(options, Path(work), sock, tokens, width, opened.specs)
        host, port = sock.getsockname()[:2]

        def announce(ready_s: float, where: str) -> None:
            cfg, behind = opened.cfg, f" behind {fronts} fronts" if fronts > 1 else ""
            say(ready_line(f"{len(opened.specs)} instance(s) of {opened.model} on {cfg.backend.name} "
                           f"({cfg.precision}){behind}", where, host, port))
            # after the ready line, never before: a reader that waits for it (measure/http/managed.py) reads line by
            # line under select(), and a line buffered behind another would not wake it
            say(f"ready {ready_s:.2f} s after the process started (instances loaded and warm)")

        if fronts == 1:
            return serve_front(serving, opened, announce)
        (work / FRONTS_DIR).mkdir()
        return serve_fronts(opened, fronts,
                            lambda mine, index, ready: serve_front(serving, mine, ready, index), announce, sock)


@dataclass(frozen=True)
class Serving:
    """What every front of the service shares (one, or each of --fronts)."""

    options: Options
    work: Path
    sock: socket.socket
    tokens: Tokens
    width: int | None
    specs: list[InstanceSpec]  # every instance of the service: its fronts run on the CPUs none of them uses


def serve_front(serving: Serving, mine: Bundle, announce: Callable[[float, str], None], index: int | None = None
                ) -> int:
    """One front before the instances of `mine`, until a stop signal; `index`: its place among several fronts.
    Its exit code: 0, 130 after SIGINT, 1 when an instance could not start."""
    from corescale.serve.metrics import Metrics, front_cpu_seconds

    options, cfg = serving.options, mine.cfg
    fronts = options.fronts or 1
    if index is not None:  # the service's limits, divided among its fronts
        options = dataclasses.replace(options, max_queue=-(-options.max_queue // fronts),
                                      max_connections=-(-options.max_connections // fronts))
    metrics = Metrics()
    if index is not None:
        metrics.share(serving.work / FRONTS_DIR, index)
    pool = Pool(mine, serving.work, metrics, options.max_queue, options.batch_timeout, options.queue_timeout)
    caught: list[int] = []
    began = time.monotonic()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop_signal)
    try:
        try:
            pool.launch()
            Server = http_server()  # FastAPI's and uvicorn's imports (if not done) while the instances load
            pool.wait_ready(cfg.timeout)
        except RuntimeError as failed:  # an instance that could not load: its reason, exit 1
            print(f"corescale: error: {failed}", file=sys.stderr)
            return 1
        metrics.watch(pool)
        ready_s = metrics.ready_now()
        with housekeeping_cpus(serving.specs) as front_cpus:
            announce(ready_s, f"CPUs {format_cpulist(sorted(front_cpus))}" if front_cpus
                     else "shared with the instances")
            import uvicorn

            from corescale.serve.app import Front
            from corescale.serve.guard import deadline_protocol

            front = Front(pool, serving.tokens, mine.head, model_names(serving.options, mine), metrics, serving.width)
            if index is not None:
                front.extra["front"] = {"index": index, "fronts": fronts, "pid": os.getpid(),
                                        "instances": [spec.id for spec in mine.specs]}
            server = Server(pool, caught, uvicorn.Config(
                front_app(front, options), log_level="warning", access_log=options.access_log, lifespan="off",
                ws="none",  # no WebSocket route: the websockets library is not imported (cold start)
                timeout_graceful_shutdown=GRACEFUL_S,
                http=deadline_protocol(options.receive_timeout_s, HEADER_BYTES),
                limit_concurrency=options.max_connections, timeout_keep_alive=KEEP_ALIVE_S,
                h11_max_incomplete_event_size=HEADER_BYTES))
            for sig in (signal.SIGTERM, signal.SIGINT):  # a signal before uvicorn takes them is a drain too (its
                signal.signal(sig, server.handle_exit)  # serve then shuts down at once); after, it raises them again
            server.run(sockets=[serving.sock])
    except Stopped as stopped:
        say(f"{stopped} before the service was ready; stopping")
        return 0
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):  # a second signal ends the process at once
            signal.signal(sig, signal.SIG_DFL)
        pool.stop()
        serving.sock.close()
    summary(pool, front_cpu_seconds() - metrics.cpu_at_start, time.monotonic() - began,
            "" if index is None else f"front {index}: ")
    return 130 if signal.SIGINT in caught else 0


def front_parts(opened: Bundle, options: Options):
    """(the tokenizer with the request limits, the length of one output row or None) the front of `opened` uses
    (`corescale serve`'s, and each replica's of `corescale deploy --target ray`)."""
    from corescale.serve.tokens import Tokens, longest_served
    from corescale.workload.models import resolve_model

    cfg = opened.cfg
    model = resolve_model(cfg.model, cfg.trust_remote_code, cfg.task, cfg.cache_dir)
    limits = dataclasses.replace(options.limits, max_inputs=options.max_inputs)
    longest = longest_served(opened.tokenizer.parent, model.max_positions, cfg.sequence_length)
    tokens = Tokens(opened.tokenizer, longest, limits, model.vocab_size, opened.head.prompt)
    return tokens, opened.head.dense[-1].out_features if opened.head.dense else model.hidden or None


def front_app(front, options: Options):
    """The routes of `front` behind the guard `options` ask for (the key, the body limit, loopback's Host check)."""
    from corescale.measure.http.contract import is_loopback_host
    from corescale.serve.app import create_app

    return create_app(front, options.api_key, front.tokens.limits.payload_bytes,
                      not options.api_key and is_loopback_host(options.host))


def http_stack() -> None:
    """The front's HTTP stack (FastAPI, uvicorn: ~0.4 CPU-s) imported, not at the top: at the latest while the
    instances load, and with a bundle while its copy is made (the copy releases the GIL), so that it does not
    take the CPUs from the instances then (the cold start's critical path)."""
    import uvicorn  # noqa: F401

    import corescale.serve.app  # noqa: F401 - imported now, used once the instances are ready


def http_server() -> type:
    """uvicorn's Server, draining the pool on a stop signal (http_stack's imports, if they were not done yet)."""
    http_stack()
    import uvicorn

    class Server(uvicorn.Server):
        def __init__(self, pool: Pool, caught: list[int], config: uvicorn.Config) -> None:
            super().__init__(config)
            self.pool, self.caught = pool, caught

        def handle_exit(self, sig: int, frame) -> None:  # the drain begins: no restarts from now on
            pool = self.pool
            self.caught.append(sig)
            if not pool.draining:  # (the rest off the signal handler: it may have interrupted a holder of a lock)
                pool.draining = True
                threading.Thread(target=pool.drain_begins, daemon=True, name="corescale-serve-drain").start()
            super().handle_exit(sig, frame)

    return Server


def more_files() -> None:
    """The soft limit on open files raised to the hard one: each connection is a descriptor (1024 is the usual
    soft limit; --max-connections is 1000 by default)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # a hard limit the kernel does not allow as soft (unlimited): keep it
            pass


def summary(pool, cpu: float, wall: float, who: str = "") -> None:
    say(f"{who}stopped after {wall:.1f} s; the front used {cpu:.2f} CPU-s ({cpu / max(wall, 1e-9):.3f} cores)")
    first = pool.metrics.first_answer_s
    if first is not None:
        say(f"{who}the first request was answered {first:.2f} s after the process started")
    for instance in pool.instances:
        report = instance.result or {}
        served = report.get("queries_served")
        say(f"{who}instance {instance.id}: {'?' if served is None else served} inputs served, busy "
            f"{instance.busy_fraction():.1%} of its time, restarted {instance.restarts} time(s)")
    try:
        sys.stdout.flush()
    except OSError:
        pass
