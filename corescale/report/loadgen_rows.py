"""A served trial's rows in its result table: LoadGen's verdict and search, the latencies, the batches, the server
measured over HTTP, and the quality gate's verdict (report/console.py draws the rest)."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from corescale.record.trial import TrialRecord


def quality_row(table: Table, record: TrialRecord) -> None:
    """The task's quality on real text vs the fp32 reference, and the gate's verdict."""
    q = record.quality
    if q is None:
        return
    verdict = "[green]passes[/green]" if q.passed else "[red]withheld[/red]"
    table.add_row(f"quality ({q.task})", verdict, escape(f"{q.summary()} vs {q.reference} on {q.rows} rows of "
                                                          f"{q.origin}; gate {', '.join(q.gate) or 'none'}"))


def server_table(table: Table, record: TrialRecord) -> Table:
    """scenario=server|single_stream: LoadGen's verdict, latency from scheduled issue, batching, the parent."""
    s = record.server
    assert s is not None, "the server table is drawn only for a served trial"
    lat = s.latency_ms
    if s.searched:
        found = f"{s.max_valid_qps:.4g}" if s.max_valid_qps else "none"
        again = [f"{st.target_qps:g}" for st in s.steps if st.retest]
        retested = f"; {', '.join(again)} QPS tested again (a doubtful miss)" if again else ""
        table.add_row("max valid QPS", found, f"p99 <= {s.slo_p99_ms:g} ms, {len(s.steps)} LoadGen tests{retested}")
        if s.unreachable:
            table.add_row("not searched", "", escape(s.unreachable))
        if s.bounded:
            table.add_row("search bounded", "best so far", escape(s.bounded))
        if s.unestablished:
            table.add_row("max not established", "unknown", escape(s.unestablished))
        if s.skipped:
            table.add_row("not searched", "", escape(s.skipped))
        if s.capacity is not None:
            first = f", first test at {s.capacity.first_qps:g} QPS" if s.capacity.first_qps is not None else ""
            table.add_row("capacity estimate (QPS)", f"{s.capacity.qps:.4g}",
                          escape(f"from warm calls at {s.capacity.basis}{first}"))
        if s.knee_qps:
            table.add_row("load curve knee (QPS)", f"{s.knee_qps:.4g}", "where p99 turns up")
    elif s.scenario == "server":
        step = s.steps[-1]
        slo = f"p99 <= {s.slo_p99_ms:g} ms" if s.slo_p99_ms else "no SLO"
        table.add_row("LoadGen result", s.validity, f"target {s.target_qps:g} QPS, {slo}")
        table.add_row("completed QPS", f"{step.completed_qps:.2f}", f"{step.queries} queries")
    else:
        table.add_row("LoadGen result", s.validity, f"single stream, {s.steps[-1].queries} queries")
    for name in ("p50", "p90", "p99"):
        if lat.get(name) is not None:
            table.add_row(f"latency {name} (ms)", f"{lat[name]:.2f}", "from LoadGen's scheduled issue time")
    b = s.batching
    if b is not None:
        table.add_row("batches", f"{b.mean_rows:.2f} rows mean", f"max {b.max_rows} of max_batch "
                      f"{b.max_batch}, {b.batches} calls, padding waste {b.padding_waste:.0%}")
    if s.endpoint is not None:
        http_rows(table, s)
    if s.parent.cores_used is not None:
        what = "LoadGen + HTTP client" if s.endpoint else "LoadGen + queue + dispatch threads"
        table.add_row("parent CPU", f"{s.parent.cores_used:.2f} cores", what)
    quality_row(table, record)
    if not record.ok:
        table.add_row("status", "[red]failed[/red]", escape(record.reason or ""))
    return table


def http_rows(table: Table, s) -> None:
    """endpoint=: the server measured, the errors, and the breakdown of the step the figures come from."""
    e = s.endpoint
    each = "one query and its texts" if e.path == "/rerank" else "one text"
    table.add_row("endpoint", escape(f"{e.url}{e.path}"), escape(f"api {e.api}, {each} per request"))
    if e.managed is not None:  # endpoint=managed: the service this trial started
        table.add_row("served", escape(e.managed.layout), escape(f"front {e.managed.front}"))
        if e.managed.front_cores is not None:
            table.add_row("front CPU", f"{e.managed.front_cores:.2f} cores", "HTTP, tokenization, queue (its /metrics)")
    shown = [st for st in s.steps if st.target_qps == s.max_valid_qps] if s.searched and s.max_valid_qps else []
    step = (shown or s.steps or [None])[-1]
    if step is None or step.http is None:
        return
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(step.http.errors.items()))
    table.add_row("errors", str(s.errors), escape(f"this step: {kinds}") if kinds else "none in any step")
    for name, where in (("response", "client"), ("queue", "server"), ("tokenization", "server"),
                        ("inference", "server")):
        t = (step.http.client_ms if where == "client" else step.http.server_ms).get(name)
        if t is not None:
            table.add_row(f"{name} (ms, {where})", f"{t.mean:.2f}", f"p50 {t.p50:.2f} · p99 {t.p99:.2f}")
