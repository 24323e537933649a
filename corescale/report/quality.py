"""The report's quality section: every result that judged its task's quality (the store's quality_* columns), one
row per configuration with its task, each metric, the gate and the verdict; withheld configurations marked."""

from __future__ import annotations

from html import escape as e

import pandas as pd

from corescale.analysis.cost import layout_label
from corescale.analysis.store import QUALITY_SUMMARY, describe_value
from corescale.report.counts import count_text


def quality_rows(frame: pd.DataFrame) -> pd.DataFrame:
    if "quality_task" not in frame.columns:
        return frame.iloc[0:0]
    return frame[frame["quality_task"].notna()].reset_index(drop=True)


def metric_columns(rows: pd.DataFrame) -> list[str]:
    """The metrics some row measured, in table order."""
    skipped = {*QUALITY_SUMMARY, "quality_gate", "quality_reference"}
    return [c for c in rows.columns if c.startswith("quality_") and c not in skipped and rows[c].notna().any()]


def section(frame: pd.DataFrame) -> tuple[str, str, str] | None:
    """(id, title, html) of the quality section; None when no result has a quality check."""
    rows = quality_rows(frame)
    if rows.empty:
        return None
    metrics = metric_columns(rows)
    head = "".join(f"<th>{e(h)}</th>" for h in ("configuration", "task", *(m.removeprefix("quality_") for m in
                                                                           metrics), "gate", "verdict"))
    body = []
    for _, row in rows.iterrows():
        withheld = row["quality_verdict"] == "withheld"
        verdict = "withheld (quality)" if withheld else describe_value(row["quality_verdict"])
        label = f"{row['model']} · {row['precision']} · {layout_label(row)}"
        cells = [f'<td class="text">{e(label)}</td>', f'<td class="text">{e(str(row["quality_task"]))}</td>',
                 *(f"<td>{e(_number(m, row[m]))}</td>" for m in metrics),
                 f'<td class="text">{e(describe_value(row["quality_gate"]))}</td>',
                 f'<td class="text verdict">{"<b>" if withheld else ""}{e(verdict)}{"</b>" if withheld else ""}</td>']
        body.append(f'<tr class="{"withheld" if withheld else "passed"}">{"".join(cells)}</tr>')
    references = sorted({str(r) for r in rows["quality_reference"].dropna()})
    note = (f'<p class="note">Each configuration\'s task outputs on real text against {e(", ".join(references))}; '
            "a withheld configuration keeps its figures and is never recommended.</p>")
    table = (f'<div class="scroll"><table class="sortable" id="quality-table"><thead><tr>{head}</tr></thead>'
             f"<tbody>{''.join(body)}</tbody></table></div>")
    withheld = int((rows["quality_verdict"] == "withheld").sum())
    title = f"Quality ({len(rows)} judged, {withheld} withheld)"
    return "quality", title, note + table


def _number(column: str, value) -> str:
    """A quality figure to 4 decimals; a count (quality_samples) as its whole number."""
    if value is None or pd.isna(value):
        return "-"
    return count_text(column, value) or f"{float(value):.4f}"
