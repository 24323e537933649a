"""Several node types' searches: side by side, one thread each, when their nodes are on separate CPUs (Ray's
driver API is thread-safe), so the fleet takes as long as its slowest type, not their sum; one after the other
when two types share a host's CPUs (fleet.sharing)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

from corescale.tune import fleet


def together(tunes: list) -> bool:
    """Several node types on separate CPUs tune at once; types sharing a host's CPUs, one after the other."""
    return len(tunes) >= 2 and not fleet.sharing(tunes)


def search_all(tunes: list, search: Callable[[object, bool], dict]) -> list[dict]:
    """search(tune, beside) for every tune, in order; beside: it runs next to others (its lines need the node
    type; no live bars, one display at a time)."""
    if not together(tunes):
        return [search(tune, False) for tune in tunes]
    return side_by_side([functools.partial(search, tune, True) for tune in tunes],
                        [f"tune-{tune.node_type}" for tune in tunes])


def side_by_side(works: list[Callable[[], dict]], names: list[str]) -> list[dict]:
    """Each work in its own thread; their results in order. The first error is raised once every work has
    ended."""
    outcomes: list = [None] * len(works)
    failures: list[BaseException] = []

    def run(i: int) -> None:
        try:
            outcomes[i] = works[i]()
        except BaseException as exc:  # handed to the main thread
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i,), name=name, daemon=True) for i, name in enumerate(names)]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)  # short joins: Ctrl-C and SIGTERM reach the main thread meanwhile
    if failures:
        raise failures[0]
    return outcomes
