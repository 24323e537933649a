"""`corescale info`: this machine, as the tool sees it."""

from __future__ import annotations

import json

from corescale.commands import add_common

ORDER = 20


def register(sub) -> None:
    parser = sub.add_parser("info", help="this machine, as corescale sees it")
    add_common(parser)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-calibrate", action="store_true", help="skip the SGEMM calibration")
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    from corescale.machine import environment
    from corescale.report.console import console

    host = environment.capture()
    if not args.no_calibrate:
        from corescale.machine.topology import Topology

        threads = len(Topology.from_sysfs().cpu_ids)
        host["sgemm_gflops"] = {"threads": threads, "gflops": round(environment.sgemm_gflops(threads), 1)}
    if args.json:
        print(json.dumps(host, indent=2, default=str))
        return 0
    from rich.table import Table

    table = Table(title="corescale info", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    cpu = host["cpu"]
    rows = [
        ("CPU", f"{cpu['model']} ({cpu['vendor']})"),
        ("ISA", " ".join(flag for flag, present in cpu["isa"].items() if present) or "-"),
        ("topology", host["topology"]["summary"]),
        ("allowed CPUs", host["topology"]["allowed_cpus"]),
        ("cgroup CPU quota", str(host["cgroup_cpu_quota"] or "none")),
        ("memory", f"{(host['memory_bytes'] or 0) / 2**30:.1f} GiB"),
        ("kernel", host["kernel"]),
        ("governor / THP", f"{host['governor'] or 'unreadable'} / {host['transparent_hugepages'] or 'unreadable'}"),
        ("load average", " ".join(f"{x:.2f}" for x in host["load_average"])),
        ("python", host["python"]),
        ("libraries", ", ".join(f"{k} {v}" for k, v in host["libraries"].items())),
        ("env", " ".join(f"{k}={v}" for k, v in host["env"].items()) or "-"),
        ("corescale", f"{host['corescale']['version']} ({host['corescale']['commit'] or 'no git'})"),
    ]
    if "sgemm_gflops" in host:
        rows.append(("SGEMM", f"{host['sgemm_gflops']['gflops']} GFLOP/s on {host['sgemm_gflops']['threads']} threads"))
    for row in rows:
        table.add_row(*row)
    console.print(table)
    return 0
