"""`corescale info`: this machine, as the tool sees it; `--peak` measures its GEMM peak with every library."""

from __future__ import annotations

import json

from corescale.commands import add_common
from corescale.commands._common import on_lock_wait, path_arg

ORDER = 20


def register(sub) -> None:
    parser = sub.add_parser("info", help="this machine, as corescale sees it (--peak: its real GEMM peak)")
    add_common(parser)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--peak", action="store_true",
                        help="measure the GEMM peak again with every library, side by side (1 core and all cores; "
                             "fp32, and bf16/int8 where the ISA has them); the result is cached for runs")
    parser.add_argument("--libraries", metavar="LIST", help="with --peak: only these, e.g. torch_mm,numpy")
    parser.add_argument("--precisions", metavar="LIST", help="with --peak: only these of the ISA's precisions, "
                                                              "e.g. fp32 (default: every one it computes in)")
    parser.add_argument("--cache-dir", type=path_arg, default=None,
                        help="where peaks are cached (default: the config's cache_dir)")
    parser.set_defaults(handler=handle)


def measure_peaks(args, isa: dict[str, bool]) -> list[dict]:
    """One row per (CPUs, threads, precision): every library's GFLOP/s and the winner, cached like a run's; under
    the machine lock (another process's trial or measurement first)."""
    from pathlib import Path

    from corescale.config import BenchmarkConfig
    from corescale.machine.lock import machine_lock
    from corescale.machine.peak import PeakCache, check_libraries, peak_precision
    from corescale.machine.placement import InstancePlacement, InstanceSpec
    from corescale.machine.precisions import PRECISIONS
    from corescale.machine.scratch import scratch
    from corescale.machine.topology import Topology
    from corescale.measure.calibrate import with_peaks

    libraries = check_libraries([n.strip() for n in args.libraries.split(",") if n.strip()]) if args.libraries \
        else ()
    cfg = BenchmarkConfig() if args.cache_dir is None else BenchmarkConfig(cache_dir=args.cache_dir)
    cpus = tuple(Topology.from_sysfs().cpu_ids)
    layouts = {(cpus[0],): 1, cpus: len(cpus)}
    specs = [InstanceSpec(InstancePlacement(i, c, (), len(c)), n, 1) for i, (c, n) in enumerate(layouts.items())]
    computed = [p for p in PRECISIONS if peak_precision(p, isa) == p]
    precisions = peak_precisions(args.precisions, computed)
    rows = []
    with machine_lock(on_wait=on_lock_wait), scratch("peak") as work:
        for precision in precisions:
            for spec in specs:  # one at a time: the whole-machine row must not share its cores
                (done,) = with_peaks([spec], cfg, isa, Path(work), PeakCache(cfg.cache_dir),
                                     force=True, libraries=libraries, precision=precision)
                rows.append({"cpus": list(spec.cpus), "threads": spec.threads, **(done.peak or {})})
    return rows


def peak_precisions(asked: str | None, computed: list[str]) -> list[str]:
    """--precisions as given (each one this CPU computes in), or every one it does."""
    from corescale.errors import UserError

    if asked is None:
        return computed
    names = [n.strip() for n in asked.split(",") if n.strip()]
    wrong = [n for n in names if n not in computed]
    if wrong or not names:
        raise UserError(f"--precisions {asked!r}: this CPU's GEMM peaks are measured in {', '.join(computed)}; "
                        "give some of those, comma-separated")
    return list(dict.fromkeys(names))


def handle(args) -> int:
    from corescale.machine import environment
    from corescale.machine.peak import analytic_gflops
    from corescale.machine.topology import Topology
    from corescale.report.console import console, errors, print_wide
    from corescale.report.tables import host_table, peak_table

    host = environment.capture()
    for given, flag in ((args.libraries, "--libraries"), (args.precisions, "--precisions")):
        if given and not args.peak:
            from corescale.errors import UserError

            raise UserError(f"{flag} needs --peak")
    peaks: list[dict] = []
    if args.peak:
        from corescale.trials.local import interruptible

        with interruptible():  # SIGTERM/SIGHUP stop it like Ctrl-C: its processes and temp directory go
            peaks = measure_peaks(args, host.cpu.isa)
    analytic = analytic_gflops(host.cpu, len(Topology.from_sysfs().physical_cores))
    if args.json:
        shown = {**host.to_dict(), **({"peak": peaks} if args.peak else {}), "analytic_peak": analytic}
        print(json.dumps(shown, indent=2, default=str))
        return 0
    console.print(host_table(host, analytic))
    if args.peak:
        print_wide(peak_table(peaks))
        from corescale.measure.calibrate import disturbed

        for row in peaks:
            for name, why in row.get("errors", {}).items():
                errors.print(f"{name} ({row['precision']}, {row['threads']} threads) not measured: {why}",
                             soft_wrap=True, markup=False)
            if disturbed(row):
                errors.print(f"peak ({row['precision']}, {row['threads']} threads) not cached: {disturbed(row)}",
                             soft_wrap=True, markup=False)
    return 0
