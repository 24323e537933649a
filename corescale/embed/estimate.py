"""Before a corpus job starts: how long it should take and what it should cost, here and on the catalog's kinds;
at its end, the measured figures beside it (job.py puts both in the manifest).

The rate is the bundle's measured one (its record: an offline trial's texts/s, or a service's max QPS under its
SLO, which the job's full queues should reach or pass), scaled to the corpus by real tokens per text (the
measured workload's ÷ the corpus sample's: a call's time grows about linearly with its tokens at these
lengths), copied onto other kinds of the same architecture as `corescale cost --machine` copies a layout
(analysis/projection.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SHOWN_KINDS = 3  # the cheapest catalog kinds shown beside this machine


@dataclass
class Estimate:
    rows: int  # the corpus's rows (exact or estimated)
    rows_exact: bool
    texts_per_s: float | None  # here, scaled to the corpus
    basis: str  # where the rate comes from
    price_per_hour: float | None = None
    price_source: str = ""
    kinds: list[dict[str, Any]] = field(default_factory=list)  # {kind, texts_per_s_low, _high, hours, usd}

    @property
    def seconds(self) -> float | None:
        return self.rows / self.texts_per_s if self.texts_per_s else None

    def lines(self) -> list[str]:
        count = f"{self.rows:,}" if self.rows_exact else f"≈ {self.rows:,} (lines counted)"
        if self.seconds is None:
            return [f"{count} rows; no measured rate in the bundle to estimate from"]
        cost = (f", ≈ US${self.price_per_hour * self.seconds / 3600:.3g} ({self.price_source})"
                if self.price_per_hour else "")
        found = [f"{count} rows: ≈ {duration(self.seconds)} here at ≈ {self.texts_per_s:,.0f} texts/s{cost}; "
                 f"{self.basis}"]
        for kind in self.kinds:
            found.append(f"  on {kind['kind']}: {kind['texts_per_s_low']:,.0f}–{kind['texts_per_s_high']:,.0f} "
                         f"texts/s, {duration(kind['seconds_low'])}–{duration(kind['seconds_high'])}, "
                         f"US${kind['usd_low']:.3g}–{kind['usd_high']:.3g} (projected)")
        return found

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "rows_exact": self.rows_exact, "texts_per_s": self.texts_per_s,
                "seconds": self.seconds, "basis": self.basis, "price_per_hour": self.price_per_hour,
                "price_source": self.price_source, "kinds": self.kinds}


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def rows_of(corpus) -> tuple[int, bool]:
    """The corpus's rows: exact from Parquet's metadata; JSON Lines' and CSV's counted as their lines (a CSV
    text that holds a line break makes it an estimate)."""
    if corpus.rows is not None:
        return corpus.rows, True
    total, exact = 0, True
    for source in corpus.files:
        if source.kind == "parquet":
            import pyarrow.parquet as pq

            total += pq.ParquetFile(source.path).metadata.num_rows
            continue
        with open(source.path, "rb") as file:  # JSON Lines: blank lines are no rows; CSV: less its header
            lines = sum(1 for line in file if line.strip())
        total += max(lines - (1 if source.kind == "csv" else 0), 0)
        exact = exact and source.kind != "csv"
    return total, exact


def estimate(record, corpus, sample_tokens: list[int], catalog_path: str | None = None) -> Estimate:
    """From the bundle's record and a sample of the corpus (each text's real tokens)."""
    from corescale.analysis.catalog import load_catalog
    from corescale.analysis.pricing import price_here
    from corescale.analysis.projection import measured_of, project
    from corescale.analysis.store import flatten

    rows, exact = rows_of(corpus)
    row = flatten(record, Path("."))
    rate, basis = measured_rate(record)
    if rate is None:
        return Estimate(rows, exact, None, basis)
    measured_tokens = (row.get("throughput_tokens_per_s") or 0) / (row.get("throughput_samples_per_s") or 1)
    corpus_tokens = sum(sample_tokens) / len(sample_tokens) if sample_tokens else 0
    scale = measured_tokens / corpus_tokens if measured_tokens and corpus_tokens else 1.0
    if measured_tokens and corpus_tokens:
        basis += (f", scaled by real tokens per text ({measured_tokens:.1f} measured ÷ {corpus_tokens:.1f} in the "
                  f"corpus's first {len(sample_tokens):,} texts)")
    found = Estimate(rows, exact, rate * scale, basis)
    try:
        catalog = load_catalog(catalog_path)
    except Exception:  # noqa: BLE001 - no catalog: no cost, the time still holds
        return found
    price = price_here(row, catalog)
    found.price_per_hour, found.price_source = price.per_hour, price.source
    layout = measured_of(row)
    per_instance = rate / max(layout.instances, 1)
    layout = type(layout)(**{**vars(layout), "per_instance": per_instance})
    projected: list[dict[str, Any]] = []
    for kind in catalog.values():
        if kind.name.startswith("study-") or kind.arch != layout.arch:  # another architecture: not projected
            continue
        on = project(layout, kind)
        if on.basis != "projected" or on.low <= 0:
            continue
        low, high = on.low * scale, on.high * scale
        projected.append({"kind": kind.name, "texts_per_s_low": low, "texts_per_s_high": high,
                          "seconds_low": rows / high, "seconds_high": rows / low,
                          "usd_low": kind.price_per_hour * rows / high / 3600,
                          "usd_high": kind.price_per_hour * rows / low / 3600, "flags": on.flags})
    found.kinds = sorted(projected, key=lambda k: float(k["usd_high"]))[:SHOWN_KINDS]
    return found


def measured_rate(record) -> tuple[float | None, str]:
    """(texts/s, where it comes from) of the bundle's measured trial."""
    server = record.server
    if server is not None and server.max_valid_qps:
        return float(server.max_valid_qps), (f"the bundle's max {server.max_valid_qps:.1f} QPS at p99 <= "
                                             f"{server.slo_p99_ms:g} ms (a loaded service's floor: a corpus job "
                                             "keeps every instance's queue full)")
    metrics = record.metrics
    if metrics is not None and metrics.throughput_samples_per_s:
        return float(metrics.throughput_samples_per_s), (f"the bundle's measured "
                                                        f"{metrics.throughput_samples_per_s:.1f} texts/s")
    return None, "the bundle records no throughput"
