"""The report's tune sections (when the results root is a tune's directory, holding tune.json): the answer (the
recommendation and the latency-throughput Pareto front, each measurement's config on hover, the few points that
matter labelled), how the tuner searched (trials over time, parameter importances) and the recipe. Interactive
charts are plotly with its JS embedded once in the page, so the report works offline; a script of the page's own
(DECLUTTER_JS) places the labels where they cover no other text at whatever width the page is shown, and hides
one that finds no free place (its point keeps its hover)."""

from __future__ import annotations

import html
import json
import math
import shlex
from pathlib import Path

from corescale.analysis import store
from corescale.errors import UserError
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
                     "backend": str(row["backend"]),
                     "duration": config.get("duration"), "run": row["run"],
                     "config": "<br>".join(e(f"{k}={v}") for k, v in shown.items() if v is not None)})
    return rows


def _number(value) -> float | None:
    return None if value is None or value != value else float(value)  # NaN: not measured


def model_word(frame) -> str:
    """The results' model as a command word takes it (the most frequent one)."""
    models = frame["model"].dropna().astype(str)
    return shlex.quote(models.mode().iloc[0]) if not models.empty else "MODEL"


def pareto(points: list[dict]) -> list[dict]:
    """The measurements no other one beats on both throughput (higher) and p50 (lower)."""
    front = [p for p in points if not any(q["throughput"] >= p["throughput"] and q["p50"] <= p["p50"] and
                                          (q["throughput"] > p["throughput"] or q["p50"] < p["p50"])
                                          for q in points)]
    return sorted(front, key=lambda p: p["p50"])


LEGEND = {"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0, "xanchor": "left"}


def _layout(figure, height: int, **layout) -> None:
    """Every chart's frame: room below for the legend in rows of its own, never on the plot or its axis titles."""
    figure.update_layout(height=height, margin={"t": 30, "b": 110, "l": 60, "r": 20}, legend=LEGEND,
                         font={"size": 12}, **layout)


def highlights(points: list[dict], doc: TuneDocument) -> list[dict]:
    """The points that matter, most important first: the recommendation, the out-of-box baseline and the peer
    (means over their repeats), then the best measurement of each other backend by the objective."""
    chosen = []
    winner = doc.winning
    for f, name in ((winner, "recommended"), (doc.baseline, "out-of-box"), (doc.peer, "peer")):
        if f is not None and f.p50_ms.mean is not None and f.throughput.mean is not None and \
                not (name == "out-of-box" and f is winner):
            chosen.append({"name": name, "p50": f.p50_ms.mean, "throughput": f.throughput.mean,
                           "config": e(f.label), "runs": {Path(p).name for p in f.paths}})
    runs = {Path(p).name for p in winner.paths} if winner else set()
    taken = {p["backend"] for p in points if p["run"] in runs}  # the recommendation stands for its backend
    lower = doc.objective.direction == "minimize" and doc.objective.metric in ("p50_ms", "p99_ms")
    for backend in sorted({p["backend"] for p in points} - taken):
        mine = [p for p in points if p["backend"] == backend]
        best = min(mine, key=lambda p: p["p50"]) if lower else max(mine, key=lambda p: p["throughput"])
        chosen.append({**best, "name": f"best {backend}"})
    return chosen


def pareto_figure(points: list[dict], marked: list[dict] | None = None):
    """Every measurement (screening and full windows), the front, and the marked points labelled."""
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
    marked = marked or []
    if marked:
        figure.add_trace(go.Scatter(
            x=[p["p50"] for p in marked], y=[p["throughput"] for p in marked], mode="markers",
            name="recommended · best of a backend",
            marker={"size": 14, "symbol": "star", "color": "#e4572e", "line": {"width": 1, "color": "white"}},
            text=[f"<b>{e(p['name'])}</b><br>{p['config']}" for p in marked],
            hovertemplate="%{text}<br>p50 %{x:.2f} ms · %{y:.2f} samples/s<extra></extra>"))
    notes = [{"x": p["p50"], "y": p["throughput"], "text": e(p["name"]), "showarrow": True, "arrowhead": 0,
              "arrowcolor": "#888", "ax": 0, "ay": -34, "bgcolor": "rgba(255,255,255,0.85)", "font": {"size": 12}}
             for p in marked]
    logs = {}
    for axis, key, unit in (("x", "p50", "latency p50 (ms"), ("y", "throughput", "throughput (samples/s")):
        values = [p[key] for p in points if p[key] > 0]
        wide = bool(values) and max(values) / min(values) > 20  # 20× apart: a log axis spreads the crowd
        logs[f"{axis}axis"] = {"type": "log" if wide else "linear", "title": {"text": unit + (", log)" if wide
                                                                                               else ")")}}
        for note in notes:  # plotly places annotations on a log axis by the log of the value
            note[axis] = math.log10(note[axis]) if wide else note[axis]
    _layout(figure, 480, annotations=notes, **logs)
    return figure


def trials_figure(doc: TuneDocument):
    import plotly.graph_objects as go

    objective = doc.objective
    trials = [(t, t.finished) for t in doc.trials if t.finished]
    if not any(t.figure(stage, objective.metric) is not None for t, _ in trials for stage in ("screen", "full")):
        return None  # nothing measured to draw (every trial failed)
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
    _layout(figure, 400, xaxis_title="time since the tune began (s)",
            yaxis_title=f"{objective.name} ({objective.unit})")
    return figure


def importance_figure(doc: TuneDocument):
    import plotly.graph_objects as go

    values = doc.importances
    if not values:
        return None
    names = list(values)[::-1]
    shown = [e(n).replace(".", ".<br>", 1) for n in names]  # backend.option on two lines: room on a phone
    figure = go.Figure(go.Bar(x=[values[n] for n in names], y=shown, orientation="h", hovertext=[e(n) for n in names],
                              hovertemplate="%{hovertext}: %{x:.3f}<extra></extra>"))
    figure.update_layout(xaxis_title="importance<br>(share of variance, fANOVA)",
                         height=170 + 34 * len(names), margin={"t": 20, "r": 20}, yaxis={"automargin": True},
                         font={"size": 12})
    return figure


DECLUTTER_JS = """
function corescaleDeclutter(gd) {
  var OFFSETS = [[0, -34], [0, 34], [70, -26], [-70, -26], [70, 26], [-70, 26], [0, -66], [0, 66], [110, 0],
                 [-110, 0], [120, -52], [-120, -52], [120, 52], [-120, 52], [0, -100], [0, 100], [160, -90],
                 [-160, -90], [160, 90], [-160, 90]];
  var measure = document.createElement("canvas").getContext("2d");
  function meets(a, b) { return a[0] < b[2] && b[0] < a[2] && a[1] < b[3] && b[1] < a[3]; }
  function place() {
    var full = gd._fullLayout, notes = gd.layout.annotations || [];
    if (!full || gd._corescaleWidth === full.width) { return; }
    if (!notes.length) { gd.setAttribute("data-labels-placed", full.width); return; }
    gd._corescaleWidth = full.width;
    var size = full._size, xa = full.xaxis, ya = full.yaxis, update = {};
    var area = [size.l, size.t, size.l + size.w, size.t + size.h];
    var points = notes.map(function (n) {
      return [size.l + xa.l2p(xa.type === "log" ? n.x : xa.d2l(n.x)),
              size.t + ya.l2p(ya.type === "log" ? n.y : ya.d2l(n.y))];
    });
    var taken = [];  // every plotted marker, then each label placed
    gd.data.forEach(function (trace) {
      if (String(trace.mode).indexOf("markers") < 0) { return; }
      (trace.x || []).forEach(function (x, k) {
        var px = size.l + xa.l2p(xa.d2l(x)), py = size.t + ya.l2p(ya.d2l(trace.y[k]));
        taken.push([px - 6, py - 6, px + 6, py + 6]);
      });
    });
    notes.forEach(function (note, i) {
      var font = full.annotations[i].font;
      measure.font = font.size + "px " + font.family;
      var lines = String(note.text).split("<br>");
      var w = Math.max.apply(null, lines.map(function (l) { return measure.measureText(l).width; })) + 12;
      var h = font.size * 1.4 * lines.length + 8;
      var found = OFFSETS.find(function (o) {
        var x = points[i][0] + o[0], y = points[i][1] + o[1];
        var box = [x - w / 2, y - h / 2, x + w / 2, y + h / 2];
        return box[0] >= area[0] && box[1] >= area[1] && box[2] <= area[2] && box[3] <= area[3] &&
          !taken.some(function (t) { return meets(box, t); });
      });
      update["annotations[" + i + "].visible"] = !!found;
      if (found) {
        update["annotations[" + i + "].ax"] = found[0];
        update["annotations[" + i + "].ay"] = found[1];
        var x = points[i][0] + found[0], y = points[i][1] + found[1];
        taken.push([x - w / 2, y - h / 2, x + w / 2, y + h / 2]);
      }
    });
    Plotly.relayout(gd, update).then(function () { gd.setAttribute("data-labels-placed", full.width); });
  }
  gd.on("plotly_afterplot", place);
  place();
}
"""


def _div(figure, div_id: str) -> str:
    return figure.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOT_CONFIG,
                          default_width="100%", post_script="corescaleDeclutter(document.getElementById('{plot_id}'))")


def _chart(div_id: str, title: str, figure, caption: str) -> str:
    return f'<h3>{e(title)}</h3>{_div(figure, div_id)}<p class="caption">{e(caption)}</p>'


def _fmt(block: Figure, digits=2) -> str:
    """'48.90 (45.10 – 52.70)' where the interval is usable, else '48.90 (repeats 41.20, 56.60)'; '48.90': one."""
    spread = block.interval_text(digits)
    return block.text(digits) if spread == "-" else f"{block.text(digits)} ({spread})"


def recommendation_html(doc: TuneDocument) -> str:
    headers = ("role", "configuration", "samples/s (95 % CI or repeats)", "p50 ms", "p99 ms", "US$ per 1M",
               "US$ per 1M tokens", "drift", "memory GB", "meets")
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


def coverage_html(doc: TuneDocument) -> str:
    """How good the answer is: coverage, the best seen per backend and precision, what a longer budget could gain."""
    found = doc.coverage
    assert found is not None, "called for a tune document with a coverage"
    rows = "".join(f"<tr><td>{e(b.backend)}</td><td>{e(b.precision)}</td><td>{b.measured} of {b.in_space}</td>"
                   f"<td>{b.withheld}</td><td>{'-' if b.best is None else f'{b.best:.4g}'}</td>"
                   f"<td>{e(b.label or '')}</td></tr>" for b in found.branches)
    return (f"<h3>How good is the answer</h3><p>{e(found.lines(doc.objective.unit)[0])}</p>"
            f"<table><tr><th>backend</th><th>precision</th><th>measured</th><th>withheld (quality)</th>"
            f"<th>best seen ({e(doc.objective.unit)})</th><th>configuration</th></tr>{rows}</table>"
            f"<p>{e(found.lines(doc.objective.unit)[-1])}.</p>")


def sections(doc: TuneDocument, root, frame, cpu: str, missing: list[tuple[str, str]]
             ) -> list[tuple[str, str, str]]:
    """(id, title, html) of a tune's sections: the answer, how the tuner searched, the recipe; a chart without
    data is added to `missing` as (view, the command that measures it)."""
    import plotly.offline

    on = f"Measured on {cpu}."
    points = _measurements(frame)
    answer = [f"<script>{plotly.offline.get_plotlyjs()}</script><script>{DECLUTTER_JS}</script>",
              recommendation_html(doc)]
    if doc.recipe:
        bundle = shlex.quote(str(doc.recipe.get("bundle")))
        serve = (f'Serve it: <code>corescale serve {e(bundle)}</code> (the measured artifacts, '
                 'layout and head as an HTTP service). ' if doc.recipe.get("bundle") else "")
        answer.append(f'<p>{serve}Reproduce it: <code>bash {e(shlex.quote(str(doc.recipe.get(RECIPE))))}</code> (the '
                      f'<a href="#recipe">recipe</a> below).</p>')
    if points:
        answer.append(_chart("tune-pareto", "Latency–throughput Pareto front", pareto_figure(points, highlights(
            points, doc)), "Every measurement of the tune (hollow: screening windows); stars: the recommendation "
            "and the out-of-box baseline (means over their repeats) and the best measurement of each other "
            f"backend, labelled where the label covers nothing else. Hover a point for its configuration. {on}"))
    summary = (f"<p>objective <b>{e(doc.objective.name)}</b> · {e(str(doc.space_size))} configurations in the "
               f"space · {len(doc.trials)} Optuna trials · screening {doc.screen_s:g} s, full "
               f"{doc.duration_s:g} s windows · final repeats {e(str(doc.settings.get('repeats')))} · elapsed "
               f"{(doc.elapsed_s or 0) / 60:.1f} min</p>")
    searched = [summary] + ([f"<p>Search: {e(doc.search_end)}.</p>"] if doc.search_end else [])
    if doc.search_bounds is not None:
        searched.append(f"<p>{e(doc.search_bounds.line().capitalize())}.</p>")
    if doc.spent is not None:
        searched.append(f"<p>{e(doc.spent.line().capitalize())}.</p>")
    if doc.coverage is not None:
        searched.append(coverage_html(doc))
    trials, importance = trials_figure(doc), importance_figure(doc)
    longer = f"corescale tune model={model_word(frame)} trials={max(10, 2 * len(doc.trials))}"
    if trials is not None:
        searched.append(_chart("tune-trials", "Trials over time", trials, "Each trial's objective in its screening "
                               f"and full windows, and the best so far. {on}"))
    else:
        missing.append(("trials over time (every trial failed)", longer))
    if importance is not None:
        searched.append(_chart("tune-importance", "Parameter importances", importance, "How much of the "
                               f"objective's variance each parameter explains (optuna, fANOVA). {on}"))
    else:
        missing.append(("parameter importances (two finished trials at least)", longer))
    return [("answer", "The answer: the recommended configuration", "".join(answer)),
            ("tuner", "How the tuner searched", "".join(searched)),
            ("recipe", "Deployment recipe", recipe_html(doc, root))]
