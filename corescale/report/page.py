"""The report page's pieces: its style (readable from a phone's width to a wide screen: nothing wider than the
window, wide tables scroll inside their own box), the sortable tables, the figures with their captions, the
environment table and the page around the sections. No external URL appears anywhere in the page."""

from __future__ import annotations

import base64
import html
import time

import pandas as pd

from corescale.analysis.store import describe_value, ok_rows
from corescale.errors import UserError
from corescale.record.files import read_result
from corescale.record.sections import HostEnvironment

e = html.escape

CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
header{background:#1d3557;color:#fff;padding:18px 32px}header h1{margin:0 0 4px;font-size:22px}
header p{margin:2px 0;opacity:.85;overflow-wrap:anywhere}nav{padding:8px 32px;background:#e9edf2;font-size:14px}
nav a{margin-right:14px;color:#1d3557;display:inline-block}main{padding:8px 32px 40px;max-width:1400px}
section{background:#fff;border-radius:6px;padding:14px 20px;margin:16px 0;box-shadow:0 1px 2px rgba(0,0,0,.08)}
h2{font-size:18px;margin:4px 0 10px}h3{font-size:15px;margin:14px 0 6px}figure{margin:0}
figure img{max-width:min(100%,1100px);height:auto;display:block}.frame{overflow-x:auto;max-width:100%}
figcaption,.caption{color:#555;font-size:13px;margin:6px 0 4px}.note{color:#7a5b00;background:#fff6d6;
padding:8px 12px;border-radius:4px;font-size:14px}table{border-collapse:collapse;font-size:13px;margin:6px 0}
tr.withheld td{background:#fde8e8}
th,td{border-bottom:1px solid #e3e6ea;padding:4px 8px;text-align:right;white-space:nowrap}
th{background:#f0f2f5;cursor:pointer;position:sticky;top:0}th[data-order=asc]::after{content:" \\25B2"}
th[data-order=desc]::after{content:" \\25BC"}td.text,th.text{text-align:left}.scroll{overflow:auto;max-height:640px;
max-width:100%}td.wrap{white-space:normal;overflow-wrap:anywhere;min-width:12em}
.bad{color:#b00020}.warn{color:#9a6700}code{background:#f0f2f5;padding:1px 4px;border-radius:3px;
overflow-wrap:anywhere}pre{overflow:auto;max-width:100%;background:#f6f8fa;padding:8px;font-size:12px}
li{overflow-wrap:anywhere}.plot{width:100%}
@media (max-width:700px){header,nav{padding-left:12px;padding-right:12px}main{padding:4px 6px 24px}
section{padding:10px 10px;margin:10px 0}header h1{font-size:19px}figure .frame img{width:700px;max-width:none}}
"""

SORT_JS = """
(function () {
  function cellValue(row, index) {
    var cell = row.cells[index];
    return cell.hasAttribute("data-value") ? cell.getAttribute("data-value") : cell.textContent;
  }
  document.querySelectorAll("table.sortable th").forEach(function (th) {
    th.addEventListener("click", function () {
      var table = th.closest("table");
      var body = table.tBodies[0];
      var index = Array.prototype.indexOf.call(th.parentNode.children, th);
      var ascending = th.getAttribute("data-order") !== "asc";
      th.parentNode.querySelectorAll("th").forEach(function (h) { h.removeAttribute("data-order"); });
      th.setAttribute("data-order", ascending ? "asc" : "desc");
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = cellValue(a, index), y = cellValue(b, index);
        var nx = parseFloat(x), ny = parseFloat(y);
        var order = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
        return ascending ? order : -order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
})();
"""


def html_table(frame: pd.DataFrame, columns: list[tuple[str, str, str]], table_id: str) -> str:
    """A sortable table in a box of its own that scrolls; columns: (column, header, format) with format '' for
    text."""
    head = "".join(f'<th class="{"text" if not fmt else ""}">{e(header)}</th>' for _, header, fmt in columns)
    body = []
    for _, row in frame.iterrows():
        cells = []
        for column, _, fmt in columns:
            value = row.get(column)
            missing = value is None or (pd.api.types.is_scalar(value) and pd.isna(value))
            if fmt and not missing:
                try:
                    cells.append(f'<td data-value="{float(value)!r}">{e(fmt.format(value))}</td>')
                    continue
                except (TypeError, ValueError):
                    pass
            cells.append(f'<td class="text">{e(describe_value(value))}</td>')
        body.append(f"<tr>{''.join(cells)}</tr>")
    return (f'<div class="scroll"><table class="sortable" id="{e(table_id)}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>")


def figure_html(chart_id: str, title: str, caption: str, png: bytes, file_name: str) -> str:
    """An embedded PNG with its caption (which names the CPU) and the file it was also saved as."""
    data = base64.b64encode(png).decode("ascii")
    return (f'<figure class="chart" id="chart-{e(chart_id)}"><div class="frame"><img alt="{e(title)}" '
            f'src="data:image/png;base64,{data}"></div><figcaption>{e(caption)} '
            f"(also saved as <code>{e(file_name)}</code>)</figcaption></figure>")


def environment_html(frame: pd.DataFrame) -> str:
    """The machine of the latest result, and a warning when results come from several machines."""
    latest = frame.sort_values("finished_at").iloc[-1]
    try:
        env = read_result(latest["path"]).environment
    except UserError:
        env = HostEnvironment()
    cpu, topo = env.cpu, env.topology
    memory = env.memory_bytes
    facts = [
        ("host", env.hostname), ("CPU", f"{cpu.model or '?'} ({cpu.vendor or '?'})"),
        ("ISA", " ".join(k for k, v in cpu.isa.items() if v) or "-"),
        ("topology", topo.summary), ("allowed CPUs", topo.allowed_cpus),
        ("cgroup CPU quota", env.cgroup_cpu_quota or "none"),
        ("memory", f"{memory / 2**30:.1f} GiB" if memory else "-"), ("kernel", env.kernel),
        ("governor / THP", f"{env.governor or 'unreadable'} / {env.transparent_hugepages or '?'}"),
        ("python", env.python),
        ("libraries", ", ".join(f"{k} {v}" for k, v in env.libraries.items())),
        ("environment variables", " ".join(f"{k}={v}" for k, v in env.env.items()) or "-"),
        ("corescale", f"{env.corescale.get('version')} ({env.corescale.get('commit') or 'no git'})"),
        ("captured", env.captured_at),
    ]
    rows = "".join(f'<tr><th class="text">{e(k)}</th><td class="text wrap">{e(str(v))}</td></tr>' for k, v in facts)
    hosts = frame[["host", "cpu_model"]].drop_duplicates()
    warning = ""
    if len(hosts) > 1:
        listed = "; ".join(f"{h} ({c})" for h, c in hosts.itertuples(index=False))
        warning = f'<p class="note">These results come from {len(hosts)} machines: {e(listed)}.</p>'
    return f'{warning}<div class="scroll"><table id="environment-table">{rows}</table></div>'


def render(root, frame: pd.DataFrame, sections: list[tuple[str, str, str]]) -> str:
    """The whole page: a header, a link to each section, the sections in the order given, the sorting script."""
    ok = len(ok_rows(frame))
    nav = "".join(f'<a href="#{e(sid)}">{e(title)}</a>' for sid, title, _ in sections)
    body = "".join(f'<section id="{e(sid)}"><h2>{e(title)}</h2>{content}</section>' for sid, title, content in sections)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>corescale report: {e(str(root))}</title><style>{CSS}</style></head><body>"
            f"<header><h1>corescale report</h1><p>{e(str(root))} · {len(frame)} result(s), {ok} valid · "
            f"generated {e(stamp)}</p></header><nav>{nav}</nav><main>{body}</main>"
            f"<script>{SORT_JS}</script></body></html>")
