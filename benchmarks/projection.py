"""How honest is the cost projection? Project this machine from one instance, then measure it whole.

    python benchmarks/projection.py [--model bert-base] [--backend onnxruntime] [--precision fp32]
                                    [--sizes 1,2,4] [--duration 5] [--repeats 1]

For each size c (cores per instance, powers of two up to the machine by default) it measures ONE instance on c
cores (the "small machine"), projects the machine's full layout (cores ÷ c instances of c cores) the way
`corescale cost` projects a catalog kind (analysis/projection.py: copies on the physical cores, capped by the
memory bandwidth; the machine described as a catalog row would describe it, its bandwidth the triad measured on
all its cores), measures that full layout, and prints projection ÷ measurement per layout. Above 1 the projection
promised more than the machine delivered (copies slow each other down: shared caches, memory, clocks). Written
for large machines (run it wherever more cores are at hand); runs on 2 cores too. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def machine_here():
    """This machine as a catalog row: its physical cores, SMT, ISA and its whole-machine triad bandwidth."""
    from corescale.analysis.catalog import Machine, arch_of, catalog_isa
    from corescale.machine.bandwidth import triad
    from corescale.machine.environment import cpuinfo
    from corescale.machine.topology import Topology

    topology = Topology.from_sysfs()
    cores, logical = len(topology.physical_cores), len(topology.cpu_ids)
    cpu = cpuinfo()
    isa = catalog_isa(cpu.isa)
    bandwidth = triad(cores)["gbps"]
    return Machine("this machine", 1.0, logical, cores, cpu_model=cpu.model, smt=max(logical // cores, 1),
                   isa=isa, arch=arch_of(isa), bandwidth_gbps=bandwidth, bandwidth_basis="triad, all cores",
                   date="measured", source="this run")


def setups(sizes: list[int], cores: int, base: list[str]) -> tuple[dict[str, list[str]], dict[int, tuple]]:
    """{name: overrides} to measure, and per size c: (the single instance's name, the full layout's name)."""
    runs, names = {}, {}
    for c in sizes:
        single, full = f"1 x {c} cores", f"{cores // c} x {c} cores"
        runs[single] = [*base, "instances=1", f"cores_per_instance={c}"]
        runs[full] = [*base, f"instances={cores // c}", f"cores_per_instance={c}"]
        names[c] = (single, full)
    return runs, names


def rows(records: dict[str, list], names: dict[int, tuple], machine) -> list[dict]:
    """Per layout: the single instance's rate, the projection (low – high), the measured rate, their ratio."""
    from corescale.analysis.projection import measured_of, project
    from corescale.analysis.store import flatten

    out = []
    for single, full in names.values():
        rate = [flatten(r, Path(".")) for r in records[single] if r.ok]
        whole = [r.metrics.throughput_samples_per_s for r in records[full] if r.ok and r.metrics]
        if not rate or not whole:
            out.append({"layout": full, "missing": True})
            continue
        per = [measured_of(row) for row in rate]
        median = sorted(per, key=lambda m: m.per_instance)[len(per) // 2]
        found = project(median, machine)
        measured = sorted(whole)[len(whole) // 2]
        flags = [f for f in found.flags if "SMT" not in f] + (["the same run: nothing projected"]
                                                               if single == full else [])
        contaminated = sum(bool(r.metrics and r.metrics.contaminated) for r in [*records[single], *records[full]])
        out.append({"layout": full, "single": median.per_instance, "low": found.low, "high": found.high,
                    "measured": measured, "ratio": found.high / measured if measured else float("nan"),
                    "flags": "; ".join(flags) or "-", "contaminated": contaminated, "missing": False})
    return out


def markdown(table: list[dict], machine, title: str) -> str:
    lines = [f"**{title}**", "", f"{machine.cpu_model}, {machine.physical_cores} physical cores, triad "
             f"{machine.bandwidth_gbps:.1f} GB/s on all of them", "",
             "| layout | 1 instance (samples/s) | projected (samples/s) | measured (samples/s) "
             "| projection ÷ measurement | runs contaminated | flags |", "|---|---:|---:|---:|---:|---:|---|"]
    for row in table:
        if row["missing"]:
            lines.append(f"| {row['layout']} | failed | | | | | |")
            continue
        projected = f"{row['high']:.2f}" if abs(row["high"] - row["low"]) < 1e-9 else \
            f"{row['low']:.2f} – {row['high']:.2f}"
        lines.append(f"| {row['layout']} | {row['single']:.2f} | {projected} | {row['measured']:.2f} "
                     f"| **{row['ratio']:.2f}** | {row['contaminated']} | {row['flags']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert-base")
    parser.add_argument("--backend", default="onnxruntime")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--sizes", help="cores per instance, comma-separated (default: powers of two)")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--output", help="results root (default: a temporary directory)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tempfile

    from _loop import measure

    machine = machine_here()
    cores = machine.physical_cores
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else \
        [2 ** k for k in range(cores.bit_length()) if 2 ** k <= cores]
    if any(s < 1 or s > cores for s in sizes):
        raise SystemExit(f"--sizes must be between 1 and this machine's {cores} physical cores")
    with tempfile.TemporaryDirectory(prefix="corescale-projection-") as scratch:
        base = [f"model={args.model}", f"backend={args.backend}", f"precision={args.precision}", "batch_size=1",
                f"duration={args.duration:g}", f"output_dir={args.output or scratch}"]
        runs, names = setups(sizes, cores, base)
        records = measure(runs, args.repeats)
    title = f"projection ÷ measurement: {args.model} {args.backend} {args.precision}, batch 1 (median of " \
            f"{args.repeats} repeat(s))"
    print(markdown(rows(records, names, machine), machine, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
