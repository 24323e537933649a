"""The report's tuner section (when the results root is a tune's directory, holding tune.json): trials over
time, the latency-throughput Pareto front with each measurement's config on hover, parameter importances, the
recommendation and the recipe. Interactive charts are plotly with its JS embedded once in the page, so the
report works offline."""

from __future__ import annotations

import html
import json
from pathlib import Path

from corescale.analysis import store
from corescale.errors import UserError
from corescale.tune import document
from corescale.tune.document import Figure, TuneDocument
from corescale.tune.recipe import RECIPE, RECIPE_DIR
from corescale.userfiles import read_text

e = html.escape
PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def _measurements(frame) -> list[dict]:
    """Every valid measurement of the tune (screens, full windows, repeats) with what tells it apart."""
    rows = []
    for _, row in store.ok_rows(frame).iterrows():
        config = json.loads(row["measured"])
        shown = {k: v for k, v in config.items() if k in ("backend.name", "precision", "instances",
                                                          "cores_per_instance", "threads", "batch_size",
                                                          "allocator", "openmp", "duration")
                 or (k.startswith("backend.") and k != "backend.name")}
        served = _number(row.get("server_max_valid_qps"))  # a server search: its max valid QPS, p99 there
        rate = served if served is not None else _number(row["throughput_samples_per_s"])
        p50 = _number(row["latency_p50_ms"])
        p50 = p50 if p50 is not None else _number(row.get("server_p50_ms"))
        if rate is None or p50 is None:
            continue  # a server search where no rate met the SLO: nothing to place
        rows.append({"p50": p50, "p99": row["latency_p99_ms"], "throughput": rate, "finished": row["finished_at"],
                     "duration": config.get("duration"), "run": row["run"],
                     "config": "<br>".join(e(f"{k}={v}") for k, v in shown.items() if v is not None)})
    return rows


def _number(value) -> float | None:
    return None if value is None or value != value else float(value)  # NaN: not measured


def pareto(points: list[dict]) -> list[dict]:
    """The measurements no other one beats on both throughput (higher) and p50 (lower)."""
    front = [p for p in points if not any(q["throughput"] >= p["throughput"] and q["p50"] <= p["p50"] and
                                          (q["throughput"] > p["throughput"] or q["p50"] < p["p50"])
                                          for q in points)]
    return sorted(front, key=lambda p: p["p50"])


def pareto_figure(points: list[dict]):
    import plotly.graph_objects as go

    figure = go.Figure()
    for label, full in (("screening window", False), ("full window", True)):
        chosen = [p for p in points if (p["duration"] == max(q["duration"] for q in points)) == full]
        figure.add_trace(go.Scatter(
            x=[p["p50"] for p in chosen], y=[p["throughput"] for p in chosen], mode="markers", name=label,
            marker={"size": 9, "symbol": "circle" if full else "circle-open"},
            text=[p["config"] for p in chosen],
            hovertemplate="%{text}<br>p50 %{x:.2f} ms · %{y:.2f} samples/s<extra></extra>"))
    front = pareto(points)
    figure.add_trace(go.Scatter(x=[p["p50"] for p in front], y=[p["throughput"] for p in front], mode="lines",
                                name="Pareto front", line={"dash": "dot"}, hoverinfo="skip"))
    figure.update_layout(xaxis_title="latency p50 (ms)", yaxis_title="throughput (samples/s)", height=460,
                         margin={"t": 30})
    return figure


def trials_figure(doc: TuneDocument):
    import plotly.graph_objects as go

    objective = doc.objective
    trials = [(t, t.finished) for t in doc.trials if t.finished]
    if not trials:
        return None
    start = min(t.started or finished for t, finished in trials)
    figure = go.Figure()
    for name, stage in (("screen", "screen"), ("full window", "full")):
        measured = [(t, finished, t.figure(stage, objective.metric)) for t, finished in trials]
        shown = [(t, finished, value) for t, finished, value in measured if value is not None]
        figure.add_trace(go.Scatter(
            x=[finished - start for _, finished, _ in shown], y=[value for _, _, value in shown],
            mode="markers", name=name, text=[e(f"#{t.number} {t.label} ({t.state.lower()})") for t, _, _ in shown],
            hovertemplate="%{text}<br>%{y:.4g}<extra></extra>"))
    best: float | None = None
    line = []
    maximize = objective.direction == "maximize"
    for t, finished in sorted(trials, key=lambda pair: pair[1]):
        value = t.value if t.state == "COMPLETE" and all(c <= 0 for c in t.constraints or [1]) else None
        if value is not None and (best is None or (value > best if maximize else value < best)):
            best = value
        line.append((finished - start, best))
    figure.add_trace(go.Scatter(x=[x for x, _ in line], y=[y for _, y in line], mode="lines", name="best so far",
                                line={"shape": "hv"}))
    figure.update_layout(xaxis_title="seconds since the tune began", height=380, margin={"t": 30},
                         yaxis_title=f"{objective.name} ({objective.unit})")
    return figure


def importance_figure(doc: TuneDocument):
    import plotly.graph_objects as go

    values = doc.importances
    if not values:
        return None
    names = list(values)[::-1]
    figure = go.Figure(go.Bar(x=[values[n] for n in names], y=[e(n) for n in names], orientation="h"))
    figure.update_layout(xaxis_title="importance (optuna.importance, fANOVA)", height=120 + 28 * len(names),
                         margin={"t": 20})
    return figure


def _div(figure, div_id: str) -> str:
    return figure.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOT_CONFIG)


def _fmt(block: Figure, digits=2) -> str:
    if block.mean is None:
        return "-"
    if block.low is None or block.high is None:
        return f"{block.mean:.{digits}f}"
    return f"{block.mean:.{digits}f} ({block.low:.{digits}f} – {block.high:.{digits}f})"


def recommendation_html(doc: TuneDocument) -> str:
    headers = ("role", "configuration", "samples/s (95 % CI)", "p50 ms", "p99 ms", "US$ per 1M", "US$ per 1M tokens",
               "drift", "memory GB", "meets")
    head = "".join(f'<th class="text">{e(h)}</th>' for h in headers)
    body = []
    for f in doc.rows:
        cells = [f.role, f.label, _fmt(f.throughput), _fmt(f.p50_ms), _fmt(f.p99_ms), _fmt(f.cost_per_1m, 4),
                 _fmt(f.cost_per_1m_tokens, 5), _fmt(f.drift, 3), _fmt(f.memory_gb), "yes" if f.feasible else "no"]
        body.append("<tr>" + "".join(f'<td class="text">{e(str(c))}</td>' for c in cells) + "</tr>")
    lines = "".join(f"<li>{e(line)}</li>" for line in
                    [*doc.headline, f"cost: {doc.cost_source or 'no price (a tune of an older version)'}"])
    return (f'<ul>{lines}</ul><div class="scroll"><table id="tune-recommendation"><thead><tr>{head}</tr>'
            f"</thead><tbody>{''.join(body)}</tbody></table></div>")


def recipe_html(doc: TuneDocument, root) -> str:
    """The recipe the tune wrote into its directory (read there: the document's path is only shown)."""
    recipe = doc.recipe
    if not recipe:
        return '<p class="note">No recipe: no configuration met the constraints.</p>'
    try:
        script = read_text(Path(root) / RECIPE_DIR / RECIPE, "tune recipe")
    except UserError as exc:
        script = f"# {exc}"
    served = (f"<p>The deployment bundle: <code>{e(recipe['bundle'])}</code>; <code>corescale serve "
              f"{e(recipe['bundle'])}</code> serves exactly what was measured over HTTP.</p>"
              if recipe.get("bundle") else f"<p class=\"note\">No bundle: {e(recipe.get('bundle_skipped') or '')}</p>")
    return (f"{served}<p>For serving with your own code: <code>{e(str(recipe.get(RECIPE)))}</code> (with "
            f"<code>snippet.py</code> and <code>config.yaml</code> beside it).</p><pre id=\"tune-recipe\">"
            f"{e(script)}</pre>")


def sections(root, frame) -> list[tuple[str, str, str]]:
    """(id, title, html) of the tuner's sections; none when root is not a tune."""
    import plotly.offline

    doc = document.read(root)
    if doc is None:
        return []
    summary = (f"<p>objective <b>{e(doc.objective.name)}</b> · {e(str(doc.space_size))} configurations in the "
               f"space · {len(doc.trials)} Optuna trials · screening {doc.screen_s:g} s, full "
               f"{doc.duration_s:g} s windows · final repeats {e(str(doc.settings.get('repeats')))} · elapsed "
               f"{(doc.elapsed_s or 0) / 60:.1f} min</p>")
    parts = [f"<script>{plotly.offline.get_plotlyjs()}</script>", summary, recommendation_html(doc)]
    charts = [("tune-trials", "Trials over time", trials_figure(doc)),
              ("tune-pareto", "Latency–throughput Pareto front (hover a point for its config)",
               pareto_figure(_measurements(frame)) if not store.ok_rows(frame).empty else None),
              ("tune-importance", "Parameter importances", importance_figure(doc))]
    for div_id, title, figure in charts:
        parts.append(f"<h3>{e(title)}</h3>")
        parts.append(_div(figure, div_id) if figure is not None else
                     '<p class="note">Not enough finished trials for this chart.</p>')
    return [("tuner", "Tuner", "".join(parts)), ("recipe", "Deployment recipe", recipe_html(doc, root))]
