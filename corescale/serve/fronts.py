"""`corescale serve --fronts N`: N front processes accept on the one listening socket, each before its own share of
the instances (N divides them: front k feeds instances k·m … k·m+m−1 of the m = instances ÷ N, contiguous as
placed), as uvicorn's and gunicorn's workers share a port.

Why: one front is one Python event loop; at ~0.3–1 ms of its CPU per request (docs/serve-profile.md) it caps a
machine at a thousand or a few thousand requests per second, while 32 pinned instances of a small model could
answer several times that. N fronts raise that cap N-fold where the machine has the cores for them.

How: the service's process checks everything and binds the socket (bad input: one line, exit 2, no worker), then
forks the fronts while no thread runs (each gets the checked bundle, the tokenizer, the imports and the socket);
each front starts its instances and serves as a lone front does. The kernel hands each new connection to one of
the fronts waiting in accept (a busy front's loop comes back to accept later, so it takes fewer); a connection
stays with the front that accepted it, so a client's requests on one kept-alive connection all go to one front.
`--max-queue` and `--max-connections` are the service's, divided among the fronts. The count is --fronts, else the
config's `server.fronts` (a bundle's: what its managed trial measured).

The service's process prints the ready line once every front is ready, turns SIGTERM and SIGINT into SIGTERM to
each front (each drains as a lone front does; it exits 130 after SIGINT), and starts again a front that ends on
its own while the others serve on (at once, then waiting longer each time it ends again within STABLE_S of its
start, as an instance's restarts); a front that cannot start at first stops the service (its exit code); a front
whose service's process is killed gets SIGTERM from the kernel and drains. GET
/metrics answers for every front, each sample labelled `front` (serve/metrics.py); GET /health and GET /info
answer for the front that accepted the connection, and /info names it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from corescale.errors import UserError
from corescale.machine.instance_env import die_with_parent
from corescale.serve.opened import Bundle, part
from corescale.serve.supervisor import RESTART_BACKOFF_S, say

STOPS = (signal.SIGTERM, signal.SIGINT)
STABLE_S = 60.0  # a front that served this long before it ended is started again at once
Announce = Callable[[float, str], None]  # (seconds from the service's start to ready, where the front runs)
ServeOne = Callable[[Bundle, int, Announce], int]  # a front's share, its index, how it says it is ready -> exit code


def shares(instances: int, fronts: int) -> list[list[int]]:
    """Each front's instances (indexes into the layout), contiguous."""
    each = instances // fronts
    return [list(range(k * each, (k + 1) * each)) for k in range(fronts)]


@dataclass
class Forked:
    index: int
    pid: int
    said: int  # the pipe it writes its ready message on (-1: closed here)
    code: int | None = None  # its exit code once it ended (a signal: minus its number)
    started: float = field(default_factory=time.monotonic)


def serve_fronts(opened: Bundle, fronts: int, serve_one: ServeOne, announce: Announce, listening: socket.socket
                 ) -> int:
    """Forks `fronts` fronts, each `serve_one` of its share; says ready (`announce`) once all are; starts again a
    front that ends while serving; the exit code. `listening` is closed here at a stop signal (a draining front's
    closed socket then refuses) or when a front fails to start."""
    caught: list[int] = []
    forked: dict[int, Forked] = {}
    service, parts = os.getpid(), shares(len(opened.specs), fronts)

    def stop_all() -> None:
        listening.close()  # no front starts again
        for front in forked.values():
            if front.code is None:
                try:
                    os.kill(front.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def forward(number: int, frame) -> None:
        caught.append(number)
        stop_all()

    def start(index: int, awaited: bool = True) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)  # a signal waits until the front has its own handlers
        try:
            front = fork_front(serve_one, part(opened, parts[index]), index, service, forked.values())
            forked[front.pid] = front
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
        if not awaited:  # started again while the others serve: its ready message is not waited for
            os.close(front.said)
            front.said = -1

    for number in STOPS:
        signal.signal(number, forward)
    for index in range(fronts):
        start(index)
    failed = wait_ready(forked, caught, announce)
    if failed is not None:
        stop_all()
    last: dict[int, int] = {}  # each front's latest exit code
    failures = dict.fromkeys(range(fronts), 0)  # ends in a row, each soon after its start
    while any(front.code is None for front in forked.values()):
        pid, status = os.wait()
        if pid not in forked:
            continue
        front = forked.pop(pid)
        ended(front, status)
        last[front.index] = front.code or 0
        if failed is None and not caught:  # it ended on its own while serving: the others serve on
            wait = restart_wait(front, failures)
            say(f"front {front.index} ended with code {front.code} while serving; starting it again"
                + (f" in {wait:g} s" if wait else ""))
            deadline = time.monotonic() + wait
            while not caught and time.monotonic() < deadline:
                time.sleep(0.1)
            if not caught:
                start(front.index, awaited=False)
    for number in STOPS:
        signal.signal(number, signal.SIG_DFL)
    if failed is not None:
        return failed.code if failed.code in (1, 2) else 1
    return 130 if signal.SIGINT in caught else max(last.values(), default=0)


def restart_wait(front: Forked, failures: dict[int, int]) -> float:
    """As an instance's restarts: at once after it had served a while (STABLE_S), then doubling waits while it
    keeps ending soon after its start."""
    if time.monotonic() - front.started >= STABLE_S:
        failures[front.index] = 0
    failures[front.index] += 1
    if failures[front.index] == 1:
        return 0.0
    return min(RESTART_BACKOFF_S[0] * 2 ** min(failures[front.index] - 2, 10), RESTART_BACKOFF_S[1])


def fork_front(serve_one: ServeOne, mine: Bundle, index: int, service: int, others) -> Forked:
    """A front process serving `mine` (the caller blocks the stop signals around it)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            die_with_parent(signal.SIGTERM)  # the service's process killed: the front drains and ends
            if os.getppid() != service:  # (it died before that)
                os._exit(1)
            os.close(read)
            for other in others:
                if other.said >= 0:
                    os.close(other.said)
            code = front_process(serve_one, mine, index, write)
        finally:
            os._exit(code)
    os.close(write)
    return Forked(index, pid, read)


def wait_ready(forked: dict[int, Forked], caught: list[int], announce: Announce) -> Forked | None:
    """Every front's ready message, then `announce` (the latest ready, where they run); the front that ended
    first, when one ends before it is ready and no stop signal asked for it; None otherwise."""
    waiting = {front.said: front for front in forked.values()}
    latest, where = 0.0, ""
    while waiting:
        for said in select.select(list(waiting), [], [])[0]:
            front = waiting.pop(said)
            message = os.read(said, 4096)
            os.close(said)
            front.said = -1
            if message:
                ready = json.loads(message)
                latest, where = max(latest, ready["ready_s"]), ready["where"]
                continue
            ended(front, os.waitpid(front.pid, 0)[1])  # it closed the pipe unready: it ended
            if not caught:
                for rest in waiting.values():
                    os.close(rest.said)
                    rest.said = -1
                return front
    if not caught:
        announce(latest, where)
    return None


def ended(front: Forked, status: int) -> None:
    front.code = os.waitstatus_to_exitcode(status)


def front_process(serve_one: ServeOne, mine: Bundle, index: int, said: int) -> int:
    """In the forked front: serve `mine`; its exit code (a UserError: its line and 2, as the command line does)."""
    for number in STOPS:
        signal.signal(number, signal.SIG_DFL)  # until serve_one sets its own (nothing runs yet to drain)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)

    def ready(ready_s: float, where: str) -> None:
        try:
            os.write(said, json.dumps({"ready_s": ready_s, "where": where}).encode())
        except BrokenPipeError:  # started again while serving: nobody waits for it
            pass
        os.close(said)

    code = 1
    try:
        code = serve_one(mine, index, ready)
    except UserError as exc:
        print(f"corescale: error: {exc}", file=sys.stderr)
        code = 2
    except BaseException:  # noqa: BLE001 - the process ends here either way: say why
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:
                pass
    return code
