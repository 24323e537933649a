"""Dynamic batching of the server scenario: the one queue every instance takes its batches from (up to
server.max_batch queries and server.max_batch_tokens padded tokens, waiting at most server.max_queue_ms after
the oldest query arrived; with server.queue_delay=adaptive only as long as the arrival rate says another query
comes in time).

Padding follows `pad`: to the batch's longest row (max, sorted) or that length's bucket (bucket), never to the
measured sequence length; the token budget counts padded tokens (rows x padded length), as TEI's
max_batch_tokens does."""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from corescale.workload.samples import padded_length

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig


GAP_WEIGHT = 0.1  # each arrival's weight in the moving average of the time between arrivals


@dataclass
class Waiting:
    sample: Any  # LoadGen's QuerySample (id, index): LoadGen has no types; corescale serve's input row
    arrived_ns: int
    length: int


class Batcher:
    """The one queue every instance takes its batches from."""

    def __init__(self, cfg: BenchmarkConfig, lengths: np.ndarray):
        self.max_batch = cfg.server.max_batch if cfg.scenario == "server" else 1
        self.max_queue_ns = int(cfg.server.max_queue_ms * 1e6)
        self.max_tokens = cfg.server.max_batch_tokens
        self.max_padding = cfg.server.max_padding
        self.adaptive = cfg.server.queue_delay == "adaptive"
        self.gap_ns = float(self.max_queue_ns) or 1.0  # the mean time between arrivals (moving average)
        self.last_ns = 0
        self.pad, self.limit, self.lengths = cfg.pad, cfg.sequence_length, lengths
        self.cond = threading.Condition()
        self.waiting: collections.deque[Waiting] = collections.deque()
        self.closed = False

    def put(self, samples) -> None:
        """LoadGen's samples: their lengths are the query set's."""
        now = time.perf_counter_ns()
        self.add([Waiting(s, now, int(self.lengths[s.index])) for s in samples])

    def add(self, items: list[Waiting]) -> None:
        with self.cond:
            if items and self.last_ns:
                self.arrived(items[0].arrived_ns - self.last_ns, len(items))
            self.last_ns = items[-1].arrived_ns if items else self.last_ns
            self.waiting.extend(items)
            self.cond.notify()  # one taker: the others would find the batch gone

    def arrived(self, gap_ns: int, count: int) -> None:
        """The moving average of the time between arrivals (a request of several rows: the rest came at once)."""
        for gap in (max(gap_ns, 0), *([0] * (count - 1))):
            self.gap_ns += GAP_WEIGHT * (gap - self.gap_ns)

    def worth_waiting(self, left_ns: int) -> bool:
        """Fixed: always, until the delay is over; adaptive: while the next query is expected within it."""
        return left_ns > 0 and (not self.adaptive or self.gap_ns < left_ns)

    def requeue(self, items: list[Waiting]) -> None:
        """A batch no instance started (its instance died first) goes back to the head of the queue."""
        with self.cond:
            self.waiting.extendleft(reversed(items))
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def clear(self) -> list[Waiting]:
        """Every item still waiting, taken out of the queue (a stopping service fails them)."""
        with self.cond:
            items = list(self.waiting)
            self.waiting.clear()
            return items

    def expired(self, before_ns: int) -> list[Waiting]:
        """The items that arrived before `before_ns`, taken out of the queue (a service's queue deadline)."""
        with self.cond:
            old = [w for w in self.waiting if w.arrived_ns < before_ns]
            if old:
                gone = {id(w) for w in old}
                self.waiting = collections.deque(w for w in self.waiting if id(w) not in gone)
            return old

    def take(self) -> list[Waiting] | None:
        """The next batch (blocks); None once closed and empty."""
        with self.cond:
            while True:
                if not self.waiting:
                    if self.closed:
                        return None
                    self.cond.wait()
                    continue
                batch, left_ns = self.decide(time.perf_counter_ns())
                if batch is not None:
                    if self.waiting:
                        self.cond.notify()  # what is left is another taker's
                    return batch
                self.cond.wait(left_ns / 1e9)

    def decide(self, now_ns: int) -> tuple[list[Waiting] | None, int]:
        """The policy, on any clock (the service's, or a simulation's virtual one): with
        queries waiting and an instance free at `now_ns`, (the batch it takes now, 0), or (None, how long to wait
        for more)."""
        left_ns = self.waiting[0].arrived_ns + self.max_queue_ns - now_ns
        if len(self.waiting) >= self.max_batch or not self.worth_waiting(left_ns) or self.closed:
            return self._pop(), 0
        return None, left_ns

    def _pop(self) -> list[Waiting]:
        """Oldest first; pad=sorted fills the batch with the waiting queries nearest the oldest one's length.
        The token budget and the padding cap stop the batch at the first query that would overflow them (the
        oldest always goes: no starvation)."""
        oldest = self.waiting[0]
        candidates = list(self.waiting)
        if self.pad == "sorted":
            candidates = [oldest] + sorted(candidates[1:], key=lambda w: abs(w.length - oldest.length))
        chosen: list[Waiting] = []
        for item in candidates:
            if len(chosen) == self.max_batch:
                break
            if chosen and not self.fits(chosen, item):
                break
            chosen.append(item)
        ids = {id(w) for w in chosen}
        self.waiting = collections.deque(w for w in self.waiting if id(w) not in ids)
        return chosen

    def fits(self, chosen: list[Waiting], item: Waiting) -> bool:
        """Whether `item` joins the call of `chosen` within the token budget and the padding cap."""
        if not self.max_tokens and self.max_padding is None:
            return True
        lengths = [w.length for w in chosen] + [item.length]
        padded = len(lengths) * padded_length(lengths, self.pad, self.limit)
        if self.max_tokens and padded > self.max_tokens:
            return False
        return self.max_padding is None or padded - sum(lengths) <= self.max_padding * padded
